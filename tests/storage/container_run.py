"""The child process of ``test_disposable_machine``: a multi-step run under the container profile.

    python -m tests.storage.container_run WORKDIR SCOPE STEPS [--stop-before K]

Opens the store whose working copy is ``WORKDIR/store`` (the corpus is the bucket the environment
binds, ``CONTEXTFUL_CORPUS_BUCKET``), opens or resumes the execution under ``SCOPE`` and runs
``STEPS`` steps. Step ``i`` computes a random token — recording in the side table
``side_executions`` of the execution database that it ran (a channel that survives the machine) —
stores the token as a blob, and is recorded in the journal; then its rows land in the table named
after the scope under run id ``<execution>-<i>`` unless that run committed already. With
``--stop-before K`` the child prints ``stop K`` before step ``K`` and blocks on stdin: the parent
kills it there. At the end it prints ``done`` and the recorded tokens as JSON, and closes the
execution.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from typing import Any

import psycopg
import pyarrow as pa
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.storage import Store

ROWS_PER_STEP = 3
SIDE_TABLE = "side_executions"


def table_name(scope: str) -> str:
    return scope.replace("-", "_")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("scope")
    parser.add_argument("steps", type=int)
    parser.add_argument("--stop-before", type=int, default=None)
    args = parser.parse_args()
    dsn, schema = os.environ["CONTEXTFUL_POSTGRES_DSN"], os.environ["CONTEXTFUL_POSTGRES_SCHEMA"]
    side = psycopg.connect(dsn, autocommit=True)
    side.execute(f'SET search_path TO "{schema}"')
    store = Store.open(os.path.join(args.workdir, "store"))
    execution = open_execution(store.journal, args.scope, plan_reference({"scope": args.scope, "steps": args.steps}),
                               lease_s=300.0, take_over_dead=True)
    table = store.create_table(table_name(args.scope))
    landed = {c.run_id for c in store.catalog.commits(table.name)}
    tokens = []
    for i in range(args.steps):
        if i == args.stop_before:
            print(f"stop {i}", flush=True)
            sys.stdin.read()  # the parent kills this process here
            sys.exit(3)  # stdin closed: the parent is gone, and this machine with it

        def compute(i: int = i) -> dict[str, Any]:
            side.execute(f"INSERT INTO {SIDE_TABLE} (scope, step, pid) VALUES (%s, %s, %s)",
                         (args.scope, i, os.getpid()))
            token = uuid.uuid4().hex
            return {"step": i, "token": token, "blob": store.blobs.put(token.encode())}

        value = execution.step(f"step {i}", compute)
        assert isinstance(value, dict)
        assert store.blobs.get(value["blob"]) == value["token"].encode()
        tokens.append(value["token"])
        run_id = f"{execution.execution_id}-{i}"
        if run_id not in landed:
            table.append(pa.table({"step": [i] * ROWS_PER_STEP, "n": list(range(ROWS_PER_STEP)),
                                   "token": [value["token"]] * ROWS_PER_STEP}), run_id=run_id)
    execution.close(ok=True)
    print("done " + json.dumps({"execution": execution.execution_id, "tokens": tokens}), flush=True)
    store.close()


if __name__ == "__main__":
    main()
