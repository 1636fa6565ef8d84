"""Applied versions of the manifest: ``contextful pipeline import | apply | versions`` (surface.apply.*).

Through the command (a real child process) and the public functions of ``engine.control.apply``;
what lands is read back from the snapshot directory itself (``manifest@v<N>.toml``,
``manifest@current``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.control.apply import MARKER, apply_manifest, import_manifest, load_applied, versions
from contextful.storage.errors import (
    ApplyValidationRefused,
    ConditionalWriteUnsupported,
    ControlPointerMalformed,
    ControlSnapshotUnreadable,
)

from tests.support.cli import contextful, contextful_in
from tests.support.s3_server import CREDENTIALS, S3Server

BASE = """\
[project]
name = "shop"

[[pipeline]]
id = "events"
source = { kind = "files", config = { paths = ["raw/*.ndjson"] } }

[[model]]
name = "counts"
sql = "SELECT count(*) AS n FROM events"
"""

EXTERNAL = """
[[external]]
id = "crm"
table = "crm_accounts"
description = "the nightly CRM export script"
"""

SECOND_PIPELINE = """
[[pipeline]]
id = "orders"
source = { kind = "files", config = { paths = ["raw/orders/*.ndjson"] } }
"""


def make_project(path: Path, text: str = BASE) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "contextful.toml").write_text(text)
    return path


def default_dir(project: Path, name: str = "shop") -> Path:
    return project / ".contextful" / "control" / name


def held(snapshots: Path) -> dict[str, str]:
    """Every file of the snapshot directory the layout names, by name, with its text (a version's
    document: the text before its ``[snapshot]`` table)."""
    return {p.name: p.read_text().split(MARKER)[0] for p in sorted(snapshots.iterdir())
            if p.name.startswith("manifest@")}


def one_error(proc: Any, name: str, code: int) -> str:
    assert proc.returncode == code, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {name}: "), line
    return str(line)


# --- surface.apply.local-claim ------------------------------------------------------------------


@pytest.mark.clause("surface.apply.local-claim")
def test_import_and_apply_claim_versions_in_the_default_snapshot_directory(tmp_path: Path) -> None:
    project = make_project(tmp_path / "shop-checkout")
    assert contextful(project, "pipeline", "import").stdout == "claimed v1 (applied)\n"
    snapshots = default_dir(project)
    assert held(snapshots) == {"manifest@current": "1\n", "manifest@v1.toml": BASE}
    (project / "contextful.toml").write_text(BASE + SECOND_PIPELINE)
    out = json.loads(contextful(project, "--json", "pipeline", "apply").stdout)
    assert out == {"verb": "apply", "version": 2, "claimed": True, "previous": 1, "conflicts": 0, "adopted": False,
                   "snapshot": str(snapshots / "manifest@v2.toml"), "warnings": []}
    assert held(snapshots) == {"manifest@current": "2\n", "manifest@v1.toml": BASE,
                               "manifest@v2.toml": BASE + SECOND_PIPELINE}
    applied = load_applied(project)
    assert applied is not None and applied.version == 2 and applied.path == snapshots / "manifest@v2.toml"
    assert [p.id for p in applied.manifest.pipelines] == ["events", "orders"]
    assert applied.manifest.root == project and applied.manifest.control.snapshot_dir == str(snapshots)
    listed = json.loads(contextful(project, "--json", "pipeline", "versions").stdout)
    assert [(v["version"], v["applied"]) for v in listed] == [(1, False), (2, True)]
    text = contextful(project, "pipeline", "versions").stdout.splitlines()
    assert text[0].split() == ["version", "claimed_at", "applied"]
    assert text[2].split()[0] == "v1" and text[2].split()[2:] == []
    assert text[3].split()[0] == "v2" and text[3].split()[2:] == ["applied"]


@pytest.mark.clause("surface.apply.local-claim")
def test_control_snapshot_dir_names_where_versions_are_claimed(tmp_path: Path) -> None:
    text = BASE.replace('name = "shop"\n', 'name = "shop"\n\n[control]\nsnapshot_dir = "ops/versions"\npool = 2\n')
    project = make_project(tmp_path / "p", text)
    contextful(project, "pipeline", "import")
    assert held(project / "ops" / "versions") == {"manifest@current": "1\n", "manifest@v1.toml": text}
    assert not (project / ".contextful" / "control").exists()
    edited = text.replace("pool = 2", "pool = 3")
    (project / "contextful.toml").write_text(edited)
    assert contextful(project, "pipeline", "apply").stdout == "claimed v2 (applied)\n"
    assert held(project / "ops" / "versions")["manifest@v2.toml"] == edited
    applied = load_applied(project)
    assert applied is not None and applied.manifest.control.pool == 3


# --- surface.apply.guarded-import ---------------------------------------------------------------


@pytest.mark.clause("surface.apply.guarded-import")
def test_an_import_over_a_held_version_claims_nothing_names_it_and_exits_zero(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    contextful(project, "pipeline", "import")
    (project / "contextful.toml").write_text(BASE + SECOND_PIPELINE)  # an edit import must not claim
    again = contextful(project, "pipeline", "import")
    assert again.returncode == 0 and again.stdout == "v1 is applied already; import claims nothing\n"
    assert json.loads(contextful(project, "--json", "pipeline", "import").stdout)["claimed"] is False
    assert held(default_dir(project)) == {"manifest@current": "1\n", "manifest@v1.toml": BASE}
    (project / "contextful.toml").write_text(BASE)  # the warm restart: import, then apply of what is applied
    assert contextful(project, "pipeline", "apply").stdout == "unchanged: v1 is applied\n"
    assert held(default_dir(project)) == {"manifest@current": "1\n", "manifest@v1.toml": BASE}


def test_a_document_that_parses_the_same_is_unchanged_and_one_that_differs_is_claimed(tmp_path: Path) -> None:
    """The rule docs/control.md states: "unchanged" is the parsed documents being equal, whatever
    their comments, spacing, key order or table spelling; checked against tomllib as the oracle."""
    project = make_project(tmp_path / "p", BASE + EXTERNAL)
    import_manifest(project)
    respelled = ('# the shop\n[[external]]\ndescription = "the nightly CRM export script"\n'
                 'table = "crm_accounts"\nid = "crm"\n\n'
                 '[project]\nname = "shop"   # same name\n\n'
                 '[[pipeline]]\nid = "events"\n[pipeline.source]\nkind = "files"\n'
                 '[pipeline.source.config]\npaths = [ "raw/*.ndjson" ]\n\n'
                 "[[model]]\nname = 'counts'\nsql = \"\"\"SELECT count(*) AS n FROM events\"\"\"\n")
    assert tomllib.loads(respelled) == tomllib.loads(BASE + EXTERNAL)  # the oracle: one document
    (project / "contextful.toml").write_text(respelled)
    outcome = apply_manifest(project)
    assert (outcome.version, outcome.claimed) == (1, False)
    changed = respelled.replace("nightly", "hourly")
    assert tomllib.loads(changed) != tomllib.loads(BASE + EXTERNAL)
    (project / "contextful.toml").write_text(changed)
    outcome = apply_manifest(project)
    assert (outcome.version, outcome.claimed) == (2, True)
    assert (default_dir(project) / "manifest@v2.toml").read_text().split(MARKER)[0] == changed  # the working text, comments kept


# --- surface.apply.uninitialized-store ----------------------------------------------------------


@pytest.mark.clause("surface.apply.uninitialized-store")
def test_apply_before_any_import_is_store_not_initialized(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    line = one_error(contextful(project, "pipeline", "apply", check=False), "StoreNotInitialized", 5)
    assert str(default_dir(project)) in line and "contextful pipeline import" in line
    assert not (project / ".contextful").exists()  # nothing created
    assert contextful(project, "pipeline", "versions").stdout.startswith("no version claimed yet")
    default_dir(project).mkdir(parents=True)  # an empty snapshot directory is as uninitialized
    one_error(contextful(project, "pipeline", "apply", "--pipelines-only", check=False), "StoreNotInitialized", 5)
    (project / "raw").mkdir()
    (project / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    contextful(project, "pipeline", "run")  # a store holding data has still taken no import
    one_error(contextful(project, "pipeline", "apply", check=False), "StoreNotInitialized", 5)
    assert list(default_dir(project).iterdir()) == []


# --- surface.apply.validation -------------------------------------------------------------------


@pytest.mark.clause("surface.apply.validation")
def test_a_document_failing_validation_is_refused_and_claims_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", BASE.replace('id = "events"', 'id = "events"\nnormalise = "nested"'))
    line = one_error(contextful(project, "pipeline", "import", check=False), "ApplyValidationRefused", 3)
    assert "no version claimed" in line and "ManifestKeyUnknown" in line and "'normalise'" in line
    assert not (project / ".contextful").exists()  # not even the snapshot directory
    (project / "contextful.toml").write_text(BASE)
    contextful(project, "pipeline", "import")
    for bad in (BASE.replace("FROM events", "FROM evnts"),  # a model reading a table nothing produces
                BASE + "[control]\npool = 0\n",  # a [control] value
                BASE + '[[external]]\nid = "events_feed"\ntable = "events"\n',  # an external a pipeline writes
                BASE + "[[pipeline]\n"):  # not TOML
        (project / "contextful.toml").write_text(bad)
        proc = contextful(project, "pipeline", "apply", check=False)
        line = one_error(proc, "ApplyValidationRefused", 3)
        assert held(default_dir(project)) == {"manifest@current": "1\n", "manifest@v1.toml": BASE}, line


def test_each_refusal_names_its_problem(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    import_manifest(project)
    cases = {BASE.replace("FROM events", "FROM evnts"): ("ModelInputUnknown", "'evnts'"),
             BASE + "[control]\npool = 0\n": ("ManifestValueInvalid", "[control].pool"),
             BASE + '[[external]]\nid = "feed"\ntable = "events"\n': ("TableNameCollision", "external 'feed'"),
             BASE + "[[pipeline]\n": ("ProjectInvalid", "not valid TOML")}
    for text, (name, named) in cases.items():
        (project / "contextful.toml").write_text(text)
        with pytest.raises(ApplyValidationRefused) as refused:
            apply_manifest(project)
        [problem] = refused.value.problems
        assert problem.name == name and named in str(problem)
        assert held(default_dir(project)) == {"manifest@current": "1\n", "manifest@v1.toml": BASE}


STORE_TABLE_MODEL = BASE + """
[[model]]
name = "joined"
sql = "SELECT * FROM events JOIN legacy USING (id)"
"""


@pytest.mark.clause("surface.apply.validation")
@pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres),
                                        pytest.param("s3", marks=pytest.mark.s3)])
def test_apply_validates_model_inputs_against_the_projects_store(tmp_path: Path, store_kind: str,
                                                                 request: pytest.FixtureRequest) -> None:
    """The store half of validation reads the project's store on each store configuration: a model
    reading a table only the store holds is refused until the store holds it."""
    env: dict[str, str] = {}
    text = BASE
    if store_kind == "postgres":
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        env = {"CONTEXTFUL_STORAGE_PROFILE": "postgres", "CONTEXTFUL_POSTGRES_DSN": dsn,
               "CONTEXTFUL_POSTGRES_SCHEMA": schema}
    elif store_kind == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        text = BASE.replace('name = "shop"\n', f'name = "shop"\nstore = "s3://{server.new_bucket()}/store"\n'
                                               'catalog = "catalog.sqlite"\n')
        env = {"CONTEXTFUL_S3_ENDPOINT_URL": server.endpoint, **CREDENTIALS}
    project = make_project(tmp_path / "p", text)
    contextful_in(project, "pipeline", "import", env=env)
    (project / "contextful.toml").write_text(text + STORE_TABLE_MODEL.removeprefix(BASE))
    refused = contextful_in(project, "pipeline", "apply", env=env, check=False)
    assert "ModelInputUnknown" in one_error(refused, "ApplyValidationRefused", 3)
    assert held(default_dir(project)) == {"manifest@current": "1\n", "manifest@v1.toml": text}
    (project / "legacy.csv").write_text("id,name\n1,a\n")
    contextful_in(project, "table", "load", "legacy", str(project / "legacy.csv"), env=env)
    assert contextful_in(project, "pipeline", "apply", env=env).stdout == "claimed v2 (applied)\n"
    applied = load_applied(project)
    assert applied is not None and [m.name for m in applied.manifest.models] == ["counts", "joined"]


# --- surface.apply.self-valid and surface.apply.external-snapshot --------------------------------


@pytest.mark.clause("surface.apply.self-valid")
def test_a_pipelines_only_apply_is_validated_against_its_own_pipelines(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", BASE + SECOND_PIPELINE)
    contextful(project, "pipeline", "import")
    # The working file drops the model too, but a pipelines-only apply keeps the applied model,
    # which reads the pipeline this edit removes: the snapshot would not be valid on its own.
    (project / "contextful.toml").write_text('[project]\nname = "shop"\n' + SECOND_PIPELINE)
    line = one_error(contextful(project, "pipeline", "apply", "--pipelines-only", check=False),
                     "ApplyValidationRefused", 3)
    assert "ModelInputUnknown" in line and "'counts' reads 'events'" in line
    assert sorted(held(default_dir(project))) == ["manifest@current", "manifest@v1.toml"]
    # A full apply of the same file is valid on its own (no model reads events any more).
    assert contextful(project, "pipeline", "apply").stdout == "claimed v2 (applied)\n"


@pytest.mark.clause("surface.apply.external-snapshot")
def test_externals_are_retained_by_import_and_full_apply_and_kept_by_pipelines_only(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", BASE + EXTERNAL)
    contextful(project, "pipeline", "import")
    assert tomllib.loads(held(default_dir(project))["manifest@v1.toml"])["external"] == [
        {"id": "crm", "table": "crm_accounts", "description": "the nightly CRM export script"}]
    second = BASE + EXTERNAL + '\n[[external]]\nid = "ledger"\n'
    (project / "contextful.toml").write_text(second)
    contextful(project, "pipeline", "apply")
    applied = load_applied(project)
    assert applied is not None
    assert [(e.id, e.table, e.description) for e in applied.manifest.externals] == [
        ("crm", "crm_accounts", "the nightly CRM export script"), ("ledger", "ledger", None)]
    # A pipelines-only apply from a file declaring no externals (and another model) keeps the applied ones.
    (project / "contextful.toml").write_text('[project]\nname = "shop"\n\n[[pipeline]]\nid = "events"\n'
                                             'source = { kind = "files", config = { paths = ["raw/*.ndjson"] } }\n'
                                             + SECOND_PIPELINE)
    assert contextful(project, "pipeline", "apply", "--pipelines-only").stdout == "claimed v3 (applied)\n"
    applied = load_applied(project)
    assert applied is not None and applied.version == 3
    assert [e.id for e in applied.manifest.externals] == ["crm", "ledger"]
    assert [p.id for p in applied.manifest.pipelines] == ["events", "orders"]
    assert [m.name for m in applied.manifest.models] == ["counts"]
    v3 = tomllib.loads(held(default_dir(project))["manifest@v3.toml"])
    assert v3 == {**tomllib.loads(second), "pipeline": tomllib.loads(BASE + SECOND_PIPELINE)["pipeline"]}
    # A model may read an external's table: it is declared produced (from outside Contextful).
    (project / "contextful.toml").write_text(second + '\n[[model]]\nname = "accounts"\nsql = "SELECT * FROM '
                                                      'crm_accounts"\n')
    assert contextful(project, "pipeline", "apply").stdout == "claimed v4 (applied)\n"


# --- surface.apply.weak-conditional-backend -----------------------------------------------------


@pytest.mark.clause("surface.apply.weak-conditional-backend")
@pytest.mark.s3
def test_a_snapshot_directory_at_a_url_is_refused_at_open(tmp_path: Path, s3_server: S3Server) -> None:
    env = {"CONTEXTFUL_S3_ENDPOINT_URL": s3_server.endpoint, **CREDENTIALS}
    bucket = s3_server.new_bucket()
    for url in (f"s3://{bucket}/control", "memory://control/shop"):
        project = make_project(tmp_path / url.split(":")[0],
                               BASE.replace('name = "shop"\n', f'name = "shop"\n\n[control]\nsnapshot_dir = "{url}"\n'))
        for words in (("import",), ("apply",), ("versions",)):
            line = one_error(contextful_in(project, "pipeline", *words, env=env, check=False),
                             "ConditionalWriteUnsupported", 1)
            assert url in line and "not linearizable" in line
        assert sorted(p.name for p in project.iterdir()) == ["contextful.toml"]
    import s3fs

    assert s3fs.S3FileSystem(**s3_server.storage_options).find(bucket) == []  # nothing written there


@pytest.mark.clause("surface.apply.weak-conditional-backend")
def test_a_filesystem_refusing_the_lock_is_refused_before_anything_is_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe: a filesystem answering flock with ENOLCK (NFS without a lock daemon) is refused
    by what it answers, not by its name. The filesystem's answer is the one thing simulated here."""
    project = make_project(tmp_path / "p")

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ConditionalWriteUnsupported) as refused:
        import_manifest(project)
    assert refused.value.backend == str(default_dir(project)) and "flock" in refused.value.reason
    assert held(default_dir(project)) == {}


