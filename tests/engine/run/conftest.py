"""Fixtures the run tests share: a journal on every journal adapter, and the store kinds the
store-backed run tests cover.

The journal fixtures take their adapters (``KINDS``) and sites from the journal conformance suite
(``tests.storage.test_journal_conformance``), so the run tests hold on every adapter it admits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from contextful.storage.journal import JournalStore

from tests.storage.test_journal_conformance import KINDS, JournalSite, journal_site


@pytest.fixture(params=KINDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> JournalSite:
    """Where one adapter keeps its journal: the file tree, SQLite and PostgreSQL in turn."""
    return journal_site(request.param, request, tmp_path)


@pytest.fixture
def journal(site: JournalSite) -> Iterator[JournalStore]:
    """A handle on the site's journal, closed after the test."""
    store = site.open()
    yield store
    store.close_store()


@pytest.fixture(params=["local", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores the run's store-backed tests (``_items``, sweeps) cover: the SQLite and PostgreSQL
    catalogs, without the S3 root the suite-wide ``store_kind`` adds."""
    return request.param
