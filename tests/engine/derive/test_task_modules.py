"""Registration modules: ``[project] modules`` and ``contextful.tasks`` entry points make a host task
(and a body) known to every command, to ``pipeline serve`` and to its unit children.

Every command runs as a user runs it: ``contextful`` in a child process over a real project whose
``shop/tasks.py`` registers the task; nothing registers it in the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.control.scenario import ControlProject
from tests.engine.derive.project import derive_pipeline, files_pipeline
from tests.support.cli import contextful_in

TASKS = '''
import contextful


@contextful.register_task("{name}", task_version="1", marker_table="{name}_done", content_tables=["{name}"],
                          columns=["body"])
def split(unit):
    return {{"{name}": [{{"text": part}} for part in unit.parent["body"].split("|") if part]}}
'''

BODY_MODULE = '''
import contextful
from contextful.engine.run.bodies import register_body


def shout(text):
    return text.upper()


register_body("shout_body", shout, prompts={"system": "be loud"})
'''

DOCS = [{"id": 1, "body": "a|b|c"}, {"id": 2, "body": "d"}, {"id": 3, "body": "e|f"}]


def _expected(rows: list[dict]) -> list[tuple[str, str]]:
    """The oracle: each body split on ``|`` in plain Python, by the unit's id."""
    return sorted((str(r["id"]), part) for r in rows for part in r["body"].split("|") if part)


def derive(task: str) -> str:
    return derive_pipeline(task, "docs", task=task, table=f"{task}_done", config=f'tables = ["{task}_done", "{task}"]')


def project(root: Path, *, modules: str | None = '["shop.tasks"]', tasks: str = TASKS.format(name="chunks"),
            pipelines: str | None = None, extra: str = "") -> Path:
    """A project: ``docs`` landed from parents/*.ndjson, ``chunks`` derived by the host task that
    ``shop/tasks.py`` registers, named by ``[project] modules``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "shop").mkdir(exist_ok=True)
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "tasks.py").write_text(tasks)
    (root / "parents").mkdir(exist_ok=True)
    (root / "parents" / "a.ndjson").write_text("".join(json.dumps(r) + "\n" for r in DOCS))
    head = '[project]\nname = "shop"\n' + (f"modules = {modules}\n" if modules is not None else "")
    body = pipelines if pipelines is not None else files_pipeline("docs") + derive("chunks")
    (root / "contextful.toml").write_text(head + body + extra)
    return root


def cli(root: Path, *args: str, check: bool = True, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``contextful --project ROOT ARGS...`` from another directory (the project's modules are found
    beside its manifest, not through the working directory)."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(pythonpath or ""), os.environ.get("PYTHONPATH", "")) if p)}
    return contextful_in(root.parent, "--project", str(root), *args, env=env, check=check)


def chunks(root: Path, table: str = "chunks") -> list[tuple[str, str]]:
    from contextful.engine.project import open_project_store
    from contextful.engine.read import connect

    with open_project_store(root) as store:
        con = connect(store)
        try:
            sql = f"SELECT CAST(unit_ref AS VARCHAR), text FROM \"{table}\" WHERE kind = 'passage'"
            return sorted(con.execute(sql).fetchall())
        finally:
            con.close()


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.clause("run.bind.host-task")
def test_every_command_imports_the_modules_the_project_names(tmp_path: Path) -> None:
    root = project(tmp_path / "shop-project",
                   extra='\n[[model]]\nname = "chunk_counts"\nsql = "SELECT count(*) AS n FROM chunks"\n'
                         '\n[[export]]\nname = "chunks_out"\nsource = "chunks"\nnamespace = "bi"\n'
                         'credential = "analysts"\n')
    assert cli(root, "pipeline", "validate").returncode == 0
    ran = cli(root, "pipeline", "run", "docs")
    assert "chunks" in ran.stdout, ran.stdout
    assert chunks(root) == _expected(DOCS)
    cli(root, "build", "run")
    from contextful.engine.project import open_project_store
    from contextful.engine.read import connect

    with open_project_store(root) as store:
        con = connect(store)
        try:
            assert con.execute("SELECT n FROM chunk_counts").fetchall() == [(len(_expected(DOCS)),)]
        finally:
            con.close()
    exported = cli(root, "--json", "export", "run")
    assert exported.returncode == 0, exported.stderr
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("contextful", uri=f"sqlite:///{root / '.contextful/iceberg/catalog.sqlite'}",
                         warehouse=(root / ".contextful/iceberg/warehouse").as_uri())
    table = catalog.load_table("bi.chunks_out").scan(row_filter="kind == 'passage'").to_arrow()
    assert sorted(zip(map(str, table["unit_ref"].to_pylist()), table["text"].to_pylist(), strict=True)) == \
        _expected(DOCS)


@pytest.mark.clause("run.bind.unknown-task")
def test_an_unknown_task_names_the_modules_searched_and_is_one_error(tmp_path: Path) -> None:
    root = project(tmp_path / "p", pipelines=files_pipeline("docs") + derive("missing"))
    site = _dist(tmp_path / "site", "shopep", {"other": "shopep_tasks"},
                 {"shopep_tasks": TASKS.format(name="other")})
    for args in (("pipeline", "validate"), ("pipeline", "run", "docs"), ("build", "run"), ("export", "run")):
        proc = cli(root, *args, check=False, pythonpath=site)
        assert proc.returncode != 0, args
        text = proc.stderr
        assert "DeriveUnknownTask" in text and "task 'missing'" in text, (args, text)
        assert "[project] modules imported: shop.tasks" in text, text
        assert "contextful.tasks entry points: other = shopep_tasks" in text, text
        assert "registered: chunks, other" in text and "only a host task declares tables" not in text, text
        assert len(error_lines(proc)) == 1, text


def test_a_module_that_fails_to_import_is_its_own_error(tmp_path: Path) -> None:
    root = project(tmp_path / "p", tasks="import shop.nothere\n" + TASKS.format(name="chunks"))
    proc = cli(root, "pipeline", "run", "docs", check=False)
    assert proc.returncode != 0
    text = proc.stderr
    assert "ProjectModuleUnimportable" in text and "module 'shop.tasks' ([project] modules)" in text, text
    assert "ModuleNotFoundError: No module named 'shop.nothere'" in text, text
    assert "DeriveUnknownTask" not in text and "only a host task declares tables" not in text, text
    assert len(error_lines(proc)) == 1, text
    # a module that does not exist at all: named the same way
    missing = project(tmp_path / "q", modules='["shop.tasks", "nosuch.tasks"]')
    proc = cli(missing, "pipeline", "validate", check=False)
    assert "ProjectModuleUnimportable" in proc.stderr and "module 'nosuch.tasks'" in proc.stderr, proc.stderr
    assert "No module named 'nosuch'" in proc.stderr and len(error_lines(proc)) == 1, proc.stderr
    # a value that names no module is refused as a value
    wrong = project(tmp_path / "r", modules='"shop.tasks"')
    proc = cli(wrong, "pipeline", "validate", check=False)
    assert "ManifestValueInvalid" in proc.stderr and "modules" in proc.stderr, proc.stderr


def _dist(site: Path, dist: str, entries: dict[str, str], modules: dict[str, str]) -> Path:
    """An installed distribution on ``site`` (a dist-info with entry_points.txt, as pip writes one)."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[contextful.tasks]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    for name, text in modules.items():
        (site / f"{name}.py").write_text(text)
    return site