# --- what readers of the snapshot directory refuse -----------------------------------------------


@pytest.mark.clause("surface.reconcile.pointer-malformed")
def test_a_pointer_that_is_not_wholly_a_version_is_malformed(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    import_manifest(project)
    (project / "contextful.toml").write_text(BASE + SECOND_PIPELINE)
    apply_manifest(project)
    pointer = default_dir(project) / "manifest@current"
    for body in ("2", "2\n"):  # a version, with or without its newline
        pointer.write_text(body)
        applied = load_applied(project)
        assert applied is not None and applied.version == 2
    for body in ("1x\n", " 2\n", "02\n", "2\n\n", "-2\n", "0\n", ""):
        pointer.write_text(body)
        line = one_error(contextful(project, "pipeline", "versions", check=False), "ControlPointerMalformed", 75)
        assert repr(body) in line
        with pytest.raises(ControlPointerMalformed):
            load_applied(project)
        one_error(contextful(project, "pipeline", "apply", check=False), "ControlPointerMalformed", 75)
    assert sorted(held(default_dir(project))) == ["manifest@current", "manifest@v1.toml", "manifest@v2.toml"]


def test_an_applied_version_that_is_gone_or_not_toml_is_unreadable(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    import_manifest(project)
    (default_dir(project) / "manifest@v1.toml").write_text("[[pipeline]\n")
    with pytest.raises(ControlSnapshotUnreadable) as unreadable:
        load_applied(project)
    assert unreadable.value.location == str(default_dir(project) / "manifest@v1.toml")
    (default_dir(project) / "manifest@v1.toml").unlink()
    line = one_error(contextful(project, "pipeline", "apply", check=False), "ControlSnapshotUnreadable", 75)
    assert "version 1 cannot be read" in line


# --- surface.apply.version-race -----------------------------------------------------------------


def shared_projects(tmp_path: Path, first: str, second: str) -> tuple[Path, Path, Path]:
    """Two checkouts of one project whose [control] snapshot_dir is one directory, imported from the first."""
    shared = tmp_path / "versions"
    control = f'\n[control]\nsnapshot_dir = "{shared}"\n'
    a = make_project(tmp_path / "a", BASE + control)
    import_manifest(a)
    (a / "contextful.toml").write_text(first + control)
    b = make_project(tmp_path / "b", second + control)
    return a, b, shared


def run_both(first: Any, second: Any) -> list[Any]:
    results: list[Any] = [None, None]

    def run(i: int, call: Any) -> None:
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


@pytest.mark.clause("surface.apply.version-race")
def test_the_loser_of_a_claim_reapplies_its_pipelines_onto_the_winner(tmp_path: Path) -> None:
    """Both applies read v1 and mean to claim v2; the full apply claims it first; the pipelines-only
    apply loses the claim, reloads v2 and claims v3: v2's edits with its own pipelines."""
    a_doc = BASE + EXTERNAL
    b_doc = BASE + SECOND_PIPELINE
    a, b, shared = shared_projects(tmp_path, a_doc, b_doc)
    both_read_v1 = threading.Barrier(2, timeout=60)
    a_applied = threading.Event()
    seen: dict[str, list[tuple[str, int]]] = {"a": [], "b": []}

    def a_step(what: str, version: int) -> None:
        seen["a"].append((what, version))
        if what == "claim":
            both_read_v1.wait()

    def b_step(what: str, version: int) -> None:
        seen["b"].append((what, version))
        if len(seen["b"]) == 1:
            both_read_v1.wait()
            assert a_applied.wait(60)

    def apply_a() -> Any:
        try:
            return apply_manifest(a, step=a_step)
        finally:
            a_applied.set()

    out_a, out_b = run_both(apply_a, lambda: apply_manifest(b, pipelines_only=True, step=b_step))
    assert (out_a.version, out_a.previous, out_a.conflicts) == (2, 1, 0)
    assert (out_b.version, out_b.previous, out_b.conflicts) == (3, 2, 1)
    assert seen["b"] == [("claim", 2), ("claim", 3), ("advance", 3)]  # lost v2, reloaded, claimed v3
    files = held(shared)
    assert sorted(files) == ["manifest@current", "manifest@v1.toml", "manifest@v2.toml", "manifest@v3.toml"]
    assert files["manifest@current"] == "3\n"
    assert files["manifest@v2.toml"] == (a / "contextful.toml").read_text()  # the winner's, not overwritten
    v3 = tomllib.loads(files["manifest@v3.toml"])
    assert [e["id"] for e in v3["external"]] == ["crm"]  # the winner's edit kept
    assert [p["id"] for p in v3["pipeline"]] == ["events", "orders"]  # the loser's edit reapplied


@pytest.mark.clause("surface.apply.version-race")
def test_the_loser_of_the_pointer_reapplies_and_its_unapplied_claim_stays(tmp_path: Path) -> None:
    """A claims v2 and is held before moving the pointer; B claims v3 and moves the pointer 1 -> 3;
    A's compare-and-swap (1 -> 2) loses: it reloads v3 and claims v4. v2 stays as claimed, never applied."""
    a_doc = BASE + EXTERNAL
    b_doc = BASE + SECOND_PIPELINE
    a, b, shared = shared_projects(tmp_path, a_doc, b_doc)
    a_claimed = threading.Event()
    b_applied = threading.Event()

    def a_step(what: str, version: int) -> None:
        if (what, version) == ("advance", 2):
            a_claimed.set()
            assert b_applied.wait(60)

    def apply_b() -> Any:
        try:
            assert a_claimed.wait(60)  # B starts once A holds its claim of v2
            return apply_manifest(b)
        finally:
            b_applied.set()

    out_a, out_b = run_both(lambda: apply_manifest(a, step=a_step), apply_b)
    assert (out_b.version, out_b.previous, out_b.conflicts) == (3, 1, 0)
    assert (out_a.version, out_a.previous, out_a.conflicts) == (4, 3, 1)
    files = held(shared)
    assert files["manifest@current"] == "4\n"
    assert files["manifest@v2.toml"] == files["manifest@v4.toml"] == (a / "contextful.toml").read_text()
    assert files["manifest@v3.toml"] == (b / "contextful.toml").read_text()
    assert [(v.version, v.applied) for v in versions(a)] == [(1, False), (2, False), (3, False), (4, True)]


def _apply_in_child(project: str, barrier: Any, queue: Any) -> None:
    def step(what: str, version: int) -> None:
        if what == "claim" and version == 2:
            barrier.wait()

    try:
        outcome = apply_manifest(project, step=step)
        queue.put((project, outcome.version, outcome.previous, outcome.conflicts))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put((project, repr(exc), None, None))


@pytest.mark.clause("surface.apply.version-race")
def test_two_processes_claiming_one_version_both_end_up_applied_in_turn(tmp_path: Path) -> None:
    """Two processes released together at the claim of v2: one wins it, the other reapplies after it;
    whatever the interleaving, v1..vN are contiguous, none is rewritten, and the two applies chain."""
    a_doc = BASE + EXTERNAL
    b_doc = BASE + SECOND_PIPELINE
    a, b, shared = shared_projects(tmp_path, a_doc, b_doc)
    context = multiprocessing.get_context("spawn")  # no fork of a process running threads
    barrier, queue = context.Barrier(2, timeout=60), context.Queue()
    children = [context.Process(target=_apply_in_child, args=(str(p), barrier, queue)) for p in (a, b)]
    for child in children:
        child.start()
    results = sorted((queue.get(timeout=120) for _ in children), key=lambda r: r[1])
    for child in children:
        child.join(60)
    (first, v_first, prev_first, _), (second, v_second, prev_second, _) = results
    assert isinstance(v_first, int) and isinstance(v_second, int), results
    assert prev_first == 1 and prev_second == v_first  # applied in turn: the second onto the first
    files = held(shared)
    claimed = sorted(int(n.removeprefix("manifest@v").removesuffix(".toml")) for n in files if n.endswith(".toml"))
    assert claimed == list(range(1, v_second + 1))  # contiguous
    assert files["manifest@current"] == f"{v_second}\n"
    docs = {str(a): (a / "contextful.toml").read_text(), str(b): (b / "contextful.toml").read_text()}
    assert files[f"manifest@v{v_first}.toml"] == docs[first] and files[f"manifest@v{v_second}.toml"] == docs[second]
    assert files["manifest@v1.toml"].startswith(BASE)
    assert all(files[f"manifest@v{n}.toml"] in docs.values() for n in claimed[1:])  # no file but a whole document
