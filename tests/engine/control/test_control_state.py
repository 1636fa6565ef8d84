"""The served control plane's state in the store's catalog, on SQLite and PostgreSQL alike: each
project's one draft (``engine.control.drafts``) and the operator nonces accepted once ever
(``engine.control.attestation``), both surviving a reopen of the catalog (a restart of serve)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from contextful.engine.control.drafts import draft_digest
from contextful.storage.catalog import DraftRow

from tests.storage.catalog_place import CatalogPlace


def _row(draft_id: str, document: str) -> DraftRow:
    row = DraftRow("shop", draft_id, 3, "dana", "a" * 32, 1_800_000_000_000_000, document, '{"format":1}', "")
    return replace(row, digest=draft_digest(row))


@pytest.mark.clause("surface.edit.store-draft")
def test_one_draft_per_project_kept_across_a_reopen(place: CatalogPlace) -> None:
    catalog = place.catalog()
    try:
        assert catalog.draft("shop") is None
        first, second = _row("d1", "[project]\nname = 'shop'\n"), _row("d2", "[project]\nname = 'shop'\n# 2\n")
        catalog.save_draft(first)
        catalog.save_draft(replace(first, project="other", draft_id="d9"))
        catalog.save_draft(second)  # replaces the project's draft
    finally:
        catalog.close()
    reopened = place.catalog()
    try:
        assert reopened.draft("shop") == second and draft_digest(second) == second.digest
        assert reopened.drop_draft("shop", "d1") is False and reopened.draft("shop") == second
        assert reopened.drop_draft("shop", "d2") is True and reopened.draft("shop") is None
        assert reopened.draft("other") is not None
    finally:
        reopened.close()


@pytest.mark.clause("surface.apply.operator-attestation")
def test_a_nonce_is_accepted_once_ever_across_reopens_and_racing_writers(place: CatalogPlace) -> None:
    catalogs = [place.catalog() for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda c: c.accept_nonce("b" * 32, "dana", 1), catalogs))
        assert sorted(outcomes) == [False, False, False, True]
    finally:
        for catalog in catalogs:
            catalog.close()
    reopened = place.catalog()
    try:
        assert reopened.accept_nonce("b" * 32, "dana", 2) is False
        assert reopened.accept_nonce("c" * 32, "dana", 2) is True
    finally:
        reopened.close()
