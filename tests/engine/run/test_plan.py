"""Compiled plans (decision "plan-compiled-content"): the manifest compiles at validate time to one
canonical content-hashed plan executions pin; step bodies, control flow, node ids, chain arity and
linked script runtimes as the ``run.compile.*``, ``run.transform.arity`` and
``topology.compose.script-runtime`` clauses state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.run.execution import plan_reference
from contextful.engine.run.plan import pipeline_reference
from contextful.engine.run.script_runtime import JS_RUNTIME_MODULES, linked_script_runtimes
from contextful.engine.run.transform import run_chain
from contextful.storage.errors import (
    ManifestInvalid,
    PipelineInlineStepBody,
    PipelineNodeIdCollision,
    PipelineTransformArity,
    PipelineUndeclaredControlFlow,
    SchemaIrreconcilable,
)

from tests.support.cli import contextful, contextful_in

PROJECT = """
[project]
name = "shop"

[[pipeline]]
id = "orders"
primary_key = ["id"]

[pipeline.source]
kind = "files"
config = {{ paths = ["orders/*.ndjson"] }}
{body}
"""

CHAIN = """
[[pipeline.transform]]
id = "settled"
op = "filter"
column = "status"
in = ["paid", "refunded"]

[[pipeline.transform]]
op = "branch"
on = "status"

[[pipeline.transform.arm]]
value = "refunded"
chain = [{ op = "rename", columns = { amount = "refund" } }]

