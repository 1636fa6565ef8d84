"""The machine configuration: lookup, every problem of a [derive.<name>] block named, bindings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.engine.derive.bind import (
    MACHINE_ENV,
    MACHINE_FILE,
    Binding,
    Step,
    binding_for,
    machine_path,
    read_machine,
)
from contextful.storage.errors import (
    ContextfulError,
    DeriveEndpointHostNotBare,
    DeriveEngineUnbound,
    DeriveEnvNameInvalid,
    DeriveShellCommand,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    ProjectInvalid,
)

from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline

FULL = """
[derive.whisper]
driver = "exec"
command = ["python3", "engine.py", "{input}"]
remote = false
env = { LANG = "C.UTF-8", _X1 = "y" }
allow_hosts = ["127.0.0.1"]
endpoint_host = "127.0.0.1"
deadline_s = 30
output_cap_bytes = 1024
parallelism = 2
zone = "eu"
[[derive.whisper.preprocess]]
when = "media_is_url"
command = ["python3", "fetch.py", "{input}", "{output}"]
output = "media.wav"
[[derive.whisper.preprocess]]
command = ["ffmpeg", "-i", "{input}", "{output}"]
output = "16k.wav"

[derive.preview]
driver = "fetch"
endpoint_host = "::1"
"""


def read(tmp_path: Path, text: str) -> tuple[dict[str, Binding], list[ContextfulError]]:
    path = tmp_path / MACHINE_FILE
    path.write_text(text)
    machine, problems = read_machine(path)
    assert machine.path == path
    return dict(machine.bindings), problems


def test_a_full_block_reads_into_its_binding(tmp_path: Path) -> None:
    bindings, problems = read(tmp_path, FULL)
    assert problems == []
    whisper = bindings["whisper"]
    assert whisper == Binding("whisper", "exec", ("python3", "engine.py", "{input}"), (
        Step("preprocess[0]", ("python3", "fetch.py", "{input}", "{output}"), "media_is_url", "media.wav"),
        Step("preprocess[1]", ("ffmpeg", "-i", "{input}", "{output}"), "always", "16k.wav")),
        {"LANG": "C.UTF-8", "_X1": "y"}, ("127.0.0.1",), "127.0.0.1", False, 30.0, 1024, 2, "eu")
    assert bindings["preview"].driver == "fetch" and bindings["preview"].endpoint_host == "::1"
    assert bindings["preview"].deadline_s == 300.0 and bindings["preview"].parallelism is None


def test_identity_leaves_out_the_bounds_and_the_zone(tmp_path: Path) -> None:
    bindings, _ = read(tmp_path, FULL)
    whisper = bindings["whisper"]
    identity = whisper.identity()
    assert set(identity) == {"engine", "driver", "command", "preprocess", "env", "allow_hosts", "endpoint_host",
                             "remote"}
    bounded = Binding(**{**whisper.__dict__, "deadline_s": 1.0, "output_cap_bytes": 7, "parallelism": 9,
                         "zone": "us"})
    assert bounded.identity() == identity
    assert Binding(**{**whisper.__dict__, "env": {"LANG": "C"}}).identity() != identity
    assert identity["preprocess"][0] == {"name": "preprocess[0]", "argv": ["python3", "fetch.py", "{input}",
                                                                           "{output}"],
                                         "when": "media_is_url", "output": "media.wav"}


def test_lookup_order_flag_then_environment_then_beside_the_project(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MACHINE_ENV, raising=False)
    assert machine_path(tmp_path) is None
    machine, problems = read_machine(None)
    assert machine.path is None and dict(machine.bindings) == {} and problems == []
    beside = tmp_path / MACHINE_FILE
    beside.write_text("")
    assert machine_path(tmp_path) == beside
    monkeypatch.setenv(MACHINE_ENV, str(tmp_path / "env.toml"))
    assert machine_path(tmp_path) == tmp_path / "env.toml"
    assert machine_path(tmp_path, str(tmp_path / "flag.toml")) == tmp_path / "flag.toml"
    _, problems = read_machine(tmp_path / "env.toml")  # named but missing: reported, never skipped
    assert [type(p) for p in problems] == [ProjectInvalid] and "env.toml" in str(problems[0])


def test_binding_for_names_the_default_file_when_none_was_found(tmp_path: Path) -> None:
    path = tmp_path / "machine.toml"
    path.write_text(FULL)
    machine, _ = read_machine(path)
    assert binding_for(machine, "talks", "whisper").engine == "whisper"
    with pytest.raises(DeriveEngineUnbound) as caught:
        binding_for(machine, "talks", "vosk")
    assert (caught.value.pipeline, caught.value.engine, caught.value.file, caught.value.bound) == (
        "talks", "vosk", str(path), ("preview", "whisper"))
    with pytest.raises(DeriveEngineUnbound) as caught:  # no file found: the default one beside the project
        binding_for(read_machine(None)[0], "talks", "vosk")
    assert MACHINE_FILE in caught.value.file and caught.value.bound == ()


@pytest.mark.clause("run.bind.unbound-engine")
def test_validate_and_run_name_the_pipeline_engine_file_and_every_bound_engine(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    project = DeriveProject(tmp_path)
    machine = tmp_path / MACHINE_FILE
    machine.write_text('[derive.zeta]\ncommand = ["/bin/true"]\n[derive.other]\ncommand = ["/bin/true"]\n')
    project.parents([{"id": "a", "path": project.media("a.txt", "x")}])
    checked = contextful(tmp_path, "--json", "pipeline", "validate", check=False)
    assert checked.returncode == 3
    [problem] = json.loads(checked.stdout)["problems"]
    assert problem["error"] == "DeriveEngineUnbound"
    for named in ("pipeline 'passages'", "engine 'lines'", "[derive.lines]", f"add one to {machine}",
                  "bound engines: other, zeta;"):
        assert named in problem["detail"], problem["detail"]
    machine.unlink()  # none found: the file to create, beside the manifest, and no bound engine
    for args in (("pipeline", "validate"), ("pipeline", "run")):
        ran = contextful(tmp_path, *args, check=False)
        assert ran.returncode == 3 and "error: DeriveEngineUnbound:" in ran.stderr, ran.stderr
        assert f"add one to {MACHINE_FILE} beside contextful.toml" in ran.stderr
        assert "bound engines: none;" in ran.stderr and "'passages'" in ran.stderr
    assert not (tmp_path / ".contextful" / "store").exists()  # nothing ran, not even the parents' landing
    assert project.engine_calls() == []


CARRYING = """
preprocess = [{ command = ["/bin/cp", "{input}", "{output}"], output = "x" }]
env = { PATH = "/usr/bin" }
allow_hosts = ["example.org"]
command = ["/bin/true", "{input}"]
options = { steps = [{ command = "sh -c x" }] }
"""
"""Binding keys a pipeline's source config must not carry, one nested inside another key."""


