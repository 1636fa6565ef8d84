"""A pipeline's write disposition: how a run's rows meet the rows its table already holds.

Declared per pipeline as ``write_disposition`` (docs/manifest.md), as dlt declares it:

- ``append``: every run adds its rows; an input that changed after it landed is refused by name
  (``InputChanged``), since landing it again would repeat its rows. The default of a pipeline
  without a ``primary_key``.
- ``merge``: the table answers one row per primary key, the latest landed winning (or the greatest
  ``order_by``); a changed input is read again whole and its rows merge by key (updated keys
  replaced, new keys added, keys it no longer holds kept). The default of a keyed pipeline, and
  what a keyed pipeline always did; it needs a ``primary_key``.
- ``replace``: a run that finds any input new, changed or gone reads every input and its rows
  become the table in one commit (relational child tables too); time travel keeps the previous
  version. Offered for ``files`` sources.

>>> check_disposition("[[pipeline]] 'c'", "replace", ("id",), "files")
('replace', [])
>>> check_disposition("[[pipeline]] 'c'", "merge", (), "files")[1][0].key
'write_disposition'
"""

from __future__ import annotations

from typing import Any

from contextful.storage.errors import ContextfulError, ManifestValueInvalid

DISPOSITIONS = ("append", "merge", "replace")
REPLACE_SOURCES = ("files",)


def check_disposition(where: str, declared: Any, primary_key: tuple[str, ...],
                      source_kind: str | None, seeded: bool = False) -> tuple[str | None, list[ContextfulError]]:
    """The declared disposition (None: the default, ``PipelineSpec.disposition``) and every problem
    of its declaration."""
    if declared is None:
        return None, []
    if declared not in DISPOSITIONS:
        return None, [ManifestValueInvalid(where, "write_disposition",
                                              f"{declared!r} is not one of {', '.join(DISPOSITIONS)}")]
    problems: list[ContextfulError] = []
    if declared == "merge" and not primary_key:
        problems.append(ManifestValueInvalid(where, "write_disposition", "'merge' upserts by key and the pipeline "
                                             "declares no primary_key: declare primary_key = [\"<column>\", ...]"))
    if declared == "append" and primary_key:
        problems.append(ManifestValueInvalid(where, "write_disposition", "'append' keeps every row, and a table with a "
                                             f"primary_key ({', '.join(primary_key)}) answers one row per key: "
                                             "declare 'merge', or drop the primary_key"))
    if declared == "replace" and source_kind is not None and source_kind not in REPLACE_SOURCES:
        problems.append(ManifestValueInvalid(where, "write_disposition", f"'replace' is offered for "
                                             f"{', '.join(REPLACE_SOURCES)} sources, not {source_kind!r}"))
    if declared == "replace" and seeded:
        problems.append(ManifestValueInvalid(where, "write_disposition", "'replace' would drop the seed's rows at "
                                             "the first run: a seeded pipeline appends or merges"))
    return declared, problems