[[pipeline.transform]]
id = "first_tag"
op = "unnest"
column = "tags"
"""

# The same declarations: keys in another order, other whitespace, the step's config as a table.
CHAIN_REORDERED = """
[project]
name   =   "shop"
[[pipeline]]
primary_key=["id"]
id="orders"
[pipeline.source.config]
paths=["orders/*.ndjson"]
[pipeline.source]
kind="files"
[[pipeline.transform]]
in=["paid","refunded"]
column="status"
op="filter"
id="settled"
[[pipeline.transform]]
on="status"
op="branch"
[[pipeline.transform.arm]]
chain=[{columns={amount="refund"},op="rename"}]
value="refunded"
[[pipeline.transform]]
column="tags"
op="unnest"
id="first_tag"
"""


def manifest_of(text: str, root: Path = Path("/nowhere")):  # type: ignore[no-untyped-def]
    return parse_manifest(tomllib.loads(text), root)


def problems_of(text: str) -> list[Exception]:
    with pytest.raises(ManifestInvalid) as caught:
        manifest_of(text)
    return list(caught.value.problems)


@pytest.mark.clause("run.compile.authoring-surface")
def test_the_plan_hash_ignores_key_order_and_whitespace_and_follows_every_declaration() -> None:
    plan = manifest_of(PROJECT.format(body=CHAIN)).plan
    assert plan is not None and len(plan.reference) == 64
    assert manifest_of(CHAIN_REORDERED).plan == plan
    changed = [PROJECT.format(body=CHAIN.replace('"refunded"]', '"void"]')),           # an operation's value
               PROJECT.format(body=CHAIN.replace('id = "first_tag"', 'id = "tag"')),   # a node id
               PROJECT.format(body=CHAIN).replace('primary_key = ["id"]', 'primary_key = ["sku"]'),
               PROJECT.format(body=CHAIN + '\n[[model]]\nname = "daily"\nsql = "SELECT 1 AS n"\n')]
    references = {manifest_of(text).plan.reference for text in changed}  # type: ignore[union-attr]
    assert len(references) == len(changed) and plan.reference not in references
    nodes = plan.document["nodes"]
    assert {"pipeline:orders", "pipeline:orders/source", "pipeline:orders/settled", "pipeline:orders/transform[1]",
            "pipeline:orders/transform[1].arm[0].chain[0]", "pipeline:orders/first_tag"} == set(nodes)
    assert nodes["pipeline:orders"]["reference"] == plan.pipeline_reference("orders")


@pytest.mark.clause("run.compile.authoring-surface")
def test_executions_pin_the_compiled_plans_pipeline_reference_and_old_journals_keep_theirs(tmp_path: Path) -> None:
    from contextful.engine.land.journal import PullJournal
    from contextful.storage import Store

    manifest = manifest_of(PROJECT.format(body=CHAIN), tmp_path)
    spec = manifest.pipeline("orders")
    with Store.open(tmp_path / "store") as store:
        journal = PullJournal.open(store, spec, "pipeline:orders")
        assert journal.execution.plan_ref == manifest.plan.pipeline_reference("orders")  # type: ignore[union-attr]
        journal.close(ok=True)
    plain = manifest_of(PROJECT.format(body=""))  # no chain: the reference executions pinned before plans compiled
    before = {"pipeline": "orders", "table": "orders", "source": {"kind": "files", "config": {
        "paths": ["orders/*.ndjson"]}}, "normalize": "nested", "incremental": None, "primary_key": ["id"],
        "order_by": None, "types": {}}
    assert pipeline_reference(plain.pipeline("orders")) == plan_reference(before)
    assert plain.plan.pipeline_reference("orders") == plan_reference(before)  # type: ignore[union-attr]


@pytest.mark.clause("run.compile.authoring-surface")
def test_validate_and_plan_json_report_the_compiled_plan_and_its_hash(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(PROJECT.format(body=CHAIN))
    reference = manifest_of(PROJECT.format(body=CHAIN), tmp_path).plan.reference  # type: ignore[union-attr]
    assert contextful(tmp_path, "pipeline", "validate").stdout.strip().endswith(f"plan {reference}")
    shown = json.loads(contextful(tmp_path, "--json", "pipeline", "plan").stdout)
    assert shown["reference"] == reference == plan_reference(shown["plan"])
    assert shown["plan"]["nodes"]["pipeline:orders/first_tag"] == {"kind": "operation", "pipeline": "orders",
                                                                   "op": "unnest"}
    assert [p["pipeline"] for p in shown["pipelines"]] == ["orders"]


@pytest.mark.clause("run.compile.inline-step-body")
def test_validate_refuses_a_step_body_other_than_a_connector_reference(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(PROJECT.format(body="").replace(
        'kind = "files"', 'kind = "files"\ncode = "rows = [r for r in pull() if r.ok]"'))
    out = contextful(tmp_path, "pipeline", "validate", check=False)
    assert out.returncode == 3, out.stderr
    assert "error: PipelineInlineStepBody: [[pipeline]] 'orders' source: 'code'" in out.stderr
    inline = PROJECT.format(body="").replace('[pipeline.source]\nkind = "files"\nconfig = { paths = ["orders/*.ndjson"] }',
                                             'source = "def pull(): yield from fetch()"')
    assert [type(p) for p in problems_of(inline)] == [PipelineInlineStepBody]
    in_chain = PROJECT.format(body='[[pipeline.transform]]\nop = "filter"\ncolumn = "a"\nequals = 1\n'
                                   'python = "lambda r: r.a > 1"\n')
    found = problems_of(in_chain)
    assert [type(p) for p in found] == [PipelineInlineStepBody] and "transform[0]" in str(found[0])


@pytest.mark.clause("run.compile.control-flow")
@pytest.mark.parametrize(("where", "snippet"), [
    ("[[pipeline]] 'orders'", 'when = "status == \'paid\'"\n[pipeline.source]'),
    ("[[pipeline]] 'orders' source", '[pipeline.source]\nwhile = "more"'),
    ("[[pipeline]] 'orders' transform[0]", None),
    ("[[pipeline]] 'orders' transform[0].arm[0].chain[0]", None),
])
def test_a_data_dependent_conditional_or_loop_written_otherwise_is_refused(where: str, snippet: str | None) -> None:
    if snippet is not None:
        text = PROJECT.format(body="").replace("[pipeline.source]", snippet, 1)
    elif where.endswith("transform[0]"):
        text = PROJECT.format(body='[[pipeline.transform]]\nop = "filter"\ncolumn = "a"\nequals = 1\nif = "a > 1"\n')
    else:
        text = PROJECT.format(body='[[pipeline.transform]]\nop = "branch"\non = "k"\n[[pipeline.transform.arm]]\n'
                                   'value = "x"\nchain = [{ op = "loop" }]\n')
    found = problems_of(text)
    assert [type(p) for p in found] == [PipelineUndeclaredControlFlow], found
    assert found[0].detail.startswith(f"{where}:")  # type: ignore[attr-defined]


@pytest.mark.clause("run.compile.control-flow")
def test_branch_and_parallel_are_the_declared_control_flow_data_selects_an_arm() -> None:
    chain = manifest_of(PROJECT.format(body="""
