"""Fixtures the run tests share: a journal on every journal adapter, and the store kinds the
store-backed run tests cover.

The journal fixtures (``site`` over every adapter, ``journal`` on it) are the journal conformance
suite's own (``tests.storage.test_journal_conformance``), so the run tests hold on every adapter it
admits.
"""

from __future__ import annotations

import pytest

from tests.storage.test_journal_conformance import journal, site  # noqa: F401 - the fixtures, shared


@pytest.fixture(params=["local", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores the run's store-backed tests (``_items``, sweeps) cover: the SQLite and PostgreSQL
    catalogs, without the S3 root the suite-wide ``store_kind`` adds."""
    return request.param
