"""With inputs landed by the landing process (``CONTEXTFUL_LAND_CHILDREN=0``), the next input
decodes while this one is staged (``engine.land.ahead``), and nothing else changes:
inputs land in order, a failing input fails alone and by name, and a given-up decode's child dies."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.land.ahead import DecodeAhead
from contextful.engine.land.decode import Decoder
from contextful.engine.land.sink import LandingSink
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store
from contextful.storage.errors import InputMalformed, InputNotFound

MANIFEST = """
[project]
name = "ahead"

[[pipeline]]
id = "ev"
table = "ev"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def write_inputs(raw: Path, count: int, rows: int = 50) -> list[Path]:
    raw.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(count):
        path = raw / f"in-{n:02d}.ndjson"
        path.write_text("".join(f'{{"id": {n * rows + i}, "input": {n}}}\n' for i in range(rows)))
        paths.append(path)
    return paths


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (every thread's), from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Poll ``condition`` until it holds (a reaped child has no event to wait on here)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class RecordingDecoder(Decoder):
    """A real decoder that notes when each input's decode is asked for and when its batches end."""

    def __init__(self, events: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.events = events
        self.lock = threading.Lock()

    def decode(self, path: str, *args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        name = os.path.basename(path)
        with self.lock:
            self.events.append(f"decode {name}")
        batches = super().decode(path, *args, **kwargs)

        def noted() -> Iterator[pa.RecordBatch]:
            yield from batches
            with self.lock:
                self.events.append(f"decoded {name}")

        return noted()


def test_the_next_input_decodes_while_this_one_is_staged_and_inputs_land_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTFUL_LAND_CHILDREN", "0")  # the landing process stages every batch itself
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    write_inputs(tmp_path / "raw", 4)
    events: list[str] = []
    staged: list[int] = []
    real_stage = LandingSink.stage

    def recording_stage(self: LandingSink, batch: pa.Table, pull: str = "", **kwargs: Any) -> None:
        staged.extend(batch.column("input").to_pylist())
        events.append(f"stage {os.path.basename(pull.removeprefix('input '))}")
        real_stage(self, batch, pull, **kwargs)

    monkeypatch.setattr(LandingSink, "stage", recording_stage)
    manifest = load_manifest(tmp_path)
    with RecordingDecoder(events) as decoder, Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, decoder=decoder)
        assert result.ok and len(result.inputs_landed) == 4
        assert store.table("ev").to_arrow().column("id").to_pylist() == list(range(200))
    assert staged == sorted(staged)  # input by input, in order
    for n in range(3):  # input n+1's decode was asked for before input n's rows were staged
        assert events.index(f"decode in-{n + 1:02d}.ndjson") < events.index(f"stage in-{n:02d}.ndjson"), events


def test_a_failing_input_decoded_ahead_fails_alone_by_name(tmp_path: Path, decoder: Decoder) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    paths = write_inputs(tmp_path / "raw", 5)
    with paths[2].open("a") as fh:
        fh.write("{not json\n")
    manifest = load_manifest(tmp_path)
    with Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, decoder=decoder)
        assert [f.input for f in result.failures] == [str(paths[2])]
        assert result.failures[0].error == InputMalformed.__name__
        assert sorted(store.table("ev").to_arrow().column("input").to_pylist()) == sorted(
            n for n in (0, 1, 3, 4) for _ in range(50))


def test_a_decode_given_up_ahead_kills_its_child_and_errors_wait_for_their_input(tmp_path: Path,
                                                                                  decoder: Decoder) -> None:
    [path] = write_inputs(tmp_path / "raw", 1, rows=200_000)
    ahead = DecodeAhead(lambda: decoder.decode(str(path), "ndjson"))
    ahead.close()  # given up before it was taken: no batch is read, the child goes
    ahead._thread.join(60)
    assert wait_for(lambda: not children(decoder.server_pid)), children(decoder.server_pid)
    missing = DecodeAhead(lambda: decoder.decode(str(tmp_path / "raw" / "gone.ndjson"), "ndjson"))
    with pytest.raises(InputNotFound):  # raised where the input is taken, not in the thread
        list(missing.batches())
    taken = DecodeAhead(lambda: decoder.decode(str(path), "ndjson"))
    assert sum(batch.num_rows for batch in taken.batches()) == 200_000
    assert decoder.server_pid > 0  # the server still serves after a child given up
