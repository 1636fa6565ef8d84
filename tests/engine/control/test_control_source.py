"""The configured control source (``[control] snapshot_dir`` or ``url``) and ``serve --cycle``
refusing one that does not resolve (``surface.fire.cycle-control-source``; docs/control.md).

Every cycle is a real ``contextful`` child process; control URLs are real loopback servers.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.storage.errors import ManifestInvalid, ManifestValueInvalid

from tests.engine.control.scenario import ControlProject, files_pipeline
from tests.support.http_api import JsonApi, Reply

UNRESOLVED = "error: CycleControlSourceUnresolved: control source"


def _cycle(project: ControlProject) -> tuple[int, str]:
    proc = project.cli("pipeline", "serve", "--cycle", check=False)
    return proc.returncode, proc.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.clause("surface.fire.cycle-control-source")
def test_a_cycle_refuses_a_configured_snapshot_directory_that_does_not_exist(tmp_path: Path) -> None:
    project = ControlProject(tmp_path / "p")
    project.write(files_pipeline("orders"), control='snapshot_dir = "ops/versions"')
    project.rows("orders", 2)
    code, err = _cycle(project)
    assert code == 3, err
    assert UNRESOLVED in err and "snapshot_dir 'ops/versions'" in err
    assert f"no directory {(project.root / 'ops' / 'versions').resolve()} exists" in err
    assert not (project.root / ".contextful" / "store").exists()  # nothing armed, nothing fired
    # once an import claims v1 there, the directory resolves and the cycle fires
    project.imported()
    proc, answer = project.cycle()
    assert proc.returncode == 0, proc.stderr
    assert answer["fired"] == ["orders"] and project.count("orders") == 2


@pytest.mark.clause("surface.fire.cycle-control-source")
def test_a_cycle_refuses_a_control_url_whose_host_is_not_loopback(tmp_path: Path) -> None:
    project = ControlProject(tmp_path / "p")
    project.write(files_pipeline("orders"), control='url = "http://192.0.2.7:8787/control"')
    project.imported()
    code, err = _cycle(project)
    assert code == 3, err
    assert f"{UNRESOLVED} [control] url 'http://192.0.2.7:8787/control'" in err
    assert "its host '192.0.2.7' is not a loopback address" in err
    assert not (project.root / ".contextful" / "store").exists()


@pytest.mark.clause("surface.fire.cycle-control-source")
def test_a_cycle_refuses_a_loopback_control_url_that_does_not_answer(tmp_path: Path) -> None:
    project = ControlProject(tmp_path / "p")
    url = f"http://127.0.0.1:{_closed_port()}/control"
    project.write(files_pipeline("orders"), control=f'url = "{url}"')
    project.imported()
    code, err = _cycle(project)
    assert code == 3, err
    assert f"{UNRESOLVED} [control] url '{url}': it does not answer" in err
    assert not (project.root / ".contextful" / "store").exists()


@pytest.mark.clause("surface.fire.cycle-control-source")
def test_a_control_url_resolves_when_its_pointer_answers_and_not_when_it_fails(tmp_path: Path) -> None:
    status = {"code": 200}
    with JsonApi() as api:
        api.route("/control/manifest@current", lambda _request: Reply(status["code"], "1"))
        project = ControlProject(tmp_path / "p")
        project.write(files_pipeline("orders"), control=f'url = "{api.url}/control/"')
        project.rows("orders", 1)
        project.imported()
        proc, answer = project.cycle()  # resolved: the cycle runs the snapshot directory's applied version
        assert proc.returncode == 0, proc.stderr
        assert answer["fired"] == ["orders"]
        # resolved, then polled once (the URL's head is the node's own v1: nothing to adopt)
        assert [r.path for r in api.requests] == ["/control/manifest@current"] * 2
        status["code"] = 503
        code, err = _cycle(project)
        assert code == 3 and "its pointer manifest@current answered HTTP 503" in err, err


def test_the_default_snapshot_directory_is_no_configured_source(tmp_path: Path) -> None:
    project = ControlProject(tmp_path / "p")
    project.write(files_pipeline("orders"))
    code, err = _cycle(project)
    assert code == 5 and "error: StoreNotInitialized:" in err, err


def test_control_url_is_read_beside_no_snapshot_dir(tmp_path: Path) -> None:
    root = tmp_path / "p"
    project = ControlProject(root)
    project.write(files_pipeline("orders"), control='url = "http://127.0.0.1:8787/control/"')
    control = load_manifest(root).control
    assert control.url == control.source == "http://127.0.0.1:8787/control"
    assert control.snapshot_dir == str(root / ".contextful" / "control" / "ctl")
    project.write(files_pipeline("orders"), control='url = "ftp://127.0.0.1/x"\nsnapshot_dir = "v"')
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(root)
    problems = [p for p in info.value.problems if isinstance(p, ManifestValueInvalid)]
    assert [(p.block, p.key) for p in problems] == [("[control]", "url")]
    assert "ftp://127.0.0.1/x" in str(problems[0])
    project.write(files_pipeline("orders"), control='url = "http://127.0.0.1:1/c"\nsnapshot_dir = "v"')
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(root)
    [problem] = info.value.problems
    assert isinstance(problem, ManifestValueInvalid) and "name one of them" in str(problem)
