"""The machine configuration: what this machine's derive engines execute (``[derive.<name>]``).

Implements decision "derive-engine-machine": a manifest requests an engine by name; the machine's
configuration, a TOML file apart from the manifest, defines what that name executes. Clauses:
``run.bind.unbound-engine`` (:func:`binding_for`), ``run.bind.command-in-manifest``
(:func:`command_in_manifest`), ``run.bind.driver-mismatch`` (:func:`check_driver`),
``run.bind.endpoint-host-bare``, ``run.exec.shell-command`` and ``run.exec.env-name``
(:func:`read_machine`). The steps a binding declares run in :mod:`contextful.engine.derive.exec`.

Lookup, first found wins (:func:`machine_path`): the ``--machine FILE`` flag, the environment
variable ``CONTEXTFUL_MACHINE``, then ``contextful.machine.toml`` beside the project's
``contextful.toml``. None found: an empty configuration, every engine unbound. docs/derive.md
documents every key.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from contextful.storage.errors import (
    ContextfulError,
    DeriveCommandInManifest,
    DeriveDriverMismatch,
    DeriveEndpointHostNotBare,
    DeriveEngineUnbound,
    DeriveEnvNameInvalid,
    DeriveShellCommand,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    ProjectInvalid,
)

MACHINE_ENV = "CONTEXTFUL_MACHINE"
MACHINE_FILE = "contextful.machine.toml"
BINDING_KEYS = ("preprocess", "env", "allow_hosts", "command")
"""Keys of a binding that never belong in ``[pipeline.source.config]`` (``run.bind.command-in-manifest``)."""

DRIVERS = ("exec", "none", "fetch")
WHENS = ("always", "media_is_url")
TASK_DRIVERS: Mapping[str, tuple[str, ...]] = MappingProxyType({"transcribe": ("exec", "none"),
                                                                 "link_preview": ("fetch",)})
"""The drivers each built-in task runs behind (``run.bind.driver-mismatch``)."""

TOP_KEYS = ("derive",)
ENGINE_KEYS = ("driver", "command", "remote", "env", "allow_hosts", "endpoint_host", "deadline_s",
               "output_cap_bytes", "parallelism", "zone", "preprocess")
STEP_KEYS = ("when", "command", "output")
PLACEHOLDER = re.compile(r"\{(input|output|media|python|project)\}")
"""``{input}``, ``{output}``, ``{media}``, ``{python}`` (the interpreter running Contextful) and
``{project}`` (the project's directory) inside an argv element; substituted once, in one pass."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*")


@dataclass(frozen=True)
class Step:
    """One child process of a unit's chain."""

    name: str
    """``preprocess[0]``, ``preprocess[1]``, ..., ``engine``: how errors name the step."""
    argv: tuple[str, ...]
    """The argument array, placeholders not yet substituted."""
    when: str = "always"
    """``always``, or ``media_is_url``: the step runs only when the media is an http(s) address."""
    output: str | None = None
    """A preprocess step's output: the file name it writes in the unit's work directory."""


@dataclass(frozen=True)
class Binding:
    """One ``[derive.<name>]`` block: what the engine ``engine`` executes on this machine."""

    engine: str
    """The engine's name, as the manifest's ``engine`` key gives it."""
    driver: str = "exec"
    """``exec`` (run ``command``), ``none`` (the preprocess chain's last file is the output) or ``fetch``."""
    command: tuple[str, ...] = ()
    """The engine step's argument array (driver ``exec``)."""
    preprocess: tuple[Step, ...] = ()
    """Steps run before the engine step, in order."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The children's whole environment: nothing else is inherited."""
    allow_hosts: tuple[str, ...] = ()
    """Hosts the fetch driver may reach."""
    endpoint_host: str | None = None
    """The fetch driver's endpoint: a bare host name."""
    remote: bool = False
    """Whether the engine itself accepts an http(s) media value as ``{input}``."""
    deadline_s: float = 300.0
    """A unit's whole chain's deadline, in seconds (a bound)."""
    output_cap_bytes: int = 16 * 1024 * 1024
    """Each step's stdout bound, in bytes (a bound)."""
    parallelism: int | None = None
    """Units in flight (a bound; None: the machine's cores)."""
    zone: str | None = None
    """Advisory zone of the machine's engine (nothing passes it to the engine's steps); never a row's zone,
    left out of derivation keys (``run.bind.advisory-zone``)."""

    def identity(self) -> dict[str, Any]:
        """The binding as JSON-able values, less its bounds (``deadline_s``, ``output_cap_bytes``,
        ``parallelism``) and its advisory ``zone``: what a derivation key covers."""
        return {"engine": self.engine, "driver": self.driver, "command": list(self.command),
                "preprocess": [{"name": s.name, "argv": list(s.argv), "when": s.when, "output": s.output}
                               for s in self.preprocess],
                "env": dict(sorted(self.env.items())), "allow_hosts": list(self.allow_hosts),
                "endpoint_host": self.endpoint_host, "remote": self.remote}


@dataclass(frozen=True)
class MachineConfig:
    """The machine configuration read."""

    path: Path | None
    """The file read (None: none was found)."""
    bindings: Mapping[str, Binding]
    """Each ``[derive.<name>]`` block by engine name."""


def machine_path(project_root: Path, flag: str | None = None) -> Path | None:
    """The machine configuration file: ``flag`` (``--machine``), else ``$CONTEXTFUL_MACHINE``, else
    ``contextful.machine.toml`` beside the project's manifest when it exists; None when none is.

    A file the flag or the variable names is answered even when it is missing, so that
    :func:`read_machine` reports it rather than falling through to another file."""
    if flag:
        return Path(flag).resolve()
    named = os.environ.get(MACHINE_ENV)
    if named:
        return Path(named).resolve()
    beside = project_root / MACHINE_FILE
    return beside if beside.is_file() else None


def load_machine(project_root: Path, flag: str | None = None) -> MachineConfig:
    """The machine configuration :func:`machine_path` finds, or ``ManifestInvalid`` naming its file
    and every problem in it."""
    machine, problems = read_machine(machine_path(project_root, flag))
    if problems:
        raise ManifestInvalid(str(machine.path), problems)
    return machine


def read_machine(path: Path | None) -> tuple[MachineConfig, list[ContextfulError]]:
    """The machine configuration at ``path`` (None: an empty one) and every problem found in it.

    Bindings with problems are left out of the configuration; the problems name each block
    (``[derive.<name>]``, ``[derive.<name>].preprocess[<i>]``) and key."""
    if path is None:
        return MachineConfig(None, MappingProxyType({})), []
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return MachineConfig(path, MappingProxyType({})), [ProjectInvalid(
            str(path), f"no machine configuration there (named by --machine or ${MACHINE_ENV})")]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return MachineConfig(path, MappingProxyType({})), [ProjectInvalid(
            str(path), f"not a readable TOML machine configuration: {exc}")]
    problems: list[ContextfulError] = [ManifestKeyUnknown("the machine configuration", key, TOP_KEYS)
                                       for key in doc if key not in TOP_KEYS]
    blocks = doc.get("derive", {})
    if not isinstance(blocks, dict):
        problems.append(ManifestValueInvalid("the machine configuration", "derive",
                                             "declare engines as [derive.<name>] tables"))
        blocks = {}
    bindings: dict[str, Binding] = {}
    for name, block in blocks.items():
        binding = _binding(name, block, problems)
        if binding is not None:
            bindings[name] = binding
    return MachineConfig(path, MappingProxyType(bindings)), problems


def binding_for(machine: MachineConfig, pipeline: str, engine: str) -> Binding:
    """The binding of ``engine``; ``DeriveEngineUnbound`` (``run.bind.unbound-engine``) names the
    pipeline, the engine, the file to edit and every bound engine when there is none."""
    binding = machine.bindings.get(engine)
    if binding is None:
        file = str(machine.path) if machine.path is not None else f"{MACHINE_FILE} beside contextful.toml"
        raise DeriveEngineUnbound(pipeline, engine, file, tuple(sorted(machine.bindings)))
    return binding


def command_in_manifest(pipeline: str, config: Mapping[str, Any]) -> list[DeriveCommandInManifest]:
    """Every binding key (``preprocess``, ``env``, ``allow_hosts``, a ``command``) anywhere inside
    ``[pipeline.source.config]``, nested tables and arrays of tables included
    (``run.bind.command-in-manifest``); each named by its dotted path."""
    found: list[DeriveCommandInManifest] = []

    def walk(value: Any, at: str) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                path = f"{at}.{key}" if at else str(key)
                if key in BINDING_KEYS:
                    found.append(DeriveCommandInManifest(pipeline, path))
                else:
                    walk(inner, path)
        elif isinstance(value, list):
            for i, inner in enumerate(value):
                walk(inner, f"{at}[{i}]")

    walk(config, "")
    return found


def check_driver(pipeline: str, task: str, engine: str | None, machine: MachineConfig,
                 host_task: bool) -> list[ContextfulError]:
    """``run.bind.driver-mismatch``: ``exec`` or ``none`` behind transcribe, ``fetch`` behind
    link_preview, and no engine behind a host task.

    ``engine`` is what the pipeline's ``engine`` key names (None: the key is absent). A host task
    naming any engine is refused, bound on this machine or not: the pairing is wrong in the manifest
    itself. A built-in task whose engine is unbound is not this check's to report (its ``engine``
    key is missing, or unbound: other errors name that); nor is a task that is neither built in nor
    a host task (``DeriveUnknownTask``)."""
    binding = machine.bindings.get(engine) if engine is not None else None
    if host_task:
        if engine is None:
            return []
        return [DeriveDriverMismatch(pipeline, task, binding.driver if binding is not None else "an unbound engine",
                                     f"host task {task!r} runs its registered code and names no engine: remove "
                                     f"engine = {engine!r} from [pipeline.source.config]")]
    allowed = TASK_DRIVERS.get(task)
    if binding is None or allowed is None or binding.driver in allowed:
        return []
    spelled = " or ".join(f'"{d}"' for d in allowed)
    return [DeriveDriverMismatch(pipeline, task, binding.driver,
                                 f"{task} runs behind driver {spelled}: set driver in [derive.{binding.engine}] "
                                 "or name another engine")]


# --- reading one [derive.<name>] block -------------------------------------------------------------


def _binding(name: str, block: Any, problems: list[ContextfulError]) -> Binding | None:
    where = f"[derive.{name}]"
    if not isinstance(block, dict):
        problems.append(ManifestValueInvalid("[derive]", name, "must be a [derive.<name>] table"))
        return None
    found = len(problems)
    problems += [ManifestKeyUnknown(where, key, ENGINE_KEYS) for key in block if key not in ENGINE_KEYS]
    driver = block.get("driver", "exec")
    if driver not in DRIVERS:
        problems.append(ManifestValueInvalid(where, "driver", f"must be one of {', '.join(DRIVERS)}, not {driver!r}"))
    command: tuple[str, ...] = ()
    if "command" in block:
        command = _argv(name, "command", where, block["command"], problems)
        if driver != "exec":
            problems.append(ManifestValueInvalid(where, "command", f"driver {driver!r} runs no engine command; "
                                                 "remove it or set driver = \"exec\""))
        if any("{output}" in a for a in command):
            problems.append(ManifestValueInvalid(where, "command", "the engine step's output is its stdout; "
                                                 "{output} names a preprocess step's file only"))
    elif driver == "exec":
        problems.append(ManifestValueInvalid(where, "command", "is required with driver \"exec\" (an argument array)"))
    steps = _steps(name, where, block.get("preprocess", []), problems)
    if driver == "none" and not any(s.when == "always" for s in steps):
        problems.append(ManifestValueInvalid(where, "preprocess", "driver \"none\" takes its output from the last "
                                             "preprocess step: declare one with when = \"always\""))
    env = _env(name, where, block.get("env", {}), problems)
    allow_hosts = block.get("allow_hosts", [])
    if not isinstance(allow_hosts, list) or not all(isinstance(h, str) and h for h in allow_hosts):
        problems.append(ManifestValueInvalid(where, "allow_hosts", f"must be a list of host names, not {allow_hosts!r}"))
        allow_hosts = []
    endpoint_host = block.get("endpoint_host")
    if endpoint_host is not None:
        endpoint_host = _bare_host(name, where, endpoint_host, problems)
    remote = block.get("remote", False)
    if not isinstance(remote, bool):
        problems.append(ManifestValueInvalid(where, "remote", f"must be true or false, not {remote!r}"))
    deadline_s = block.get("deadline_s", 300.0)
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float) or not 0 < deadline_s < math.inf:
        problems.append(ManifestValueInvalid(where, "deadline_s", f"must be a positive number of seconds, "
                                             f"not {deadline_s!r}"))
    cap = _positive_int(where, block, "output_cap_bytes", 16 * 1024 * 1024, problems)
    parallelism = _positive_int(where, block, "parallelism", None, problems)
    zone = block.get("zone")
    if zone is not None and (not isinstance(zone, str) or not zone.strip()):
        problems.append(ManifestValueInvalid(where, "zone", f"must be a non-empty string, not {zone!r}"))
    if len(problems) > found or cap is None:
        return None
    return Binding(name, driver, command, steps, env, tuple(allow_hosts), endpoint_host, remote, float(deadline_s),
                   cap, parallelism, zone)


