"""Reserved names and reserved columns of the store.

Table names starting with ``_`` belong to the store: ``_runs`` (the run record,
``storage.run_record``) and ``_items`` (one row per terminal item, ``engine.run.items``); a user table name is a letter followed by letters, digits and underscores. A batch
carrying ``_modality`` must name one of the five modalities in every row
(``store.reserve.modality``, decision "passage-s-modality"); anything else fails that batch's
validation before a byte is staged.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from contextful.storage.errors import ModalityInvalid, TableNameInvalid
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

RUNS_TABLE = "_runs"
ITEMS_TABLE = "_items"
RESERVED_TABLES = frozenset({RUNS_TABLE, ITEMS_TABLE})
MODALITIES = ("text", "image", "audio", "structured", "mixed")
MODALITY_COLUMN = "_modality"

_USER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")


def check_table_name(name: str, reserved_ok: bool = False) -> None:
    if reserved_ok and name in RESERVED_TABLES:
        return
    if name.startswith("_"):
        raise TableNameInvalid(name, "names starting with '_' are reserved for the store")
    if not _USER_NAME.fullmatch(name):
        raise TableNameInvalid(name, "use a letter, then letters, digits or '_' (at most 128)")


def check_modality(table: str, data: pa.Table) -> None:
    """Raise ModalityInvalid when ``_modality`` holds a value outside the five (nulls included)."""
    if MODALITY_COLUMN not in data.column_names:
        return
    column = data.column(MODALITY_COLUMN)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            or column.type == pa.string_view()):
        raise ModalityInvalid(table, [f"<{column.type}>"], MODALITIES)
    valid = pc.fill_null(pc.is_in(column, value_set=pa.array(MODALITIES)), False)
    if pc.all(valid).as_py() is False:
        bad = pc.unique(pc.filter(column, pc.invert(valid))).to_pylist()
        raise ModalityInvalid(table, ["null" if v is None else v for v in bad], MODALITIES)