@pytest.mark.clause("run.bind.host-task")
def test_installed_packages_register_through_entry_points(tmp_path: Path) -> None:
    # one entry point names a module (its import registers), one a registration function (called)
    site = _dist(tmp_path / "site", "shopdist", {"pieces": "shopdist_pieces", "bits": "shopdist_bits:register"},
                 {"shopdist_pieces": TASKS.format(name="pieces"),
                  "shopdist_bits": "def register():\n" + "\n".join(
                      "    " + line for line in TASKS.format(name="bits").splitlines())})
    root = project(tmp_path / "p", modules=None,
                   pipelines=files_pipeline("docs") + derive("pieces") + derive("bits"))
    assert cli(root, "pipeline", "validate", pythonpath=site).returncode == 0
    cli(root, "pipeline", "run", "docs", pythonpath=site)
    assert chunks(root, "pieces") == _expected(DOCS) and chunks(root, "bits") == _expected(DOCS)
    # without the package installed, the task is unknown: the entry points are where it came from
    proc = cli(root, "pipeline", "validate", check=False)
    assert "DeriveUnknownTask" in proc.stderr and "entry points: none" in proc.stderr, proc.stderr


def test_an_entry_point_that_fails_to_load_is_named(tmp_path: Path) -> None:
    site = _dist(tmp_path / "site", "brokendist", {"broken": "brokendist_tasks"},
                 {"brokendist_tasks": "raise RuntimeError('no licence key')\n"})
    root = project(tmp_path / "p", modules=None, pipelines=files_pipeline("docs") + derive("broken"))
    proc = cli(root, "pipeline", "validate", check=False, pythonpath=site)
    assert "ProjectModuleUnimportable" in proc.stderr, proc.stderr
    assert "entry point 'broken' (contextful.tasks)" in proc.stderr and "RuntimeError: no licence key" in proc.stderr
    assert "DeriveUnknownTask" not in proc.stderr and len(error_lines(proc)) == 1, proc.stderr


@pytest.mark.clause("run.bind.host-task")
def test_serve_children_import_the_modules_the_applied_version_names(tmp_path: Path) -> None:
    control = ControlProject(tmp_path / "p", name="shop")
    root = project(control.root, pipelines=files_pipeline("docs").replace(
        'primary_key = ["id"]', 'primary_key = ["id"]\nschedule = "every 1h"') + derive("chunks"))
    control.imported()
    proc, answer = control.cycle()
    assert proc.returncode == 0, proc.stderr
    assert answer["failed"] == [] and "docs" in answer["fired"], answer
    assert chunks(root) == _expected(DOCS)


def test_bodies_register_through_the_same_modules(tmp_path: Path) -> None:
    from contextful.engine.run.bodies import BODIES
    from contextful.storage.errors import BodyUnregistered

    import contextful

    root = project(tmp_path / "p", modules='["shop.tasks", "shop_bodies_mod"]',
                   tasks=TASKS.format(name="bodychunks"), pipelines=files_pipeline("docs") + derive("bodychunks"))
    (root / "shop_bodies_mod.py").write_text(BODY_MODULE)
    try:
        with contextful.open_project(root):
            body = BODIES.get("shout_body")
            assert body.fn("hey") == "HEY"
            with pytest.raises(BodyUnregistered) as unknown:
                BODIES.get("whisper_body")
            assert "shop_bodies_mod" in str(unknown.value) and unknown.value.modules == ("shop.tasks", "shop_bodies_mod")
    finally:
        from contextful.engine.derive.tasks import unregister_task

        unregister_task("bodychunks")
        BODIES._bodies.pop("shout_body", None)
        for name in [m for m in sys.modules if m in ("shop", "shop.tasks", "shop_bodies_mod")]:
            del sys.modules[name]
        if str(root) in sys.path:
            sys.path.remove(str(root))
