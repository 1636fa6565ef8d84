"""Sending one Iceberg commit and learning its outcome before anything is cleaned up.

The rule (docs/exports.md, "When the outcome is not known"): files an attempt wrote are deleted
only when the catalog's answer says the commit did not land — ``CommitFailedException`` (a
requirement failed, a rival moved the table) or ``NoSuchTableError``. Any other error from
``catalog.commit_table`` (a connection cut, a timeout, a REST 5xx or
``CommitStateUnknownException``, a SQL catalog's ``OperationalError``) may have come after the
catalog committed, so the outcome is resolved first:

1. reload the table; the commit landed when ``landed(metadata)`` holds (for an export: its
   snapshot id is among the table's snapshots);
2. otherwise the commit may still be in flight (a SQL transaction whose client vanished) or lost:
   send the very same commit again. The requirements make the two exclusive — both require the
   same state, and whichever lands first changes it — so a success means it landed once, and a
   refusal followed by a reload without it means neither landed;
3. any error while resolving leaves the outcome unknown: ``CommitOutcomeUnknown``, and the caller
   deletes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from contextful.storage.errors import CommitOutcomeUnknown, first_line
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import Identifier

Refusal = CommitFailedException | NoSuchTableError


def send_commit(catalog: Catalog, identifier: str | Identifier, table: Table,
                requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...],
                landed: Callable[[TableMetadata], bool], commit: str) -> TableMetadata | Refusal:
    """Send one commit: the table's metadata with the commit in it, or the catalog's refusal.

    ``commit`` names the commit in a ``CommitOutcomeUnknown`` (raised when neither can be learned).
    """
    name = identifier if isinstance(identifier, str) else ".".join(identifier)
    try:
        return catalog.commit_table(table, requirements, updates).metadata
    except (CommitFailedException, NoSuchTableError) as refused:
        return refused
    except Exception as exc:  # noqa: BLE001 - any other error may have followed the commit point
        unheard = exc
    try:
        current = catalog.load_table(identifier).metadata
        if landed(current):
            return current
        try:
            return catalog.commit_table(table, requirements, updates).metadata
        except CommitFailedException as refused:
            current = catalog.load_table(identifier).metadata
            return current if landed(current) else refused
    except Exception as again:  # noqa: BLE001 - still no answer: nothing may be deleted
        raise CommitOutcomeUnknown(f"Iceberg table {name!r}", commit,
                                   f"{first_line(unheard)}; resolving it: {first_line(again)}") from unheard
