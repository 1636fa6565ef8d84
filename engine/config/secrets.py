"""Secret references: ``${secret:NAME}`` in an HTTP source's ``headers``, resolved at request time.

A manifest never holds a credential's value: a header value names it
(``Authorization = "Bearer ${secret:GITHUB_TOKEN}"``) and :func:`resolve_headers` reads it, in
this order, from

1. the environment variable ``NAME`` exactly (no prefix is added or accepted instead), then
2. the project's secrets file :data:`SECRETS_FILE` (``.contextful/secrets.toml`` beside
   ``contextful.toml``; a top-level ``NAME = "value"``), kept out of version control
   (``contextful init`` lists it in ``.gitignore``).

An empty value (a variable set to nothing) counts as unset.

A reference neither holds is ``SecretUnresolved``, naming the reference, the header and every place
looked, raised by ``pipeline validate``, ``plan`` and ``run`` before any request. A resolved value
lives only in the requesting process: the applied snapshot, the plan and the journal hold the
reference, and the value is remembered by the guard (``engine.guard.resolved``) so that every
masked message shows the reference in its place. References are read in ``headers`` alone: a URL or
query parameter is recorded in plans and journals, so a reference there is refused at validate
(:func:`reference_problems`).

    >>> import os, pathlib
    >>> os.environ["DOCTEST_TOKEN"] = "s3cr3t-value"
    >>> resolve_headers({"Authorization": "Bearer ${secret:DOCTEST_TOKEN}"}, pathlib.Path("."), "headers")
    {'Authorization': 'Bearer s3cr3t-value'}
    >>> del os.environ["DOCTEST_TOKEN"]
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contextful.engine.project import read_toml_file
from contextful.storage.errors import ContextfulError, ManifestValueInvalid, SecretUnresolved

SECRETS_FILE = ".contextful/secrets.toml"
_REFERENCE = re.compile(r"\$\{secret:([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def reference_problems(where: str, config: Mapping[str, Any]) -> list[ContextfulError]:
    """Every malformed reference in ``headers`` and every reference outside it, each named."""
    problems: list[ContextfulError] = []
    headers = config.get("headers")
    for name, value in (headers.items() if isinstance(headers, dict) else ()):
        for found in _REFERENCE.finditer(str(value)):
            if not _NAME.fullmatch(found.group(1)):
                problems.append(ManifestValueInvalid(where, f"headers.{name}", f"{found.group(0)} does not name a "
                                                     f"secret: write ${{secret:NAME}}, NAME letters, digits and _"))
    for key, value in config.items():
        if key != "headers" and "${secret:" in repr(value):
            problems.append(ManifestValueInvalid(where, key, "secret references are read in headers only (a URL "
                                                 "and its query are recorded in plans and journals)"))
    return problems


def resolve_headers(headers: Mapping[str, str], root: Path, where: str) -> dict[str, str]:
    """``headers`` with every ``${secret:NAME}`` replaced by its value (``SecretUnresolved`` when
    neither the environment nor the project's secrets file holds it); each value is remembered by
    the guard, so masked text shows its reference."""
    from contextful.engine.guard.resolved import remember

    file: dict[str, Any] | None = None
    resolved = {}
    for header, text in headers.items():
        parts, at = [], 0
        for found in _REFERENCE.finditer(text):  # bounded by the references a header holds
            name = found.group(1)
            value = os.environ.get(name) or None  # a variable set to nothing is not a secret
            if value is None:
                file = read_toml_file(root / SECRETS_FILE) if file is None else file
                value = file.get(name) if isinstance(file.get(name), str) and file.get(name) else None
            if value is None:
                raise SecretUnresolved(found.group(0), f"{where}.{header}",
                                       (f"environment variable {name}", f"{root / SECRETS_FILE} key {name}"))
            remember(value, found.group(0))
            parts += [text[at:found.start()], value]
            at = found.end()
        resolved[header] = "".join(parts) + text[at:]
    return resolved
