"""Parsed TOML back to TOML text: what a composed manifest document is stored as, and the
normalized form two documents are compared in (docs/control.md, "Applied versions").

:func:`dumps` writes any document ``tomllib`` returns so that ``tomllib.loads(dumps(doc)) == doc``
(a property test holds it to that): a table's plain keys first, then its tables as ``[a.b]``
sections and its arrays of tables as ``[[a.b]]`` sections; strings as basic strings; floats by
their shortest round-trip spelling (``inf``, ``nan`` as TOML spells them); dates and times in
ISO 8601. With ``sort_keys`` every table's keys are in sorted order: the normal form, in which
two documents that parse the same (comments, spacing, quoting, key order and the way a table is
written aside) are one text.

>>> dumps({"project": {"name": "demo"}, "pipeline": [{"id": "a", "source": {"kind": "files"}}]})
'[project]\\nname = "demo"\\n\\n[[pipeline]]\\nid = "a"\\n\\n[pipeline.source]\\nkind = "files"\\n'
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dumps(doc: Mapping[str, Any], *, sort_keys: bool = False) -> str:
    """``doc`` (parsed TOML) as TOML text."""
    lines: list[str] = []
    _table(lines, (), doc, sort_keys)
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any], sort_keys: bool) -> None:
    items = sorted(table.items()) if sort_keys else list(table.items())
    for key, value in items:  # plain keys belong to the section above any sub-table header
        if not isinstance(value, dict) and not _is_table_array(value):
            lines.append(f"{_key(key)} = {_value(value, sort_keys)}")
    for key, value in items:
        name = ".".join(_key(k) for k in (*path, key))
        if isinstance(value, dict):
            lines += ["", f"[{name}]"]
            _table(lines, (*path, key), value, sort_keys)
        elif _is_table_array(value):
            for item in value:
                lines += ["", f"[[{name}]]"]
                _table(lines, (*path, key), item, sort_keys)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # JSON's escapes are TOML basic-string escapes; TOML also wants DEL escaped, which JSON leaves.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any, sort_keys: bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v, sort_keys) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items()) if sort_keys else list(value.items())
        return "{" + ", ".join(f"{_key(k)} = {_value(v, sort_keys)}" for k, v in items) + "}"
    raise TypeError(f"{type(value).__name__} is no TOML value")
