"""Every shell and Python block of README.md and docs/*.md runs as written; every TOML block parses.

How the docs are run (keep this paragraph and README.md's "Docs that run" in step):

- A fenced block tagged ``sh``, ``shell``, ``bash`` or ``console`` runs with bash
  (``set -euo pipefail``; a ``console`` block runs its ``$ `` lines), with the ``contextful``
  command of this test's Python first on ``PATH``; a ``python`` block runs as a script with this
  test's Python; a ``toml`` block must parse with ``tomllib``, and one holding ``[project]`` (a
  whole manifest) must pass ``contextful pipeline validate``. Other blocks are text.
- Each document runs in a scratch directory of its own, blocks in order, each starting in the
  directory where the one before ended (as in one terminal). README.md starts at a scratch copy of
  the repository's root as a fresh clone has it (only ``datasets/`` is copied; nothing is written
  into the repository). Every other document starts in a copy of ``datasets/example`` with its
  events generated and landed (``contextful pipeline run``).
- Two rules keep it fast, visibly: a ``pip install …`` segment is not run (``pip install X && Y``
  runs ``Y``; a line ``pip install X`` runs nothing), and ``python -m contextful.datasets.gharchive N …`` runs with N = 500.
- A block a reader saves as a file carries ``<!-- docs-test: file (PATH) -->`` on the line before
  its fence: its text is written to PATH (relative to the directory the blocks have reached) before
  it is checked or run, so later blocks use it (``--machine PATH``). ``<!-- docs-test: append
  (PATH) -->`` appends it instead: a manifest fragment added to the project's ``contextful.toml``.
- A shell block a reader leaves serving carries ``<!-- docs-test: background (TEXT) -->``: it starts
  in the background, later blocks run once a line of its output holds TEXT (its readiness, as
  ``listening on``), and it is stopped (SIGTERM to its process group) when the document ends. A
  documented address ``127.0.0.1:80NN`` or ``0.0.0.0:80NN`` in a shell or Python block runs on a
  free port, the same one for every mention of that address in the document.
- A block that cannot run here (it stands for a shape, or needs a machine a scratch project cannot
  have) carries a marker on the line before its fence, with its reason in parentheses:
  ``<!-- docs-test: skip (stands for a shape) -->``. Use it sparingly: a block that can run runs. A failure names the document, the block, the failing line and its stderr. (As bash does,
  ``set -e`` does not stop at a failed command inside an ``&&`` chain unless it ends the block:
  write one command a line.)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
PUBLIC_API_DOCS = {"README.md", "docs/notebooks.md", "docs/read-path.md"}  # the public API only
SHELL = {"sh", "shell", "bash", "console"}
GENERATED_EVENTS = 500

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!-- docs-test: (?P<verb>skip|file|append|background) \((?P<reason>[^()]*\S[^()]*)\) -->$")
PIP_INSTALL = re.compile(r"pip install [^&;|\n]*(&&[ \t]*|$)", re.MULTILINE)
LOOPBACK_PORT = re.compile(r"\b(?:127\.0\.0\.1|0\.0\.0\.0):80\d\d\b")
READY_S = 120
GHARCHIVE = re.compile(r"(python -m contextful\.datasets\.gharchive )\d+")


@dataclass(frozen=True)
class Block:
    """One fenced block of a document."""

    doc: str
    number: int  # 1-based, counting every fenced block of the document
    lang: str
    line: int  # the document's line of the block's first line
    text: str
    skip: str | None  # the skip marker's reason
    writes: tuple[str, str] | None = None  # a file or append marker's verb and path
    ready: str | None = None  # a background marker's readiness text


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = MARKER.match(lines[i - 1]) if i else None
        verb, arg = (marker.group("verb"), marker.group("reason")) if marker else (None, None)
        found.append(Block(str(path.relative_to(REPO)), len(found) + 1, fence.group(1), i + 2,
                           "\n".join(lines[i + 1:end]) + "\n", arg if verb == "skip" else None,
                           (verb, arg) if verb in ("file", "append") and arg else None,
                           arg if verb == "background" else None))
        i = end + 1
    return found


def clean_env(tmp: Path) -> dict[str, str]:
    """The user's environment without the store/profile variables, ``contextful`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_") or k.startswith("CONTEXTFUL_TEST_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    assert shutil.which("contextful", path=env["PATH"]) == str(Path(sys.executable).parent / "contextful"), \
        f"no contextful command beside {sys.executable}: install the project into the Python running the tests"
    env["XDG_STATE_HOME"] = str(tmp / "state")  # an internal error's log stays in the scratch
    env["PYTHONUNBUFFERED"] = "1"
    return env


