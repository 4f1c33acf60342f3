"""Every rank's stacks on request (hpctrain.resilience.stacks): a real thread blocked in a function answers
from another thread, the request's name stays inside stacks/, ranks are grouped by their innermost frame."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpctrain.resilience import stacks
from hpctrain.rundir import RunDir


def blocked_in_a_collective(release: threading.Event) -> None:
    release.wait()


def test_a_request_is_answered_with_every_threads_stack(tmp_path: Path):
    answerer = stacks.Answerer(tmp_path, 3)
    answerer.poll()  # no request: nothing written
    assert not RunDir(tmp_path).stacks.exists()
    release = threading.Event()
    worker = threading.Thread(target=blocked_in_a_collective, args=(release,), name="loop")
    worker.start()
    try:
        name = stacks.ask(tmp_path)
        answerer.poll()
        text = RunDir(tmp_path).stack_dump(name, 3).read_text()
    finally:
        release.set()
        worker.join()
    assert text.startswith("Thread MainThread (most recent call last):"), text[:200]
    assert "Thread loop (most recent call last):" in text and "in blocked_in_a_collective" in text
    answerer.poll()  # the same request again: answered once
    assert len(list(RunDir(tmp_path).stacks.iterdir())) == 2  # request.json and the one folder


def test_a_request_named_outside_stacks_is_not_answered(tmp_path: Path):
    answerer = stacks.Answerer(tmp_path, 0)
    for bad in ("../outside", "", "a\x01b", "x" * 200):
        RunDir(tmp_path).stacks.mkdir(exist_ok=True)
        RunDir(tmp_path).stacks_request.write_text(json.dumps({"name": bad, "time": time.time()}))
        time.sleep(0.01)  # a new mtime
        answerer.poll()
    assert not (tmp_path / "outside").exists()
    assert [p.name for p in RunDir(tmp_path).stacks.iterdir()] == ["request.json"]
    RunDir(tmp_path).stacks_request.write_text("{not json")
    answerer.poll()  # a torn request: nothing, no error


def _dump(*frames: tuple[str, int, str]) -> str:
    lines = "".join(f'  File "{file}", line {line}, in {name}\n    x\n' for file, line, name in frames)
    return f"Thread MainThread (most recent call last):\n{lines}\nThread watchdog (most recent call last):\n"


def test_ranks_are_grouped_by_where_their_main_thread_stands():
    torch_frame = ("/v/site-packages/torch/distributed/c10d.py", 9, "all_reduce")
    collective = _dump(("/x/hpctrain/train/step.py", 88, "step"), torch_frame)
    loader = _dump(("/x/hpctrain/data/loader.py", 141, "next_batch"))
    found = {0: collective, 1: collective, 2: collective, 3: loader, 4: collective, 7: collective}
    assert stacks.group(found) == [
        "ranks 0-2, 4, 7: all_reduce (torch/distributed/c10d.py:9)",
        "rank 3: next_batch (hpctrain/data/loader.py:141)",
    ]
    assert stacks.innermost("nothing") == "no Python frame"


STOPPED = """
import os, signal, sys
def wait_here():
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSTOP)
wait_here()
"""


def test_a_stopped_process_is_read_from_outside_by_py_spy(tmp_path: Path):
    """A SIGSTOPped process answers no request; py-spy reads where it stands without pausing it, and the
    grouping reads py-spy's order (innermost first). py-spy is in the dev extra: CI has it."""
    assert stacks.spy_path() is not None, "py-spy is in hpctrain's dev extra (pip install -e '.[dev]')"
    child = subprocess.Popen([sys.executable, "-c", STOPPED], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10
        while _state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        path = stacks.dump_stopped(tmp_path, "stall-x-rank3", 3, child.pid)
        assert path == RunDir(tmp_path).stack_dump("stall-x-rank3", 3)
        text = path.read_text()
        assert text.startswith(stacks.SPY_HEADER) and stacks.innermost(text) == "wait_here (<string>:5)", text
        assert stacks.group({3: text, 0: _dump(("/x/hpctrain/train/step.py", 88, "step"))}) == [
            "rank 0: step (hpctrain/train/step.py:88)",
            "rank 3: wait_here (<string>:5)",
        ]
    finally:
        child.kill()
        child.wait()
    # Gone, or py-spy missing: a line that says what would read it, never a false frame.
    (tmp_path / "gone").mkdir()
    missing = stacks.dump_stopped(tmp_path / "gone", "stall-y", 1, child.pid)
    assert missing is not None and stacks.innermost(missing.read_text()).startswith("does not run")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]
