"""Issue 41, item 3: ``python -m hpctrain … 2>&1 | tee LOG`` and Ctrl-C typed at a terminal.

The terminal sends SIGINT to its whole foreground job: ``tee`` dies at once, while the launcher asks its ranks
(in sessions of their own) to save. Rank 0's next console line then goes into a pipe with no reader: that
killed the rank (rich's BrokenPipeError, ``SystemExit: 1``) and the run read FAILED, a saved step lost. A
signal sent from outside the terminal does not reproduce it, so each test here runs the pipeline as a shell
runs a job: in a pseudo-terminal's session, the pipeline its foreground process group, and ``\\x03`` written
to the terminal, as a person's Ctrl-C is.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import REPO, worker_pids

# One small rank, no periodic checkpoint: the only checkpoint is the one the stop saves.
TINY = [
    "data.max_bytes=60000", "parallel=none", "cluster.nproc=1", "model.n_layers=1", "trainer.eval_every=0",
    "trainer.eval_batches=1", "trainer.log_every=1", "trainer.ckpt_every=0", "optim.warmup_steps=2",
    "trainer.max_steps=100000",
]  # fmt: skip
STOP_LINE = re.compile(r"Stopped by Ctrl-C after step (\d+); checkpoint saved")

# What the pseudo-terminal's session leader runs: a job-control shell's part, in a few lines. The pipeline
# ``hpctrain … 2>&1 | tee LOG`` becomes the terminal's foreground process group (the leader's own is not, so
# the Ctrl-C reaches only the job), and the exit statuses come back as the last line.
JOB = """
import json, os, signal, subprocess, sys
signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # tcsetpgrp from a background group
command, log = json.loads(sys.argv[1]), sys.argv[2]
run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       preexec_fn=lambda: os.setpgid(0, 0))
tee = subprocess.Popen(["tee", log], stdin=run.stdout, preexec_fn=lambda: os.setpgid(0, run.pid))
run.stdout.close()
os.tcsetpgrp(0, run.pid)
codes = {"hpctrain": run.wait(), "tee": tee.wait()}
os.tcsetpgrp(0, os.getpgrp())
print("JOB " + json.dumps(codes), flush=True)
"""


def _ctrl_c_in_a_terminal(args: list[str], cwd: Path, ready: str, timeout: float = 120) -> tuple[str, dict]:
    """``python -m hpctrain ARGS 2>&1 | tee LOG`` in a pseudo-terminal; Ctrl-C typed once ``ready`` shows.
    What the terminal showed, and the job's exit statuses."""
    command = [sys.executable, "-m", "hpctrain", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    pid, master = pty.fork()
    if pid == 0:  # the session leader: the terminal is its controlling terminal
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-c", JOB, json.dumps(command), "LOG"], env)
        finally:
            os._exit(127)
    shown, typed = b"", False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every process of the session closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            if not typed and ready.encode() in shown:
                os.write(master, b"\x03")  # the terminal sends SIGINT to its foreground process group
                typed = True
        else:
            raise AssertionError(f"the pipeline did not end: {shown.decode(errors='replace')[-3000:]}")
        os.waitpid(pid, 0)
    finally:
        os.close(master)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
    text = shown.decode(errors="replace").replace("\r\n", "\n")
    assert typed, f"{ready!r} never showed: {text[-3000:]}"
    job = re.search(r"JOB (\{.*\})", text)  # after the terminal's echo of ^C
    assert job, text[-3000:]
    return text, json.loads(job.group(1))


def _stopped_at_a_saved_step(run: Path, cwd: Path, shown: str) -> None:
    """The run ended as a Ctrl-C without a pipe ends it: STOPPED, its checkpoint committed at the very step
    the one stop line names; no traceback or broken pipe anywhere (terminal, tee's log, rank and command
    logs)."""
    from hpctrain.rundir import checkpoints as layout

    rank0 = (run / "logs" / "rank0.log").read_text()
    command_log = (run / "hpctrain.log").read_text()
    for where, text in (
        ("terminal", shown),
        ("tee", (cwd / "LOG").read_text()),
        ("rank 0", rank0),
        ("hpctrain.log", command_log),
    ):
        assert "Traceback" not in text and "BrokenPipe" not in text, f"{where}: {text[-3000:]}"
    stops = STOP_LINE.findall(rank0)
    assert len(stops) == 1, rank0[-3000:]
    assert len(re.findall(r"stopped by", rank0 + command_log, re.IGNORECASE)) == 1, rank0 + command_log
    step = int(stops[0])
    committed = layout.committed(run / "checkpoints")
    assert [layout.step_of(c) for c in committed] == [step], committed
    assert layout.problem_with(committed[0]) is None
    status = _status(cwd, run)
    assert status.get("state") == "STOPPED" and status.get("step", "").startswith(f"{step}/"), status
    deadline = time.monotonic() + 10
    while worker_pids(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not worker_pids(run)


def _status_text(cwd: Path, target: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "status", str(target)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def _status(cwd: Path, target: Path) -> dict[str, str]:
    lines = [line.split(None, 1) for line in _status_text(cwd, target).splitlines()]
    return {parts[0]: parts[1] for parts in lines if len(parts) == 2}


def test_ctrl_c_of_a_run_piped_to_tee_saves_the_step_and_reads_stopped(tmp_path: Path) -> None:
    shown, codes = _ctrl_c_in_a_terminal(["run=piped", *TINY], tmp_path, ready="step 3 ")
    assert codes["hpctrain"] == 128 + signal.SIGINT, (codes, shown[-3000:])  # as without the pipe
    _stopped_at_a_saved_step(tmp_path / "outputs" / "piped", tmp_path, shown)


def test_ctrl_c_of_a_sweep_piped_to_tee_stops_its_running_member(tmp_path: Path) -> None:
    args = ["-m", "run=piped", "optim.lr=1e-3,3e-4", *TINY]
    shown, codes = _ctrl_c_in_a_terminal(args, tmp_path, ready="step 3 ")
    assert codes["hpctrain"] == 128 + signal.SIGINT, (codes, shown[-3000:])
    sweep = tmp_path / "multirun" / "piped"
    _stopped_at_a_saved_step(sweep / "0", tmp_path, shown)
    # The sweep stops with its running member: the next one never started, and nothing says it ran.
    assert not (sweep / "1" / "config.yaml").exists()
    table = _status_text(tmp_path, sweep)
    assert "1 STOPPED" in table and "FAILED" not in table and "COMPLETED" not in table, table


def test_a_command_whose_stdout_reader_is_gone_exits_as_it_would_have() -> None:
    """The interpreter's flush of sys.stdout at exit, into a pipe with no reader, turned exit 0 into 1 (or
    120) with a BrokenPipeError."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "hpctrain", "--help"],
            cwd=REPO,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert result.returncode == 0 and not result.stderr, result.stderr
