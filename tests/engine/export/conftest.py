"""Fixtures of the export tests: the served face of a project, shut down after the test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from contextful.engine.config.manifest import Manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.served.project import Served, serve_project
from contextful.storage import Store


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