def shell_script(block: Block) -> str:
    text = block.text
    if block.lang == "console":
        text = "".join((line[2:] if line.startswith("$ ") else "") + "\n" for line in text.splitlines())
    text = GHARCHIVE.sub(rf"\g<1>{GENERATED_EVENTS}", PIP_INSTALL.sub("", text))  # an emptied line does nothing
    # Line 1 of the script sets up; block line k is script line k + 1. The DEBUG trap notes the line
    # of each command starting (inside a trap, $LINENO says 1), and the EXIT trap names the last one
    # when the block failed (set -e: a failed command other than an && chain's last stops the block).
    preamble = ('set -euo pipefail; trap \'CF_LINES+=($LINENO)\' DEBUG; '
                'trap \'cf_rc=$?; for cf_l in "${CF_LINES[@]}"; do [ "$cf_l" = 1 ] || cf_line=$cf_l; done; '
                '[ $cf_rc -eq 0 ] || echo "$((cf_line - 1))" > "$CF_FAILED"; pwd > "$CF_CWD"; exit $cf_rc\' EXIT\n')
    return preamble + text


class Reader:
    """One reader's terminal: blocks of one document, in order, in one scratch directory."""

    def __init__(self, tmp: Path, cwd: Path) -> None:
        self.tmp, self.cwd, self.env = tmp, cwd, clean_env(tmp)
        (tmp / "blocks").mkdir()
        self.ports: dict[str, str] = {}
        self.background: list[subprocess.Popen[str]] = []

    def local(self, text: str) -> str:
        """``text`` with each documented loopback port replaced by this document's free port for it."""
        def port(found: re.Match[str]) -> str:
            if found.group(0) not in self.ports:
                with socket.socket() as sock:
                    sock.bind(("0.0.0.0", 0))
                    self.ports[found.group(0)] = f"{found.group(0).rsplit(':', 1)[0]}:{sock.getsockname()[1]}"
            return self.ports[found.group(0)]
        return LOOPBACK_PORT.sub(port, text)

    def close(self) -> None:
        """Stop what the document left serving (SIGTERM to each group, as a reader's Ctrl-C would)."""
        for proc in self.background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def serve(self, block: Block) -> None:
        """Start ``block`` in the background and return once its output shows ``block.ready``."""
        assert block.ready is not None
        proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + self.local(block.text)], cwd=self.cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
                                start_new_session=True)
        self.background.append(proc)
        seen: list[str] = []
        ready = threading.Event()

        def drain() -> None:  # reads to the end, so the block never blocks on a full pipe
            assert proc.stdout is not None
            for line in proc.stdout:
                seen.append(line)
                if block.ready in line:
                    ready.set()
            ready.set()  # ended: the wait below sees whether it was ready

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(READY_S) or not any(block.ready in line for line in seen):
            ended = subprocess.CompletedProcess(proc.args, proc.poll() or 0, "", "".join(seen))
            fail(block, block.line, f"(background: no line holding {block.ready!r})", ended)

    def run(self, block: Block) -> None:
        if block.writes is not None:
            verb, name = block.writes
            target = self.cwd / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a" if verb == "append" else "w", encoding="utf-8") as fh:
                fh.write(("\n" if verb == "append" else "") + block.text)
        if block.lang == "toml":
            check_toml(block, self.tmp, self.env)
        elif block.lang in SHELL and block.ready is not None:
            self.serve(block)
        elif block.lang in SHELL:
            self.shell(block)
        elif block.lang == "python":
            self.python(block)

    def shell(self, block: Block) -> None:
        failed, cwd_file = self.tmp / "failed", self.tmp / "cwd"
        failed.unlink(missing_ok=True)
        proc = subprocess.run(["bash", "-c", self.local(shell_script(block))], cwd=self.cwd, capture_output=True, text=True,
                              env={**self.env, "CF_FAILED": str(failed), "CF_CWD": str(cwd_file)}, timeout=300,
                              check=False)
        if proc.returncode != 0:
            lines = block.text.splitlines()
            line = min(max(int(failed.read_text()) if failed.exists() else 1, 1), len(lines))
            fail(block, block.line + line - 1, lines[line - 1].strip(), proc)
        self.cwd = Path(cwd_file.read_text().strip())

    def python(self, block: Block) -> None:
        if block.doc in PUBLIC_API_DOCS:
            assert not re.search(r"\b(engine|storage|iceberg)\.", block.text), \
                f"{block.doc} block {block.number}: an internal module in a public-API document"
        script = self.tmp / "blocks" / f"{block.doc.replace('/', '_')}-block-{block.number}.py"
        script.write_text(self.local(block.text), encoding="utf-8")
        proc = subprocess.run([sys.executable, str(script)], cwd=self.cwd, capture_output=True, text=True,
                              env=self.env, timeout=300, check=False)
        if proc.returncode != 0:
            lines = [int(n) for n in re.findall(rf'File "{re.escape(str(script))}", line (\d+)', proc.stderr)]
            line = lines[-1] if lines else 1
            fail(block, block.line + line - 1, block.text.splitlines()[line - 1].strip(), proc)