def _argv(engine: str, step: str, where: str, value: Any, problems: list[ContextfulError]) -> tuple[str, ...]:
    """A step's command: an argument array of strings, its program non-empty
    (``run.exec.shell-command``: a string is refused, never split or handed to a shell)."""
    if isinstance(value, str):
        problems.append(DeriveShellCommand(engine, step))
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) or not value[0]:
        problems.append(ManifestValueInvalid(where, "command", f"must be an argument array of strings, its first the "
                                             f"program, not {value!r}"))
        return ()
    if any("\0" in a for a in value):
        problems.append(ManifestValueInvalid(where, "command", "an argument holds a NUL character"))
        return ()
    return tuple(value)


def _steps(engine: str, where: str, value: Any, problems: list[ContextfulError]) -> tuple[Step, ...]:
    if not isinstance(value, list):
        problems.append(ManifestValueInvalid(where, "preprocess", "declare steps as [[derive.<name>.preprocess]] "
                                             "tables"))
        return ()
    steps: list[Step] = []
    outputs: set[str] = set()
    for i, block in enumerate(value):
        name = f"preprocess[{i}]"
        at = f"{where}.{name}"
        if not isinstance(block, dict):
            problems.append(ManifestValueInvalid(where, name, "must be a table (when, command, output)"))
            continue
        problems += [ManifestKeyUnknown(at, key, STEP_KEYS) for key in block if key not in STEP_KEYS]
        when = block.get("when", "always")
        if when not in WHENS:
            problems.append(ManifestValueInvalid(at, "when", f"must be one of {', '.join(WHENS)}, not {when!r}"))
        argv = _argv(engine, name, at, block.get("command"), problems)
        output = block.get("output")
        if not isinstance(output, str) or output in ("", ".", "..") or "/" in output or "\0" in output:
            problems.append(ManifestValueInvalid(at, "output", f"must be a file name (no '/') the step writes in the "
                                                 f"unit's work directory, not {output!r}"))
            output = None
        elif output in outputs:
            problems.append(ManifestValueInvalid(at, "output", f"{output!r} is another step's output already"))
        else:
            outputs.add(output)
        steps.append(Step(name, argv, str(when), output))
    return tuple(steps)


