"""Fixtures of the job tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.jobs.delegates import Delegate, Start


@pytest.fixture
def delegate_of(tmp_path: Path) -> Iterator[Start]:
    """Start reference delegates with scripts of behaviours; each is stopped after the test."""
    started: list[Delegate] = []

    def start(script: dict[str, list[str]] | None = None) -> Delegate:
        started.append(Delegate(tmp_path / f"delegate-{len(started)}", script or {}))
        return started[-1]

    yield start
    for delegate in started:
        delegate.stop()