[[pipeline.transform]]
op = "branch"
on = "region"
otherwise = [{ op = "filter", column = "region", not_null = true }]
[[pipeline.transform.arm]]
value = "eu"
chain = [{ op = "rename", columns = { amount = "amount_eur" } }]
[[pipeline.transform.arm]]
value = "us"
chain = [{ op = "cast", columns = { amount = "double" } }, { op = "select", columns = ["id", "amount"] }]

[[pipeline.transform]]
op = "parallel"
[[pipeline.transform.arm]]
chain = [{ op = "filter", column = "id", in = [1, 2] }]
[[pipeline.transform.arm]]
chain = [{ op = "filter", column = "id", equals = 3 }, { op = "rename", columns = { id = "copy_of" } }]
""")).pipeline("orders").transform
    rows = pa.table({"id": [1, 2, 3, 4], "region": ["us", "eu", "eu", None], "amount": [10, 20, 30, 40]})
    out = run_chain("orders", "orders", list(chain), rows).to_pylist()
    assert out == [  # arms follow one another; within the branch every row kept its arrival order
        {"id": 1, "region": None, "amount": 10.0, "amount_eur": None, "copy_of": None},
        {"id": 2, "region": "eu", "amount": None, "amount_eur": 20, "copy_of": None},
        {"id": None, "region": "eu", "amount": None, "amount_eur": 30, "copy_of": 3}]
    text_for_a_number = [{"id": "f", "op": "filter", "column": "id", "equals": "1"}]
    with pytest.raises(SchemaIrreconcilable, match="string values never equal int64"):  # like with like only
        run_chain("orders", "orders", text_for_a_number, rows)


@pytest.mark.clause("run.compile.node-id-collision")
def test_a_repeated_node_id_is_refused_naming_the_id_and_both_positions() -> None:
    found = problems_of(PROJECT.format(body="""