def _env(engine: str, where: str, value: Any, problems: list[ContextfulError]) -> Mapping[str, str]:
    """``run.exec.env-name``: each name ASCII letters, digits and ``_``, not leading with a digit."""
    if not isinstance(value, dict):
        problems.append(ManifestValueInvalid(where, "env", f"must be a table of NAME = \"value\", not {value!r}"))
        return MappingProxyType({})
    env: dict[str, str] = {}
    for key, text in value.items():
        if not _ENV_NAME.fullmatch(key) or not key.isascii():
            problems.append(DeriveEnvNameInvalid(engine, key))
        elif not isinstance(text, str) or "\0" in text:
            problems.append(ManifestValueInvalid(where, f"env.{key}", f"must be a string without NUL, not {text!r}"))
        else:
            env[key] = text
    return MappingProxyType(env)


def _bare_host(engine: str, where: str, value: Any, problems: list[ContextfulError]) -> str | None:
    """``run.bind.endpoint-host-bare``: a host name or address alone, no scheme, port, path or query."""
    if not isinstance(value, str) or not value.strip():
        problems.append(ManifestValueInvalid(where, "endpoint_host", f"must be a host name, not {value!r}"))
        return None
    parts = (("scheme", _SCHEME.match(value) is not None), ("path", "/" in value), ("query", "?" in value),
             ("fragment", "#" in value), ("user name", "@" in value),
             ("port", re.fullmatch(r"[^:]*:\d*|\[.*\]:.*", value) is not None))
    for part, carried in parts:
        if carried:
            problems.append(DeriveEndpointHostNotBare(engine, value, part))
            return None
    if not _HOST.fullmatch(value):
        problems.append(ManifestValueInvalid(where, "endpoint_host", f"{value!r} is not a host name"))
        return None
    return value


def _positive_int(where: str, block: dict[str, Any], key: str, default: int | None,
                  problems: list[ContextfulError]) -> int | None:
    value = block.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(ManifestValueInvalid(where, key, f"must be a positive integer, not {value!r}"))
        return default
    return value
