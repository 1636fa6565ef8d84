"""The applied version serve arms, read around the jobs no job dispatches.

``surface.fire.kind-undispatched``: import and apply refuse a ``[[job]]`` of kind ``sweep``,
``rebuild-catalog`` or ``validate`` (``JobKindUndispatched``), so only a version written into the
snapshot directory some other way can hold one. Serve arms none of them: when refusing such jobs is
all that keeps a version from parsing, the version is armed without them and each is named among
what arms nothing, with its error and the command that does its work
(``surface.arm.unarmed-named``). Any other problem leaves the version unreadable as before
(``ControlSnapshotUnreadable``: what is armed stays armed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.control.arm import Unarmed
    from contextful.engine.control.snapshots import SnapshotDir


def load_armable(root: Path, version: int, snapshots: SnapshotDir | None = None) -> tuple[Manifest, list[Unarmed]]:
    """Version ``version``'s manifest as serve arms it, and the undispatched jobs it leaves out."""
    from contextful.engine.control.apply import load_version
    from contextful.engine.control.arm import Unarmed
    from contextful.storage.errors import ControlSnapshotUnreadable, JobKindUndispatched, ManifestInvalid

    try:
        return load_version(root, version, snapshots), []
    except ControlSnapshotUnreadable as exc:
        invalid = exc.__cause__
        if not isinstance(invalid, ManifestInvalid) or not invalid.problems or not all(
                isinstance(p, JobKindUndispatched) for p in invalid.problems):
            raise
        refused: list[JobKindUndispatched] = [p for p in invalid.problems if isinstance(p, JobKindUndispatched)]
    manifest = load_version(root, version, snapshots, without_jobs=frozenset(p.job for p in refused))
    return manifest, [Unarmed(f"job:{p.job}", f"{p.name}: {p.detail}", p) for p in refused]


def applied_armable(root: Path) -> Manifest | None:
    """The applied version's manifest as serve arms it (None: nothing is applied yet)."""
    from contextful.engine.control.apply import snapshot_dir

    snapshots = snapshot_dir(root)
    version = snapshots.applied()
    return None if version is None else load_armable(root, version, snapshots)[0]