def fail(block: Block, doc_line: int, text: str, proc: subprocess.CompletedProcess[str]) -> None:
    stderr = "\n".join(proc.stderr.splitlines()[-40:])
    stdout = "\n".join(proc.stdout.splitlines()[-10:])
    pytest.fail(f"{block.doc} block {block.number} ({block.lang}), {block.doc}:{doc_line}: `{text}` "
                f"exited {proc.returncode}\n--- stderr ---\n{stderr}\n--- stdout (tail) ---\n{stdout}", pytrace=False)


def check_toml(block: Block, tmp: Path, env: dict[str, str]) -> None:
    try:
        parsed = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        problem = str(exc)
    else:
        problem = None
    if problem is not None:
        pytest.fail(f"{block.doc} block {block.number} (toml, {block.doc}:{block.line}): not TOML: {problem}",
                    pytrace=False)
    if "project" not in parsed:
        return  # a fragment: it parses
    project = tmp / f"manifest-{block.number}"
    project.mkdir()
    (project / "contextful.toml").write_text(block.text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "contextful", "--project", str(project), "pipeline", "validate"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    if proc.returncode != 0:
        fail(block, block.line, "contextful pipeline validate", proc)


@pytest.fixture(scope="session")
def landed_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """datasets/example with its events generated small and landed: where docs/*.md start."""
    root = tmp_path_factory.mktemp("landed") / "datasets"
    shutil.copytree(REPO / "datasets", root, ignore=shutil.ignore_patterns("__pycache__", "raw", ".contextful"))
    env = clean_env(root.parent)
    for argv in ([sys.executable, "-m", "contextful.datasets.gharchive", str(GENERATED_EVENTS), "example/raw",
                  "--shards", "4", "--gzip"],
                 [sys.executable, "-m", "contextful", "--project", "example", "pipeline", "run"]):
        subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=True, timeout=300)
    return root


