"""Fixtures of the export tests: the served face of a project, shut down after the test; a coordinated
publication's project whose producers completed, made once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config.manifest import Manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.served.project import Served, serve_project
from contextful.storage import Store

from tests.engine.export.publication_project import Gate, ReceiverProcess, fired


@pytest.fixture(scope="session")
def fired_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A coordinated-publication project whose producers completed once, made once per session; tests
    copy it (``tests.engine.export.publication_project``)."""
    return fired(tmp_path_factory.mktemp("publication") / "fired").root


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[ReceiverProcess]:
    """A coordinated publication's receiver process over its own SQLite file."""
    started = ReceiverProcess(tmp_path / "receiver.sqlite")
    yield started
    started.stop()


@pytest.fixture
def gate(receiver: ReceiverProcess) -> Iterator[Gate]:
    """A forwarder in front of ``receiver`` (``publication_project.Gate``)."""
    found = Gate(receiver.events_url)
    yield found
    found.close()


@pytest.fixture
def serve(decoder: Decoder) -> Iterator[Any]:
    started: list[Served] = []

    def start(manifest: Manifest) -> Served:
        served = serve_project(manifest, lambda: Store.open(manifest.project.store), "127.0.0.1:0",
                               decoder=decoder, queue_root=manifest.root / ".contextful" / "queue")
        started.append(served)
        return served

    yield start
    for served in started:
        served.shutdown(grace_s=10)
