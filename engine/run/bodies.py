"""Registered bodies: host code a store-driven job runs, selected by name and pinned by digest.

Implements ``run.own.body-implementation`` and ``run.own.body-dependencies`` (decision
"registered-bodies-pin": registered bodies pin the executing host and public semantic
dependencies). A host registers a Python callable under a body name (DESIGN.md's translation of
"the embedding binary registers a body"), declaring what else decides its result: prompts or
templates, public provider/model configuration, and policy identities. Registration computes:

* the **implementation digest**, which the host verifies itself: SHA-256 over the source of the
  module the callable's concrete type lives in (its binary when it has no source), the version of
  the package that module belongs to, and that concrete registered type's name;
* one **dependency digest** per declared dependency, each over that dependency alone, so changing
  a prompt changes only its own digest — and none of them covers the structural input and output
  declarations, which the plan reference pins.

:meth:`RegisteredBody.pins` is what an owner pins beside the plan reference. Configuration selects
a body by name only (:meth:`BodyRegistry.select`): it cannot authenticate a digest, type or
version given beside that name, so such a key refuses with ``BodyIdentityConfigured``. Credential
values have no field in provider semantics: a provider key naming one is refused at registration.

    >>> import textwrap
    >>> registry = BodyRegistry()
    >>> body = registry.register("indent", textwrap.indent, prompts={"system": "Answer briefly."})
    >>> registry.select("indent") is body, body.type_name, sorted(body.pins())
    (True, 'textwrap.indent', ['body', 'body.implementation', 'body.type', 'dep.prompt:system'])
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from contextful.storage.errors import ArgumentInvalid, BodyIdentityConfigured, BodyUnregistered

BODY_PIN = "body"
IMPLEMENTATION_PIN = "body.implementation"
TYPE_PIN = "body.type"
INPUT_PIN = "input"
"""The pin holding the input identity a verified body's execution runs on."""
DEPENDENCY_PREFIX = "dep."

_CREDENTIAL_WORDS = ("secret", "token", "password", "credential", "api_key", "apikey", "private_key")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@cache
def _distributions() -> Mapping[str, list[str]]:
    import importlib.metadata  # 20 ms of imports: only when a body's identity is asked

    return importlib.metadata.packages_distributions()  # scans every installed distribution: once


def package_version(top_level: str) -> str:
    """The version of the installed distribution providing import package ``top_level``
    (``unpackaged`` for code no distribution provides, such as a script's own module)."""
    dists = _distributions().get(top_level)
    import importlib.metadata

    return importlib.metadata.version(dists[0]) if dists else "unpackaged"


def _concrete_type(fn: Callable[..., Any]) -> Any:
    """What the body's type is: a function, method or class itself; a callable object's class."""
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn) or inspect.isbuiltin(fn):
        return fn
    return type(fn)


def _module_bytes(name: str, module: Any) -> bytes:
    """The module's source as loaded from disk now (its binary when it has no source)."""
    path = None
    try:
        path = inspect.getsourcefile(module)
    except TypeError:  # a built-in module: neither source nor file
        path = None
    path = path or getattr(module, "__file__", None)
    if path is None or not Path(path).is_file():
        raise ArgumentInvalid("body", name, f"its module {module.__name__!r} has no source or binary on disk to "
                                            "digest; register a callable defined in a module file")
    return Path(path).read_bytes()


@dataclass(frozen=True)
class RegisteredBody:
    name: str
    fn: Callable[..., Any] = field(repr=False)
    type_name: str
    """The concrete registered type, ``module.qualname``."""
    package_version: str
    implementation: str
    """SHA-256 hex over the type's module source (or binary), the package version and the type name."""
    dependencies: Mapping[str, str]
    """``prompt:<name>``, ``provider:<name>``, ``policy:<name>`` → SHA-256 hex of that one value."""
    inputs: tuple[str, ...] = ()
    """Structural input declarations (pinned by the plan, not by any dependency digest)."""
    outputs: tuple[str, ...] = ()

    def pins(self, input_identity: str | None = None) -> dict[str, str]:
        """What an owner of this body's execution pins beside its plan reference; with the input
        identity the execution runs on when given (how an applied snapshot matches it)."""
        pins = {BODY_PIN: self.name, IMPLEMENTATION_PIN: self.implementation, TYPE_PIN: self.type_name}
        pins.update({DEPENDENCY_PREFIX + key: digest for key, digest in self.dependencies.items()})
        if input_identity is not None:
            pins[INPUT_PIN] = input_identity
        return pins


