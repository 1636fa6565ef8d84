"""Workers on machines of their own: one serving node and two workers sharing only the S3 bucket and
the PostgreSQL catalog (docs/container-profile.md, "Workers across machines").

Each node is a project directory of its own (its own ``contextful.toml``, ``.contextful`` working
directory and snapshot directory) under the container profile: one PostgreSQL execution database,
one corpus bucket, one ``[sync]`` bucket on the S3-compatible server on loopback (moto). Nothing
else is shared: the sources are http pipelines over a loopback API, the workers learn the applied
version from the ``[sync]`` bucket as a separate machine would, and the rows the workers land are
read from the serving node and from a third, fresh directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.control.scenario import Gates, http_pipeline
from tests.engine.control.test_control_source import _closed_port
from tests.engine.control.test_sync import Keys, Node, make_keys, make_node
from tests.engine.control.test_workers import KEY, Worker
from tests.engine.land.test_reconnect import postgres_env, provisioned
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.s3, pytest.mark.postgres]

PROJECT = '[project]\nname = "shop"\n'


def _node(path: Path, s3: S3Server, bucket: str, keys: Keys, env: dict[str, str], body: str) -> Node:
    node = make_node(path, s3, bucket, keys, PROJECT + body)
    node.env = env | node.env
    return node


def _count(node: Node, table: str) -> int:
    proc = node.run("--json", "sql", f'SELECT count(*) AS n FROM "{table}"')
    [row] = json.loads(proc.stdout)
    return int(row["n"])


@pytest.mark.clause("surface.dispatch.worker-target")
def test_a_serving_node_and_two_worker_machines_share_only_the_bucket_and_the_catalog(
        tmp_path: Path, s3_server: S3Server, pg_dsn: str, pg_schema: str) -> None:
    keys, control = make_keys(tmp_path / "keys"), s3_server.new_bucket()
    (tmp_path / "setup").mkdir()  # the deployment is provisioned once, from a machine of its own
    (tmp_path / "setup" / "contextful.toml").write_text(PROJECT)
    corpus = provisioned(tmp_path / "setup", pg_dsn, pg_schema, s3_server)

    def env(name: str) -> dict[str, str]:
        return postgres_env(pg_dsn, pg_schema, f"cf-{name}", s3_server, corpus) | {"CONTEXTFUL_WORKER_KEY": KEY}

    gates = Gates().start()
    relay = f"http://127.0.0.1:{_closed_port()}"
    try:
        # each worker machine: the project's name, pins and [sync] bucket, and serve's relay; no pipelines
        workers_nodes = [_node(tmp_path / f"worker{n}", s3_server, control, keys, env(f"worker{n}"),
                               f'\n[control]\nrelay = "{relay}"\n') for n in (1, 2)]
        workers = [Worker(node.root, env={k: v for k, v in node.env.items() if k != "CONTEXTFUL_TOKEN"})
                   for node in workers_nodes]
        try:
            listed = ", ".join(f'"{w.url}"' for w in workers)
            blocks = (http_pipeline("a", gates.gate("a", open_=True))
                      + http_pipeline("s", gates.gate("s", open_=True), schedule=None, after="a"))
            serving = _node(tmp_path / "serving", s3_server, control, keys, env("serving"),
                            f'\n[control]\nrelay = "{relay}"\nworkers = [{listed}]\n{blocks}')
            assert serving.run("pipeline", "import").stdout == "claimed v1 (applied)\n"
            proc = serving.run("--json", "pipeline", "serve", "--cycle", check=False)
            answer = json.loads(proc.stdout)
            assert proc.returncode == 0 and answer["fired"] == ["a", "s"], (proc.stdout, proc.stderr)
            # each landing member ran on a worker machine, which adopted v1 from the bucket first
            admitted = {member: [w for w in workers if any(f"/{member}/1: admitted" in line for line in w.log)]
                        for member in ("a", "s")}
            assert all(len(ran) == 1 for ran in admitted.values()), {m: [w.log for w in r] for m, r in admitted.items()}
            for member, [worker] in admitted.items():
                assert '{"pointer": "' + member + '@' in worker.wait_log(f"/{member}/1: {{")
            ran_on = {workers.index(admitted[m][0]) for m in ("a", "s")}
            assert ran_on == {0, 1}, ran_on  # the rotation hands the two steps to both machines
            for node in workers_nodes:  # each worker keeps what it adopted in its own snapshot directory
                assert (node.snapshots / "manifest@v1.toml").read_bytes() == \
                    (serving.snapshots / "manifest@v1.toml").read_bytes()
        finally:
            for worker in workers:
                worker.stop()
        # readable on the serving node, and on a third machine that never took part
        assert (_count(serving, "a"), _count(serving, "s")) == (1, 1)
        reader = Node(tmp_path / "reader", env("reader"), s3_server, control)
        reader.root.mkdir()
        reader.write(PROJECT)  # a fresh directory holding only the project's name
        assert (_count(reader, "a"), _count(reader, "s")) == (1, 1)
    finally:
        gates.stop()
