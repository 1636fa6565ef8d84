"""Imported at start-up by every Python process whose ``PYTHONPATH`` holds this directory (site's
``sitecustomize`` hook): a child serve starts (a unit's ``contextful.engine.control.child``, a job's
``contextful job fire``) writes its
whole environment and argument vector, as the kernel holds them (``/proc/self``), to a new file in
``CONTEXTFUL_TEST_ENV_DUMP``, so a test inspects exactly what serve handed the child. Any other
process (serve itself, the CLI) writes nothing."""

import json
import os

_folder = os.environ.get("CONTEXTFUL_TEST_ENV_DUMP")
if _folder:
    with open("/proc/self/cmdline", "rb") as _f:
        _argv = [a.decode("utf-8", "replace") for a in _f.read().split(b"\0") if a]
    if "contextful.engine.control.child" in _argv or ("contextful.engine.cli" in _argv and "fire" in _argv):
        with open("/proc/self/environ", "rb") as _f:
            _environ = [e.decode("utf-8", "replace") for e in _f.read().split(b"\0") if e]
        with open(os.path.join(_folder, f"child-{os.getpid()}.json"), "w") as _out:
            json.dump({"argv": _argv, "environ": _environ}, _out)
