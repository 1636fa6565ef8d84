"""The publication holds port over the local profile's catalog database (``holds_sqlite``), as serve and
``contextful export group`` use it: an exclusive hold refuses new shared claims (writer-preferring)
and waits for the standing ones; claims are all or none; a holder SIGKILLed mid-hold blocks the
others only until its lease expires, and an exporter whose process is provably dead not at all (``surface.dispatch.export-quiesced``, ``export-claim``).
Oracles: a second adapter over the same file (what another process sees), and a real child process
killed with SIGKILL while it holds."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from contextful.engine.export.publications.holds import EXCLUSIVE, SHARED, exclusive_hold
from contextful.engine.export.publications.holds_sqlite import SqliteHolds
from contextful.storage.errors import ExecutionHeld

HOLD_AND_WAIT = """
import sys
from contextful.engine.export.publications.holds import holder_id
from contextful.engine.export.publications.holds_sqlite import SqliteHolds
holds = SqliteHolds(sys.argv[1])
if sys.argv[2] == "exclusive":  # as export group holds: its holder id names its process
    assert holds.hold_exclusive("bi", holder_id("export group bi"), 30.0) is not None
elif sys.argv[2] == "exclusive, unnamed process":
    assert holds.hold_exclusive("bi", "killed exporter", 1.0) is not None
else:
    assert holds.claim_shared(["bi"], "killed unit", 1.0) == ()
print("held", flush=True)
sys.stdin.read()
"""


def _holds(tmp_path: Path) -> tuple[SqliteHolds, SqliteHolds]:
    path = str(tmp_path / "catalog.sqlite")
    return SqliteHolds(path), SqliteHolds(path)


@pytest.mark.clause("surface.dispatch.export-claim")
def test_an_exclusive_hold_refuses_new_claims_all_or_none_and_sees_the_standing_ones(tmp_path: Path) -> None:
    serve, export = _holds(tmp_path)
    assert serve.claim_shared(["bi", "ops"], "unit a", 30) == ()
    hold = export.hold_exclusive("bi", "exporter", 30)
    assert hold is not None and hold.mode == EXCLUSIVE
    # the standing claim stays (the exporter waits for it); a new one is refused whole, naming the hold
    assert [(h.holder, h.mode) for h in export.shared_holders("bi")] == [("unit a", SHARED)]
    refused = serve.claim_shared(["ops", "bi"], "unit b", 30)
    assert [(h.publication, h.holder) for h in refused] == [("bi", "exporter")]
    assert [h.holder for h in export.shared_holders("ops")] == ["unit a"]  # unit b claimed not even ops
    assert serve.hold_exclusive("bi", "second exporter", 30) is None
    serve.release("unit a")
    assert export.shared_holders("bi") == ()
    renewed = export.renew("exporter", 30)
    assert [(h.publication, h.version) for h in renewed] == [("bi", hold.version + 1)]
    export.release("exporter")
    assert serve.claim_shared(["bi"], "unit b", 30) == ()


@pytest.mark.clause("surface.dispatch.export-claim")
def test_an_export_waits_for_a_shared_holder_and_gives_up_at_its_deadline_naming_it(tmp_path: Path) -> None:
    serve, export = _holds(tmp_path)
    serve.claim_shared(["bi"], "serve unit orders", 30)
    seen: list[tuple[str, ...]] = []
    with pytest.raises(ExecutionHeld, match="scope 'publication bi' is being run by holder 'serve unit orders'"), \
            exclusive_hold(export, "bi", deadline_s=1, progress=lambda standing, _s: seen.append(
                tuple(h.holder for h in standing))):
        raise AssertionError("the body runs only once no shared holder remains")
    assert seen and seen[0] == ("serve unit orders",)
    assert serve.claim_shared(["bi"], "serve unit other", 30) == ()  # the given-up hold is released

    entered = threading.Event()

    def export_once() -> None:
        with exclusive_hold(export, "bi", deadline_s=60):
            entered.set()

    waiting = threading.Thread(target=export_once)
    waiting.start()
    assert not entered.wait(0.5)  # both units still hold bi shared
    serve.release("serve unit orders")
    serve.release("serve unit other")
    waiting.join(60)
    assert entered.is_set()


@pytest.mark.clause("surface.dispatch.export-quiesced")
@pytest.mark.parametrize("mode", ["exclusive", "exclusive, unnamed process", "shared"])
def test_a_holder_sigkilled_mid_hold_blocks_the_others_only_until_its_lease_expires(tmp_path: Path,
                                                                                    mode: str) -> None:
    path = tmp_path / "catalog.sqlite"
    child = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, str(path), mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
        holds = SqliteHolds(str(path))
        if mode == "shared":  # the export's wait for the dead unit's claim ends when the claim lapses
            with exclusive_hold(holds, "bi", deadline_s=60, poll_s=0.05) as hold:
                assert hold is not None
            return
        if mode == "exclusive":  # a provably dead exporter did no work after it died: its hold holds nothing
            assert holds.claim_shared(["bi"], "serve unit orders", 30) == ()
            return
        assert holds.claim_shared(["bi"], "serve unit orders", 30) != ()  # the dead exporter's lease still runs
        gave_up = threading.Event()
        timer = threading.Timer(60, gave_up.set)
        timer.start()
        try:
            while holds.claim_shared(["bi"], "serve unit orders", 30):
                assert not gave_up.wait(0.05), "the dead exporter's hold outlived its lease"
        finally:
            timer.cancel()
    finally:
        if child.poll() is None:
            child.kill()

