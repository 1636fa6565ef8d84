"""Two ``contextful pipeline run``s of one pipeline at once, and a run stopped with Ctrl-C, as a user
meets them: real child processes, the first held at a gate (a loopback API that answers only when
the test opens it), never a sleep.

- The refused run says which pipeline is being run by which process on which host since when,
  exits 11 (``ExecutionHeld``, its own code) and prints no summary: nothing ran.
- SIGINT to a held run exits 130 and records the run as ``interrupted`` (``run history``), not failed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from tests.engine.control.scenario import Gates, http_pipeline
from tests.support.cli import contextful


@contextmanager
def held_run(tmp_path: Path) -> Iterator[tuple[Gates, subprocess.Popen[str], Path]]:
    """``pipeline run orders`` in a child process, held at its gate until the test opens it."""
    with Gates() as gates:
        url = gates.gate("orders")
        (tmp_path / "contextful.toml").write_text('[project]\nname = "two"\n' + http_pipeline("orders", url, schedule=None))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
        first = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path),
                                  "pipeline", "run", "orders"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
        try:
            gates.wait_arrived(1)  # it claimed the pipeline and is pulling
            yield gates, first, tmp_path
        finally:
            gates.open("orders")
            if first.poll() is None:
                first.communicate(timeout=120)


def test_a_second_run_names_the_pipeline_process_host_and_since_when_and_prints_no_summary(tmp_path: Path) -> None:
    with held_run(tmp_path) as (gates, first, root):
        asked = datetime.now(UTC).replace(microsecond=0)
        second = contextful(root, "pipeline", "run", "orders", check=False)
        assert second.returncode == 11, second.stderr
        assert second.stdout == ""  # no summary line for work that did not run
        [line] = second.stderr.splitlines()
        prefix = f"error: ExecutionHeld: pipeline 'orders' is being run by process {first.pid} on host " \
                 f"{socket.gethostname()} since "
        assert line.startswith(prefix) and "this run did nothing" in line, line
        since = datetime.fromisoformat(line[len(prefix):].split(" ")[0])
        assert since <= asked  # it has held it since it claimed it, before the second run asked
        as_json = contextful(root, "--json", "pipeline", "run", "orders", check=False)
        assert as_json.returncode == 11
        [result] = json.loads(as_json.stdout)
        assert result["tables"] == [] or all(t["rows"] == 0 for t in result["tables"])
        assert [f["error"] for f in result["failures"]] == ["ExecutionHeld"]
        gates.open("orders")
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        assert out.startswith("orders -> orders: 1 rows")
    history = json.loads(contextful(root, "--json", "run", "history").stdout)
    assert [r["status"] for r in history] == ["committed"]  # the refused runs recorded nothing


def test_an_interrupted_run_is_recorded_as_interrupted(tmp_path: Path) -> None:
    with held_run(tmp_path) as (gates, first, root):
        first.send_signal(signal.SIGINT)
        _out, err = first.communicate(timeout=120)
        assert first.returncode == 130 and err.splitlines()[-1] == "error: KeyboardInterrupt: interrupted", err
        [run] = json.loads(contextful(root, "--json", "run", "history").stdout)
        assert run["status"] == "interrupted" and run["table"] == "orders"
        assert run["failure"]["error"] == "KeyboardInterrupt" and "interrupted" in run["failure"]["detail"]
        shown = contextful(root, "run", "history").stdout
        assert f"{run['run_id']} interrupted: KeyboardInterrupt: interrupted" in shown
        assert "failed" not in shown
        gates.open("orders")
        again = contextful(root, "pipeline", "run", "orders", check=False)  # nobody holds it now: it runs
        assert again.returncode == 0, again.stderr