@pytest.mark.parametrize("doc", [str(p.relative_to(REPO)) for p in DOCS])
def test_a_document_runs_as_written(doc: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    found = blocks(REPO / doc)
    if doc == "README.md":
        shutil.copytree(REPO / "datasets", tmp_path / "clone" / "datasets",
                        ignore=shutil.ignore_patterns("__pycache__", "raw", ".contextful"))
        start = tmp_path / "clone"
    elif any(b.skip is None and b.lang in SHELL | {"python"} for b in found):
        shutil.copytree(request.getfixturevalue("landed_example"), tmp_path / "clone" / "datasets")
        start = tmp_path / "clone" / "datasets" / "example"
    else:
        start = tmp_path / "clone"
        start.mkdir()
    reader = Reader(tmp_path, start)
    began = time.monotonic()
    try:
        for block in found:
            if block.skip is None:
                reader.run(block)
    finally:
        reader.close()
    print(f"{doc}: {len(found)} blocks in {time.monotonic() - began:.1f}s")


def test_a_skip_marker_gives_its_reason_and_stands_before_a_fence() -> None:
    assert MARKER.match("<!-- docs-test: skip (needs a served gateway) -->")
    assert MARKER.match("<!-- docs-test: file (../speech.machine.toml) -->")
    assert not any(MARKER.match(m) for m in ("<!-- docs-test: skip -->", "<!-- docs-test: skip () -->",
                                            "<!-- docs-test: skip ( ) -->", "<!-- docs-test: skip, needs a server -->"))
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").split("\n")
        for n, line in enumerate(lines):
            if not (line.startswith("<!--") and "docs-test" in line):
                continue
            where = f"{path.relative_to(REPO)}:{n + 1}"
            assert MARKER.match(line), \
                f"{where}: write `<!-- docs-test: skip (the reason) -->` or `file (PATH)`/`append (PATH)`, not {line!r}"
            assert n + 1 < len(lines) and FENCE.match(lines[n + 1]) and lines[n + 1] != "```", \
                f"{where}: a docs-test marker stands on the line before a block's opening fence"


def test_the_runner_reports_the_failing_line_and_its_stderr(tmp_path: Path) -> None:
    block = Block("doc.md", 1, "sh", 4, "true\ncontextful table show nowhere   # fails\necho never\n", None)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "contextful.toml").write_text('[project]\nname = "p"\n')
    with pytest.raises(pytest.fail.Exception) as failed:
        Reader(tmp_path, tmp_path / "p").shell(block)
    message = str(failed.value)
    assert "doc.md block 1 (sh), doc.md:5: `contextful table show nowhere   # fails`" in message
    assert "error: StoreNotFound" in message and "never" not in message  # no store there: reading creates none


def test_the_docs_hold_runnable_blocks() -> None:
    """The extraction finds what the docs hold: a regression in the fence pattern cannot pass silently."""
    langs = {b.lang for path in DOCS for b in blocks(path)}
    assert {"sh", "python", "toml"} <= langs
    assert sum(b.skip is None and b.lang in SHELL | {"python"} for path in DOCS for b in blocks(path)) >= 9


def test_the_two_rules_rewrite_only_pip_install_and_the_event_count() -> None:
    block = Block("doc.md", 1, "sh", 2, "pip install -e . && python -m contextful.datasets.gharchive 20000 raw && ls\n"
                  "pip install -e '.[test]'\ncontextful sql \"SELECT 20000\"\n", None)
    lines = shell_script(block).split("\n")[1:]
    assert lines[:3] == [f"python -m contextful.datasets.gharchive {GENERATED_EVENTS} raw && ls", "",
                         'contextful sql "SELECT 20000"']


def test_a_saved_block_feeds_later_blocks_and_a_background_block_serves_until_the_page_ends(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    reader = Reader(tmp_path, tmp_path / "p")
    try:
        reader.run(Block("doc.md", 1, "toml", 2, 'greeting = "hello"\n', None, ("file", "conf/a.toml")))
        reader.run(Block("doc.md", 2, "toml", 6, 'more = "appended"\n', None, ("append", "conf/a.toml")))
        serve = ("python -c 'import sys, http.server as h; host, port = sys.argv[1].split(\":\"); "
                 "s = h.ThreadingHTTPServer((host, int(port)), h.SimpleHTTPRequestHandler); "
                 "print(\"Serving HTTP\", flush=True); s.serve_forever()' 127.0.0.1:8080\n")
        reader.run(Block("doc.md", 3, "sh", 10, serve, None, None, "Serving HTTP"))
        server = reader.background[0]
        reader.run(Block("doc.md", 4, "sh", 14, "curl -sf http://127.0.0.1:8080/conf/a.toml > got.toml\n", None))
        assert tomllib.loads((tmp_path / "p" / "got.toml").read_text()) == {"greeting": "hello", "more": "appended"}
        assert reader.ports["127.0.0.1:8080"] != "127.0.0.1:8080"  # a free port, the same for both blocks
    finally:
        reader.close()
    assert server.poll() is not None  # stopped with the page