@pytest.mark.clause("run.bind.command-in-manifest")
def test_validate_and_run_refuse_binding_keys_in_the_pipeline_config_wherever_they_sit(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    clean = DeriveProject(tmp_path / "clean")
    assert json.loads(contextful(clean.root, "--json", "pipeline", "validate").stdout)["ok"] is True
    project = DeriveProject(tmp_path / "carrying", extra=CARRYING)
    project.parents([{"id": "a", "path": project.media("a.txt", "x")}])
    checked = contextful(project.root, "--json", "pipeline", "validate", check=False)
    assert checked.returncode == 3
    problems = json.loads(checked.stdout)["problems"]
    carried = [p["detail"] for p in problems if p["error"] == "DeriveCommandInManifest"]
    assert len(carried) == 5, problems
    for detail, key in zip(carried, ("preprocess", "env", "allow_hosts", "command", "options.steps[0].command"),
                           strict=True):
        assert detail.startswith(f"pipeline 'passages': [pipeline.source.config] holds {key!r}"), detail
        assert "machine configuration" in detail
    ran = contextful(project.root, "pipeline", "run", check=False)
    assert ran.returncode == 3 and "DeriveCommandInManifest" in ran.stderr
    assert not (project.root / ".contextful" / "store").exists() and project.engine_calls() == []


MACHINE_DRIVERS = """
[derive.copy]
driver = "none"
[[derive.copy.preprocess]]
command = ["/bin/cp", "{input}", "{output}"]
output = "out.ndjson"

[derive.preview]
driver = "fetch"
endpoint_host = "127.0.0.1"
allow_hosts = ["127.0.0.1"]
"""


def _host(pipeline_id: str, task: str, engine: str | None = None) -> str:
    """A pipeline running the embedding program's host task ``task`` (tables ``<task>_done``, ``<task>``)."""
    return derive_pipeline(pipeline_id, "docs", task=task, engine=engine, table=f"{task}_done",
                           config=f'tables = ["{task}_done", "{task}"]')


@pytest.mark.clause("run.bind.driver-mismatch")
def test_validate_and_run_refuse_a_task_behind_another_driver_and_a_host_task_naming_an_engine(
        tmp_path: Path) -> None:
    good = (HEADER + files_pipeline("docs")
            + derive_pipeline("talks_exec", "docs", engine="lines", media_column="path")
            + derive_pipeline("talks_none", "docs", engine="copy", media_column="path")
            + derive_pipeline("links_fetch", "docs", task="link_preview", engine="preview", media_column="path")
            + _host("pages_plain", "pages"))
    project = DeriveProject(tmp_path / "good", manifest=good)
    project.write_machine(extra=MACHINE_DRIVERS)
    checked = project.embedded(["pages"], "--json", "pipeline", "validate")
    assert json.loads(checked.stdout)["ok"] is True

    bad = (HEADER + files_pipeline("docs")
           + derive_pipeline("talks_fetch", "docs", engine="preview", media_column="path")
           + derive_pipeline("links_exec", "docs", task="link_preview", engine="lines", media_column="path")
           + derive_pipeline("links_none", "docs", task="link_preview", engine="copy", media_column="path")
           + _host("pages_bound", "pages", engine="lines")         # a host task naming a bound engine
           + _host("notes_unbound", "notes", engine="nowhere"))    # ... or one this machine does not bind
    project = DeriveProject(tmp_path / "bad", manifest=bad)
    project.write_machine(extra=MACHINE_DRIVERS)
    project.parents([{"id": "a", "path": project.media("a.txt", "x"), "body": "x|y"}])
    checked = project.embedded(["pages", "notes"], "--json", "pipeline", "validate", check=False)
    assert checked.returncode == 3, checked.stderr
    problems = json.loads(checked.stdout)["problems"]
    assert [p["error"] for p in problems] == ["DeriveDriverMismatch"] * 5
    details = [p["detail"] for p in problems]
    for (pipeline, task, driver), detail in zip([("talks_fetch", "transcribe", "fetch"),
                                                 ("links_exec", "link_preview", "exec"),
                                                 ("links_none", "link_preview", "none"),
                                                 ("pages_bound", "pages", "exec"),
                                                 ("notes_unbound", "notes", "an unbound engine")], details,
                                                strict=True):
        assert f"pipeline {pipeline!r}: task {task!r} cannot run behind {driver};" in detail
    assert "names no engine: remove engine = 'lines'" in details[3]
    assert "names no engine: remove engine = 'nowhere'" in details[4]
    for ids in (["pages_bound"], ["notes_unbound"], []):  # the run refuses before anything lands
        ran = project.embedded(["pages", "notes"], "pipeline", "run", *ids, check=False)
        assert ran.returncode == 3 and "error: DeriveDriverMismatch:" in ran.stderr, ran.stderr
        assert not (project.root / ".contextful" / "store").exists()
    assert project.engine_calls() == []


@pytest.mark.clause("run.bind.endpoint-host-bare")
@pytest.mark.parametrize(("value", "part"), [("http://example.org", "scheme"), ("example.org:8080", "port"),
                                             ("[::1]:80", "port"), ("example.org/api", "path"),
                                             ("example.org?x=1", "query"), ("https://h:1/p?q", "scheme")])
def test_an_endpoint_host_must_be_bare(tmp_path: Path, value: str, part: str) -> None:
    bindings, problems = read(tmp_path, f'[derive.preview]\ndriver = "fetch"\nendpoint_host = "{value}"\n')
    [error] = problems
    assert isinstance(error, DeriveEndpointHostNotBare)
    assert (error.engine, error.value, error.part) == ("preview", value, part)
    assert bindings == {}


@pytest.mark.clause("run.bind.endpoint-host-bare")
def test_validate_and_run_name_every_endpoint_host_that_is_not_bare(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    project = DeriveProject(tmp_path)
    project.write_machine(extra='[derive.a]\ndriver = "fetch"\nendpoint_host = "https://example.org"\n'
                                '[derive.b]\ndriver = "fetch"\nendpoint_host = "example.org:8080"\n'
                                '[derive.c]\ndriver = "fetch"\nendpoint_host = "example.org/api?x=1"\n')
    checked = contextful(tmp_path, "--json", "pipeline", "validate", check=False)
    assert checked.returncode == 3
    problems = json.loads(checked.stdout)["problems"]
    assert [(p["error"], p["detail"].split(" endpoint_host")[0]) for p in problems] == [
        ("DeriveEndpointHostNotBare", "[derive.a]"), ("DeriveEndpointHostNotBare", "[derive.b]"),
        ("DeriveEndpointHostNotBare", "[derive.c]")]
    assert [p["detail"].split("carries a ")[1].split(";")[0] for p in problems] == ["scheme", "port", "path"]
    ran = contextful(tmp_path, "pipeline", "run", check=False)
    assert ran.returncode == 3 and "DeriveEndpointHostNotBare" in ran.stderr
    assert not (tmp_path / ".contextful" / "store").exists()


def test_bare_hosts_pass(tmp_path: Path) -> None:
    for host in ("example.org", "127.0.0.1", "::1", "[::1]", "my_host-1.local"):
        bindings, problems = read(tmp_path, f'[derive.p]\ndriver = "fetch"\nendpoint_host = "{host}"\n')
        assert problems == [] and bindings["p"].endpoint_host == host


@pytest.mark.clause("run.exec.shell-command")
def test_a_string_command_is_refused_in_the_engine_and_in_a_step(tmp_path: Path) -> None:
    bindings, problems = read(tmp_path, """
[derive.e]
command = "python3 engine.py {input} | tee out"
[[derive.e.preprocess]]
command = "ffmpeg -i {input} {output}"
output = "a.wav"
""")
    assert [(type(p), p.engine, p.step) for p in problems if isinstance(p, DeriveShellCommand)] == [
        (DeriveShellCommand, "e", "command"), (DeriveShellCommand, "e", "preprocess[0]")]
    assert len(problems) == 2 and bindings == {}


@pytest.mark.clause("run.exec.env-name")
def test_environment_names_are_ascii_words_not_leading_with_a_digit(tmp_path: Path) -> None:
    bindings, problems = read(tmp_path, """
[derive.e]
command = ["/bin/true"]
env = { GOOD_1 = "x", "1LEADING" = "x", "HAS-DASH" = "x", "HAS SPACE" = "x", "ÜNICODE" = "x", "A=B" = "x", "" = "x" }
""")
    assert [p.env_name for p in problems if isinstance(p, DeriveEnvNameInvalid)] == [
        "1LEADING", "HAS-DASH", "HAS SPACE", "ÜNICODE", "A=B", ""]
    assert len(problems) == 6 and bindings == {}


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    _, problems = read(tmp_path, """
colour = "blue"
[derive.e]
driver = "shell"
command = ["python3", "e.py", "{output}"]
remote = "yes"
env = { A = 1 }
allow_hosts = "h"
deadline_s = 0
output_cap_bytes = 1.5
parallelism = 0
zone = ""
timeout = 3
[[derive.e.preprocess]]
when = "sometimes"
command = []
output = "../x"
shell = true
[[derive.e.preprocess]]
command = ["a"]
output = "same"
[[derive.e.preprocess]]
command = ["b"]
output = "same"
[derive.n]
driver = "none"
command = ["x"]
[derive.i]
command = ["/bin/true"]
deadline_s = inf
""")
    named = sorted((type(p).__name__, p.fields.get("block"), p.fields.get("key")) for p in problems)
    assert named == sorted([
        ("ManifestKeyUnknown", "the machine configuration", "colour"),
        ("ManifestKeyUnknown", "[derive.e]", "timeout"),
        ("ManifestKeyUnknown", "[derive.e].preprocess[0]", "shell"),
        ("ManifestValueInvalid", "[derive.e]", "driver"),
        ("ManifestValueInvalid", "[derive.e]", "command"),  # {output} in the engine step
        ("ManifestValueInvalid", "[derive.e]", "command"),  # driver 'shell' runs no engine command
        ("ManifestValueInvalid", "[derive.e]", "remote"),
        ("ManifestValueInvalid", "[derive.e]", "env.A"),
        ("ManifestValueInvalid", "[derive.e]", "allow_hosts"),
        ("ManifestValueInvalid", "[derive.e]", "deadline_s"),
        ("ManifestValueInvalid", "[derive.e]", "output_cap_bytes"),
        ("ManifestValueInvalid", "[derive.e]", "parallelism"),
        ("ManifestValueInvalid", "[derive.e]", "zone"),
        ("ManifestValueInvalid", "[derive.e].preprocess[0]", "when"),
        ("ManifestValueInvalid", "[derive.e].preprocess[0]", "command"),
        ("ManifestValueInvalid", "[derive.e].preprocess[0]", "output"),
        ("ManifestValueInvalid", "[derive.e].preprocess[2]", "output"),
        ("ManifestValueInvalid", "[derive.n]", "command"),
        ("ManifestValueInvalid", "[derive.n]", "preprocess"),
        ("ManifestValueInvalid", "[derive.i]", "deadline_s"),
    ])
    assert all(isinstance(p, ManifestKeyUnknown | ManifestValueInvalid) for p in problems)


def test_unreadable_toml_is_named(tmp_path: Path) -> None:
    _, problems = read(tmp_path, "[derive.e\ncommand = [")
    [error] = problems
    assert isinstance(error, ProjectInvalid) and MACHINE_FILE in str(error)