[[pipeline.transform]]
id = "keep"
op = "filter"
column = "a"
equals = 1
[[pipeline.transform]]
op = "parallel"
[[pipeline.transform.arm]]
chain = [{ op = "select", columns = ["a"] }]
[[pipeline.transform.arm]]
chain = [{ id = "keep", op = "select", columns = ["b"] }, { id = "source", op = "select", columns = ["c"] }]
"""))
    assert [type(p) for p in found] == [PipelineNodeIdCollision, PipelineNodeIdCollision]
    assert (found[0].node, found[0].first, found[0].second) == (  # type: ignore[attr-defined]
        "keep", "[[pipeline]] 'orders' transform[0]", "[[pipeline]] 'orders' transform[1].arm[1].chain[0]")
    assert (found[1].node, found[1].first) == ("source", "[[pipeline]] 'orders' source")  # type: ignore[attr-defined]
    assert "'keep'" in str(found[0]) and "transform[0]" in str(found[0]) and "arm[1].chain[0]" in str(found[0])
    # the same id in two pipelines is two nodes: pipeline:orders/keep and pipeline:returns/keep
    two = PROJECT.format(body='[[pipeline.transform]]\nid = "keep"\nop = "select"\ncolumns = ["a"]\n')
    two += two.split("[project]\nname = \"shop\"\n")[1].replace('id = "orders"', 'id = "returns"')
    assert {"pipeline:orders/keep", "pipeline:returns/keep"} <= set(manifest_of(two).plan.document["nodes"])  # type: ignore[union-attr]


@pytest.mark.clause("run.transform.arity")
def test_an_operation_emitting_more_rows_than_it_consumed_raises_on_that_batch() -> None:
    chain = list(manifest_of(PROJECT.format(body=CHAIN)).pipeline("orders").transform)
    ok = pa.table({"id": [1, 2, 3], "status": ["paid", "open", "refunded"], "amount": [5, 6, 7],
                   "tags": [["a"], ["b", "c"], None]})
    assert run_chain("orders", "orders", chain, ok).to_pylist() == [  # the open row left before unnest
        {"id": 1, "status": "paid", "amount": 5, "tags": "a", "refund": None},
        {"id": 3, "status": "refunded", "amount": None, "tags": None, "refund": 7}]
    grows = pa.table({"id": [4], "status": ["paid"], "amount": [1], "tags": [["x", "y"]]})
    with pytest.raises(PipelineTransformArity) as caught:
        run_chain("orders", "orders", chain, grows)
    assert (caught.value.node, caught.value.consumed, caught.value.emitted) == ("first_tag", 1, 2)


@pytest.mark.clause("run.transform.arity")
def test_a_run_fails_the_input_whose_batch_breaks_arity_and_lands_the_others(tmp_path: Path) -> None:
    from contextful.engine.run.units import run_pipelines
    from contextful.storage import Store

    manifest = manifest_of(PROJECT.format(body=CHAIN), tmp_path)
    (tmp_path / "orders").mkdir()
    (tmp_path / "orders" / "a.ndjson").write_text('{"id": 1, "status": "paid", "amount": 5, "tags": ["a"]}\n')
    (tmp_path / "orders" / "b.ndjson").write_text('{"id": 2, "status": "paid", "amount": 6, "tags": ["b", "c"]}\n')
    with Store.open(tmp_path / "store") as store:
        [result] = run_pipelines(store, manifest)
        assert [(f.error, f.input.endswith("b.ndjson")) for f in result.failures] == [("PipelineTransformArity", True)]
        assert "'first_tag' emitted 2 rows from 1 consumed" in result.failures[0].detail
        assert store.table("orders").to_arrow().select(["id", "tags"]).to_pylist() == [{"id": 1, "tags": "a"}]


def _fake_runtime(directory: Path, name: str) -> Path:
    """An importable module named ``name`` that leaves a mark if anything imports it."""
    marker = directory / f"{name}.imported"
    package = directory / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    return marker


@pytest.mark.clause("topology.compose.script-runtime")
@pytest.mark.clause("run.compile.authoring-surface")
def test_a_javascript_runtime_importable_where_plans_run_refuses_to_start(tmp_path: Path) -> None:
    assert linked_script_runtimes() == ()  # this environment, the one the package installs into, links none
    project_table = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]
    declared = [*project_table["dependencies"], *(d for ds in project_table["optional-dependencies"].values()
                                                   for d in ds)]
    js_distributions = ("mini-racer", "py-mini-racer", "quickjs", "dukpy", "js2py", "pythonmonkey", "stpyv8",
                        "pyexecjs", "javascript", "pyduktape", "pyduktape2")
    assert not [d for d in declared if d.lower().replace("_", "-").startswith(js_distributions)]  # no profile links one
    project = tmp_path / "project"
    project.mkdir()
    (project / "contextful.toml").write_text(PROJECT.format(body=CHAIN) + '[[pipeline]]\nid = "clicks"\n'
                                             '[pipeline.source]\nkind = "receive"\nconfig = { key_retention_secs = 60 }\n')
    (project / "orders").mkdir()
    (project / "orders" / "a.ndjson").write_text('{"id": 1, "status": "paid", "amount": 5, "tags": ["a"]}\n')
    path = os.pathsep.join(p for p in (str(tmp_path / "linked"), os.environ.get("PYTHONPATH", "")) if p)
    marker = _fake_runtime(tmp_path / "linked", "dukpy")
    ran = contextful_in(None, "--project", str(project), "pipeline", "run", env={"PYTHONPATH": path}, check=False)
    assert ran.returncode == 1 and "error: ScriptRuntimeLinked:" in ran.stderr and "dukpy" in ran.stderr, ran.stderr
    served = contextful_in(None, "--project", str(project), "pipeline", "serve", "--http", "127.0.0.1:0",
                           env={"PYTHONPATH": path}, check=False, timeout=120)
    assert served.returncode == 1 and "error: ScriptRuntimeLinked:" in served.stderr, served.stderr
    assert "listening" not in served.stdout and not marker.exists()  # found on the path, never imported
    assert not (project / ".contextful" / "store").exists()  # refused before anything ran
    clean = {r["pipeline"]: r for r in json.loads(contextful(project, "--json", "pipeline", "run").stdout)}
    assert clean["orders"]["tables"][0]["rows"] == 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    serving = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "pipeline",
                                "serve", "--http", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert serving.stdout is not None and serving.stdout.readline().startswith("listening on http://127.0.0.1:")
    finally:
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(timeout=60) == 0
    assert {"py_mini_racer", "quickjs", "dukpy", "js2py", "pythonmonkey", "STPyV8"} <= set(JS_RUNTIME_MODULES)