class BodyRegistry:
    """Bodies by name. :data:`BODIES` is the process's; tests make their own."""

    def __init__(self) -> None:
        self._bodies: dict[str, RegisteredBody] = {}

    def register(self, name: str, fn: Callable[..., Any], *, prompts: Mapping[str, str] | None = None,
                 providers: Mapping[str, Mapping[str, Any]] | None = None,
                 policies: Mapping[str, Any] | None = None, inputs: tuple[str, ...] = (),
                 outputs: tuple[str, ...] = ()) -> RegisteredBody:
        """Register ``fn`` as body ``name`` with its declared semantic dependencies; digest them.
        A name registered to another implementation refuses (ValueError)."""
        if not name or not callable(fn):
            raise ArgumentInvalid("body", name, "a body is a non-empty name and a callable")
        target = _concrete_type(fn)
        module_name = target.__module__ or ""
        module = sys.modules.get(module_name)
        if module is None:
            raise ArgumentInvalid("body", name, f"its module {module_name!r} is not loaded")
        type_name = f"{module_name}.{target.__qualname__}"
        version = package_version(module_name.split(".")[0])
        implementation = hashlib.sha256(b"\0".join(
            [_module_bytes(name, module), version.encode(), type_name.encode()])).hexdigest()
        for provider, config in (providers or {}).items():
            leaked = sorted(k for k in config if any(word in k.lower() for word in _CREDENTIAL_WORDS))
            if leaked:
                raise ArgumentInvalid(f"body {name!r} provider {provider!r}", ", ".join(leaked),
                                      "credential values have no field in provider semantics: declare only public "
                                      "provider/model configuration, and pass credentials at run time")
        dependencies = {f"{kind}:{key}": _digest(value)
                        for kind, declared in (("prompt", prompts), ("provider", providers), ("policy", policies))
                        for key, value in (declared or {}).items()}
        body = RegisteredBody(name, fn, type_name, version, implementation, dependencies, tuple(inputs),
                              tuple(outputs))
        known = self._bodies.get(name)
        if known is not None and (known.implementation, known.type_name) != (implementation, type_name):
            raise ValueError(f"body {name!r} is registered to {known.type_name} already")
        self._bodies[name] = body
        return body

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._bodies))

    def get(self, name: str) -> RegisteredBody:
        """Body ``name``; a name not registered yet loads the ``contextful.tasks`` entry points first,
        as a host task's does (``engine.registrations``: ``[project] modules`` register bodies too)."""
        body = self._bodies.get(name)
        if body is None:
            from contextful.engine.registrations import load_entry_points, searched

            load_entry_points()
            body = self._bodies.get(name)
            if body is None:
                where = searched()
                raise BodyUnregistered(name, self.names(), where.modules, where.entry_points or ())
        return body

    def select(self, configured: str | Mapping[str, Any]) -> RegisteredBody:
        """The body configuration selects: its name, or a table ``{name = "..."}`` holding nothing
        else. A digest, type, version or any other key beside the name: BodyIdentityConfigured."""
        if isinstance(configured, str):
            return self.get(configured)
        name = str(configured.get("name", ""))
        extra = tuple(sorted(str(key) for key in configured if key != "name"))
        if extra:
            raise BodyIdentityConfigured(name, extra)
        return self.get(name)


BODIES = BodyRegistry()


def register_body(name: str, fn: Callable[..., Any], **declared: Any) -> RegisteredBody:
    """Register a body in the process's registry (:meth:`BodyRegistry.register`)."""
    return BODIES.register(name, fn, **declared)
