"""Heavy libraries imported on first use, so a command pays only for what it touches.

A no-op ``contextful pipeline run`` must cost about what ``import pyarrow`` costs (issue 17's
fixed-cost target); DuckDB, pyarrow.compute, fsspec, numpy and cryptography each add 50-350 ms to a
start, and most commands never call them. A module on a command's startup path binds such a library
with :func:`lazy_module` instead of ``import``::

    if TYPE_CHECKING:
        import duckdb
    else:
        duckdb = lazy_module("duckdb")

and reads ``duckdb.connect`` as before: the first attribute read imports the library and copies its
namespace into the stand-in, so later reads are plain attribute lookups (no hook, no import
machinery). Module-level code that reads an attribute imports the library right there, as ``import``
would, so use it only where the module's top level does not touch the library.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec
from typing import Any


class _LazyModule(types.ModuleType):
    """A stand-in for a module not imported yet: the first attribute read imports it."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):  # introspection (copy, pickle, doctest) must not import
            raise AttributeError(attr)
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)  # later reads find the names without this hook
        return getattr(module, attr)


def lazy_module(name: str) -> types.ModuleType:
    """``name`` itself when imported already, else a stand-in that imports it on first use."""
    loaded = sys.modules.get(name)
    return loaded if loaded is not None else _LazyModule(name)


def preload(*modules: types.ModuleType) -> None:
    """Import the modules behind stand-ins now (a fork server preloads what its children use)."""
    for module in modules:
        if isinstance(module, _LazyModule):
            module.__dict__.update(importlib.import_module(module.__name__).__dict__)


class _PandasHeldBack:
    """A finder that refuses ``pandas`` while pyarrow probes for it (:func:`spare_pandas`)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is held back while pyarrow probes for it", name=name)


def spare_pandas() -> None:
    """Let pyarrow build arrays without importing pandas, in a process that has not imported it.

    pyarrow probes for pandas at its first array built from Python or NumPy values and remembers
    the answer; with pandas installed that probe imports it (0.3 s, more than a small run's whole
    landing). Here the probe runs once with pandas held back, so array building never imports it.
    Whatever needs pandas still gets it: pyarrow imports it again for a call that requires it
    (``to_pandas``, ``from_pandas``), and from then on treats pandas objects as its own. Until then
    a pandas object handed to ``pa.array`` converts as a plain sequence. For the command line's
    process only (it decides what runs in it); a library caller's process keeps pyarrow's behaviour.

    When pyarrow is not imported yet the probe waits for its import (a run with nothing to do never
    imports it), riding on pyarrow's own loader.
    """
    if "pandas" in sys.modules:
        return
    if "pyarrow" in sys.modules:
        _probe_without_pandas(sys.modules["pyarrow"])
    elif not any(isinstance(finder, _ProbeAfterPyarrow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ProbeAfterPyarrow())


def _probe_without_pandas(pa: types.ModuleType) -> None:
    finder = _PandasHeldBack()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


class _ProbeAfterPyarrow:
    """A finder that lets pyarrow load as usual, then runs :func:`spare_pandas`' probe on it."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name != "pyarrow":
            return None
        sys.meta_path.remove(self)  # once: the real finders answer from here on
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        load = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            load(module)
            if "pandas" not in sys.modules:
                _probe_without_pandas(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
