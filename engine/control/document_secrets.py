"""Credential material in a control document: refused, naming the field and never the value.

Implements ``surface.edit.secret-in-document`` (docs/control.md, docs/served.md "Control routes"):
a document reaches every daemon and replica that reads a snapshot, so it holds ``${secret:NAME}``
references and the secret backend holds the material. :func:`refuse_secret_material` scans every
field of a parsed document — each string value and each key, at any depth — with the secret
guard's credential catalogue (``engine.guard``: the same families, read plainly and behind JSON or
URL escapes) and raises ``SecretMaterialInDocument`` naming the first field holding one and the
family it matched. Import, apply and the served draft route all run it (``engine.control.apply``'s
validation), before the engine's own validation can quote a value in a message.

:func:`fields` is the walk: each string with the name of its field as a person finds it in the
file (``[[pipeline]] 'gh' source.config.headers.Authorization``; an array entry without an ``id``
or ``name`` by its index).

    >>> refuse_secret_material({"pipeline": [{"id": "gh", "source": {"config": {"token": "${secret:GH}"}}}]})
    >>> try:
    ...     refuse_secret_material({"project": {"note": "AKIA" + "Q" * 16}})
    ... except Exception as exc:
    ...     print(exc)
    SecretMaterialInDocument: [project] note holds credential material (aws-access-key-id); write a ${secret:NAME} reference and keep the value in the secret backend
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from contextful.engine.guard.escapes import findings
from contextful.storage.errors import SecretMaterialInDocument

DOCUMENT = "the document"
KEY_OF = " (a key)"
"""Appended to a field's name when the credential is a key of it: the key itself is never named."""


def fields(doc: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Each ``(field name, text)`` of the document: every string value, and every key (named by its
    parent with :data:`KEY_OF`), depth first in document order."""
    for key, value in doc.items():
        yield DOCUMENT + KEY_OF, str(key)
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for index, entry in enumerate(value):
                label = entry.get("id", entry.get("name"))
                yield from _walk(f"[[{key}]] {label!r}" if isinstance(label, str) else f"[[{key}]] #{index + 1}",
                                 "", entry)
        elif isinstance(value, Mapping):
            yield from _walk(f"[{key}]", "", value)
        else:
            yield from _walk("", str(key), value)


def _walk(table: str, path: str, value: Any) -> Iterator[tuple[str, str]]:
    here = f"{table} {path}".strip() or DOCUMENT
    if isinstance(value, str):
        yield here, value
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            yield here + KEY_OF, str(key)
            yield from _walk(table, f"{path}.{key}" if path else str(key), inner)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _walk(table, f"{path}[{index}]", inner)


def refuse_secret_material(doc: Mapping[str, Any]) -> None:
    """``SecretMaterialInDocument`` naming the first field of ``doc`` holding credential material."""
    for where, text in fields(doc):
        found = findings(text)
        if found:
            raise SecretMaterialInDocument(where, found[0].family)


def refuse_secret_text(text: str, source: str) -> None:
    """``SecretMaterialInDocument`` when the document's text itself (its comments included) holds
    credential material, naming the line: what the parsed fields cannot show a reader."""
    for number, line in enumerate(text.splitlines(), 1):
        found = findings(line)
        if found:
            raise SecretMaterialInDocument(f"{source} line {number}", found[0].family)
