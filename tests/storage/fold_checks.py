"""Shared by the fold tests: every fold of a table took whole commits; size thresholds between its parts."""

from __future__ import annotations

from contextful.storage import Store


def assert_folds_took_whole_commits(store: Store, name: str) -> int:
    """Every fold commit of ``name`` removed every part of each commit (merge position ``ord_seq``) it
    removed a part of; how many folds there were."""
    table = store.table(name)
    folds = [c.commit_seq for c in table.commits() if c.kind == "fold"]
    for seq in folds:
        before = {p.path: p for p in table.snapshot(seq - 1).parts}
        after = {p.path for p in table.snapshot(seq).parts}
        taken = {before[path].ord_seq for path in before.keys() - after}
        split = [p.path for path, p in before.items() if path in after and p.ord_seq in taken]
        assert not split, f"fold {seq} left {split} of a commit it folded in part"
    return len(folds)


def size_cut(store: Store, name: str, reach: int) -> int:
    """A size threshold between the live parts' sizes of ``name`` (or above them all), by ``reach``."""
    sizes = sorted({p.bytes for p in store.table(name).snapshot().parts}) or [1 << 20]
    cuts = [*sizes, sizes[-1] + 1]
    return cuts[reach % len(cuts)]
