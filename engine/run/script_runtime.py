"""No scripting runtime where plans are served: a JavaScript engine importable here refuses to start.

Implements ``topology.compose.script-runtime`` and the serving half of
``run.compile.authoring-surface`` (decision "plan-compiled-content"): a plan is compiled data, so
the environment that runs it (``contextful pipeline run``, ``contextful pipeline serve``) links
no scripting runtime. :func:`refuse_script_runtime` looks each module of
:data:`JS_RUNTIME_MODULES` up on the import path (``importlib.util.find_spec``: found, never
imported, so none of its code runs) and raises :class:`ScriptRuntimeLinked` naming those present.
"""

from __future__ import annotations

import importlib.util

from contextful.storage.errors import ScriptRuntimeLinked

JS_RUNTIME_MODULES = ("py_mini_racer", "mini_racer", "quickjs", "dukpy", "js2py", "pythonmonkey", "STPyV8", "PyV8",
                      "execjs", "javascript", "pyduktape", "pyduktape2")
"""Import names of the JavaScript engines Python can link: PyMiniRacer (V8), quickjs, dukpy and
pyduktape (Duktape), Js2Py, PythonMonkey (SpiderMonkey), STPyV8 and PyV8 (V8), PyExecJS
(``execjs``, a bridge to an installed engine), JSPyBridge (``javascript``, Node.js)."""


def linked_script_runtimes() -> tuple[str, ...]:
    """The modules of :data:`JS_RUNTIME_MODULES` importable in this environment."""
    found = []
    for name in JS_RUNTIME_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a broken entry on the path is still no runtime to run
            continue
        if spec is not None:
            found.append(name)
    return tuple(found)


def refuse_script_runtime() -> None:
    """Raise :class:`ScriptRuntimeLinked` when a JavaScript engine is importable here."""
    if linked := linked_script_runtimes():
        raise ScriptRuntimeLinked(linked)
