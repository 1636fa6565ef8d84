"""Engine children: argv only, own process group, cleared environment, one deadline, output cap.

Every test here runs real child processes: small scripts the tests write (``python -I -S``, so a
child starts in milliseconds) and ``/usr/bin/env`` / ``/bin/sleep``. Nothing waits on a guessed
duration; the deadline tests give a child more to do than its deadline allows.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from contextful.engine.derive.bind import Binding, Step
from contextful.engine.derive.exec import STDERR_TAIL, run_chain
from contextful.storage.errors import (
    DeriveMediaUnreadable,
    DeriveOutputCap,
    DeriveRemoteUrlUnsupported,
    DeriveStepExit,
    DeriveStepProducedNothing,
    DeriveStepTimeout,
)

PY = (sys.executable, "-I", "-S")
ARGV_ENGINE = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                  "cwd": os.getcwd()}))
"""
COPY_STEP = """
import sys
with open(sys.argv[2], "w") as out:
    out.write("fetched " + sys.argv[1])
"""
# The leader leaves two grandchildren holding its stdout and stderr: one in its group, one that
# left it (setsid), writes their pids to a file, then does what argv[1] says.
GRANDCHILDREN = """
import os, signal, subprocess, sys
kept = subprocess.Popen(["/bin/sleep", "300"])
escaped = subprocess.Popen(["/bin/sleep", "300"], start_new_session=True)
with open("pids.tmp", "w") as fh:
    fh.write(f"{kept.pid} {escaped.pid}")
os.rename("pids.tmp", "pids")
if sys.argv[1] == "hang":
    signal.pause()
elif sys.argv[1] == "flood":
    while True:
        sys.stdout.buffer.write(b"x" * 65536)
else:
    print("done", flush=True)
"""


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def media_file(tmp_path: Path, name: str = "talk.wav") -> str:
    path = tmp_path / name
    path.write_bytes(b"RIFF....WAVE")
    return str(path)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def wait_dead(pid: int) -> None:
    """Wait (on the process's pidfd, an event) until ``pid`` has exited; fail after a minute."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], 60)[0], f"process {pid} is still alive"
    finally:
        os.close(fd)


@pytest.mark.clause("run.exec.no-shell")
def test_row_data_arrives_verbatim_with_no_shell_in_a_group_of_its_own(tmp_path: Path, work: Path) -> None:
    media = media_file(tmp_path, "a b;$(touch PWNED)`touch PWNED2`|&>'{output}' *{media}.wav")
    binding = Binding("e", command=(*PY, script(tmp_path, "engine.py", ARGV_ENGINE), "{input}", "{media}",
                                    "--at={input}!", "$HOME", "*"))
    seen = json.loads(run_chain(binding, "u1", media, work).output)
    assert seen["argv"] == [media, media, f"--at={media}!", "$HOME", "*"]  # once, verbatim, unexpanded
    assert not list(tmp_path.rglob("PWNED*"))
    assert seen["pgid"] == seen["pid"] == seen["sid"]  # the leader of a session and group of its own
    assert seen["pgid"] != os.getpgid(0)
    assert seen["cwd"] == str(work)
    chained = Binding("e", command=binding.command, preprocess=(
        Step("preprocess[0]", (*PY, script(tmp_path, "copy.py", COPY_STEP), "{input}", "{output}"),
             output="step {output}.txt"),))
    seen = json.loads(run_chain(chained, "u1", media, work).output)
    produced = str(work / "step {output}.txt")
    assert seen["argv"][:2] == [produced, media]  # {input}: the step's file; {media}: the original value
    assert Path(produced).read_text() == f"fetched {media}"


@pytest.mark.clause("run.exec.no-shell")
def test_the_child_sees_exactly_the_bindings_environment(tmp_path: Path, work: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTFUL_LEAK_CHECK", "inherited")
    media = media_file(tmp_path)
    binding = Binding("e", command=("/usr/bin/env",), env={"LANG": "C.UTF-8", "ONLY": "me"})
    assert run_chain(binding, "u", media, work).output.decode().splitlines() == ["LANG=C.UTF-8", "ONLY=me"]
    bare = Binding("e", command=("env",))  # found on this process's PATH; the child still gets none
    assert run_chain(bare, "u", media, work).output == b""
    pathed = Binding("e", command=("env",), env={"PATH": "/usr/bin"})
    assert run_chain(pathed, "u", media, work).output == b"PATH=/usr/bin\n"
    with pytest.raises(DeriveStepExit) as caught:  # the binding's PATH, when given, is the only one searched
        run_chain(Binding("e", command=("env",), env={"PATH": str(tmp_path)}), "u", media, work)
    assert caught.value.code == 127 and "env" in caught.value.error


@pytest.mark.clause("run.exec.non-zero-exit")
def test_a_non_zero_exit_carries_the_bounded_tail_of_its_error_text(tmp_path: Path, work: Path) -> None:
    engine = script(tmp_path, "fail.py", "import sys\nsys.stderr.write('noise ' * 5000)\n"
                                         "sys.stderr.write('the real error')\nsys.exit(3)\n")
    with pytest.raises(DeriveStepExit) as caught:
        run_chain(Binding("e", command=(*PY, engine)), "u", media_file(tmp_path), work)
    error = caught.value
    assert (error.step, error.code) == ("engine", 3)
    assert error.error.endswith("the real error") and len(error.error) <= STDERR_TAIL
    assert "the real error" in str(error)
    step = Step("preprocess[0]", (*PY, engine), output="o")
    with pytest.raises(DeriveStepExit) as caught:
        run_chain(Binding("e", command=("/bin/true",), preprocess=(step,)), "u", media_file(tmp_path), work)
    assert caught.value.step == "preprocess[0]"


@pytest.mark.clause("run.exec.deadline-elapsed")
def test_the_deadline_names_the_running_step(tmp_path: Path, work: Path) -> None:
    hang = Step("preprocess[0]", ("/bin/sleep", "300"), output="o")
    with pytest.raises(DeriveStepTimeout) as caught:
        run_chain(Binding("e", command=("/bin/true",), preprocess=(hang,), deadline_s=0.2), "u",
                  media_file(tmp_path), work)
    assert (caught.value.step, caught.value.deadline_s) == ("preprocess[0]", 0.2)


@pytest.mark.clause("run.exec.deadline-elapsed")
def test_one_deadline_covers_the_whole_chain(tmp_path: Path, work: Path) -> None:
    # Each step alone fits the deadline; together they do not. A per-step deadline would let the
    # engine run 1.6 s after a 0.8 s step (>= 2.4 s in all); the chain's ends at 1.6 s.
    slow = script(tmp_path, "slow.py", "import sys, time\ntime.sleep(0.8)\nopen(sys.argv[1], 'w').write('x')\n")
    binding = Binding("e", command=("/bin/sleep", "300"), deadline_s=1.6,
                      preprocess=(Step("preprocess[0]", (*PY, slow, "{output}"), output="o"),))
    started = time.monotonic()
    with pytest.raises(DeriveStepTimeout) as caught:
        run_chain(binding, "u", media_file(tmp_path), work)
    assert caught.value.step == "engine"
    assert time.monotonic() - started < 2.4


@pytest.mark.clause("run.exec.deadline-elapsed", "run.exec.no-shell")
@pytest.mark.timeout(60)
def test_past_the_deadline_the_group_dies_and_a_leaked_pipe_holder_does_not_hang(tmp_path: Path,
                                                                                 work: Path) -> None:
    binding = Binding("e", command=(*PY, script(tmp_path, "gc.py", GRANDCHILDREN), "hang"), deadline_s=2.0)
    with pytest.raises(DeriveStepTimeout):
        run_chain(binding, "u", media_file(tmp_path), work)
    kept, escaped = map(int, (work / "pids").read_text().split())
    try:
        wait_dead(kept)  # in the step's group: killed with it
    finally:
        os.kill(escaped, signal.SIGKILL)  # it left the group and still holds the pipes: run_chain did not wait


@pytest.mark.clause("run.exec.no-shell")
@pytest.mark.timeout(60)
def test_a_step_that_exits_returns_though_a_leaked_grandchild_holds_its_pipes(tmp_path: Path, work: Path) -> None:
    binding = Binding("e", command=(*PY, script(tmp_path, "gc.py", GRANDCHILDREN), "exit"))
    assert run_chain(binding, "u", media_file(tmp_path), work).output == b"done\n"
    kept, escaped = map(int, (work / "pids").read_text().split())
    try:
        wait_dead(kept)  # no grandchild in the group outlives its step
    finally:
        os.kill(escaped, signal.SIGKILL)


@pytest.mark.clause("run.exec.output-cap")
def test_output_past_the_cap_kills_the_step_and_counts_the_bytes(tmp_path: Path, work: Path) -> None:
    write = script(tmp_path, "write.py", "import sys\nsys.stdout.buffer.write(b'y' * int(sys.argv[1]))\n")
    cap = 100_000
    exact = run_chain(Binding("e", command=(*PY, write, str(cap)), output_cap_bytes=cap), "u",
                      media_file(tmp_path), work)
    assert exact.output == b"y" * cap  # the cap itself is allowed
    with pytest.raises(DeriveOutputCap) as caught:
        run_chain(Binding("e", command=(*PY, write, str(cap + 1)), output_cap_bytes=cap), "u",
                  media_file(tmp_path), work)
    assert (caught.value.step, caught.value.bytes, caught.value.cap) == ("engine", cap + 1, cap)
    assert f"{cap + 1:,} bytes" in str(caught.value)


@pytest.mark.clause("run.exec.output-cap")
@pytest.mark.timeout(60)
def test_an_endless_writer_is_killed_and_drained_even_with_a_leaked_pipe_holder(tmp_path: Path,
                                                                                work: Path) -> None:
    binding = Binding("e", command=(*PY, script(tmp_path, "gc.py", GRANDCHILDREN), "flood"), output_cap_bytes=65536)
    with pytest.raises(DeriveOutputCap) as caught:
        run_chain(binding, "u", media_file(tmp_path), work)
    assert caught.value.bytes > 65536 and caught.value.cap == 65536
    kept, escaped = map(int, (work / "pids").read_text().split())
    try:
        wait_dead(kept)
    finally:
        os.kill(escaped, signal.SIGKILL)


@pytest.mark.clause("run.exec.silent-step")
def test_a_preprocess_step_writing_nothing_is_refused(tmp_path: Path, work: Path) -> None:
    (work / "media.wav").write_bytes(b"left by an earlier attempt")
    binding = Binding("e", command=("/bin/true",),
                      preprocess=(Step("preprocess[0]", ("/bin/true", "{input}", "{output}"), output="media.wav"),))
    with pytest.raises(DeriveStepProducedNothing) as caught:
        run_chain(binding, "u", media_file(tmp_path), work)
    assert (caught.value.step, caught.value.output) == ("preprocess[0]", str(work / "media.wav"))


def test_driver_none_answers_the_last_steps_file(tmp_path: Path, work: Path) -> None:
    binding = Binding("e", driver="none",
                      preprocess=(Step("preprocess[0]", (*PY, script(tmp_path, "copy.py", COPY_STEP), "{input}",
                                                         "{output}"), output="out.ndjson"),))
    media = media_file(tmp_path)
    result = run_chain(binding, "u", media, work)
    assert (result.output, result.steps) == (f"fetched {media}".encode(), ("preprocess[0]",))
    with pytest.raises(DeriveOutputCap) as caught:  # the file is held to the stdout cap
        run_chain(Binding("e", driver="none", preprocess=binding.preprocess, output_cap_bytes=5), "u", media, work)
    assert (caught.value.step, caught.value.bytes) == ("preprocess[0]", len(result.output))


@pytest.mark.clause("run.bind.remote-url-unsupported")
def test_a_url_needs_a_media_is_url_step_or_a_remote_engine(tmp_path: Path, work: Path) -> None:
    url = "https://media.example/talk.wav?x=1;y=$(id)"
    argv_engine = (*PY, script(tmp_path, "engine.py", ARGV_ENGINE), "{input}")
    with pytest.raises(DeriveRemoteUrlUnsupported) as caught:
        run_chain(Binding("e", command=argv_engine), "u", url, work)
    assert (caught.value.engine, caught.value.media) == ("e", url)
    assert 'when = "media_is_url"' in str(caught.value)
    with pytest.raises(DeriveRemoteUrlUnsupported):  # a scheme is case-insensitive
        run_chain(Binding("e", command=argv_engine), "u", "HTTP://media.example/a.wav", work)
    assert json.loads(run_chain(Binding("e", command=argv_engine, remote=True), "u", url, work).output)["argv"] == [url]
    fetch = Step("preprocess[0]", (*PY, script(tmp_path, "copy.py", COPY_STEP), "{input}", "{output}"),
                 when="media_is_url", output="media.wav")
    fetching = Binding("e", command=argv_engine, preprocess=(fetch,))
    result = run_chain(fetching, "u", url, work / "new")  # the work directory is made when missing
    assert result.steps == ("preprocess[0]", "engine")
    assert json.loads(result.output)["argv"] == [str(work / "new" / "media.wav")]
    assert (work / "new" / "media.wav").read_text() == f"fetched {url}"
    local = media_file(tmp_path)
    assert run_chain(fetching, "u", local, work).steps == ("engine",)  # local media skips the fetch


@pytest.mark.clause("run.bind.media-unreadable")
def test_unreadable_media_fails_its_unit_alone_before_any_step(tmp_path: Path, work: Path) -> None:
    marker = work / "ran"
    binding = Binding("e", command=(*PY, script(tmp_path, "mark.py", f"open({str(marker)!r}, 'a').write('x')\n")))
    (tmp_path / "folder").mkdir()
    for media in (str(tmp_path / "missing.wav"), str(tmp_path / "folder"), "talk.wav", "ftp://host/talk.wav", ""):
        with pytest.raises(DeriveMediaUnreadable) as caught:
            run_chain(binding, "unit-7", media, work)
        assert (caught.value.unit, caught.value.media) == ("unit-7", media)
        assert "'unit-7'" in str(caught.value)
    assert not marker.exists()
    assert run_chain(binding, "unit-8", media_file(tmp_path), work).steps == ("engine",)
    assert marker.read_text() == "x"


def test_cancel_kills_the_running_step(tmp_path: Path, work: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(InterruptedError):
        run_chain(Binding("e", command=("/bin/sleep", "300")), "u", media_file(tmp_path), work, cancel)
    assert run_chain(Binding("e", command=("/bin/true",)), "u", media_file(tmp_path), work,
                     threading.Event()).output == b""
