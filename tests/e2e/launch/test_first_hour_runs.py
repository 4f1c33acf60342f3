"""Issue 29, items 2-4, through real processes: a named run is continued by the same command; every stop
prints the command that continues it; ``hpctrain resume`` continues the latest run; ``status`` says RUNNING,
COMPLETED, FAILED or STOPPED, the failure's line and exits 1 for a failed run; a refused resume, a fresh
start over a run, a folder of the user's and another run's checkpoint folder change nothing; a checkpoint
the run skipped is never overwritten; a stop that reached the workers but not the launcher is not exit 0."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# A tiny run, packed as a command line reads (a table of overrides).
TINY = [
    "data.max_bytes=60000", "logger=jsonl", "parallel=none", "cluster.nproc=1", "model.n_layers=1",
    "trainer.eval_every=0", "trainer.eval_batches=1", "trainer.log_every=1", "trainer.ckpt_every=2",
    "trainer.keep_last=10", "optim.warmup_steps=2",
]  # fmt: skip


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def steps(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip() and "loss" in json.loads(line)]


def fields(text: str) -> dict[str, str]:
    return {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines() if len(line.split()) > 1}


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".lock" not in p.name
    }


def _one_line(result: subprocess.CompletedProcess[str], words: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and words in lines[0], result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def stopped(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[str], subprocess.CompletedProcess[str]]:
    """A named run stopped by Ctrl-C (SIGINT to the command) after a few steps: (folder, command, result)."""
    here = tmp_path_factory.mktemp("named")
    command = ["run=first", *TINY, "trainer.max_steps=8", "faults.slow_rank=0:0.4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *command],
        cwd=here,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    metrics = here / "outputs" / "first" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    return here, command, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_stop_prints_the_command_that_continues_it_and_status_says_stopped(stopped):
    here, _, result = stopped
    assert result.returncode == 130, result.stderr
    assert "continue with: hpctrain resume outputs/first" in result.stdout + result.stderr, result.stderr
    status = cli("status", cwd=here)  # no TARGET: the latest run
    assert status.returncode == 0, status.stderr
    got = fields(status.stdout)
    assert got["state"] == "STOPPED" and got["continue"] == "hpctrain resume outputs/first", status.stdout


def test_a_ctrl_c_prints_one_stop_line_that_says_ctrl_c(stopped):
    """Issue 41: one stop line, rank 0's, naming the key the user pressed (not the SIGTERM the launcher sent
    its ranks), then only the way on; before, four lines said it (rank 0 twice, the launcher twice)."""
    _, _, result = stopped
    shown = result.stdout + result.stderr
    stops = [line for line in shown.splitlines() if re.search(r"\bstopped (by|at)\b", line, re.IGNORECASE)]
    assert len(stops) == 1, shown
    assert re.fullmatch(r"Stopped by Ctrl-C after step \d+; checkpoint saved \(.*\)", stops[0]), shown
    assert "SIGTERM" not in shown and "SIGINT" not in shown, shown


def test_the_same_command_again_continues_the_run(stopped):
    here, command, _ = stopped
    run = here / "outputs" / "first"
    before = steps(run)
    again = cli(*command, cwd=here)
    assert again.returncode == 0, again.stderr
    assert "Resumed from" in again.stdout + again.stderr
    after = steps(run)
    assert after[-1] == 8 and after == sorted(set(after)), after  # every step once, none from scratch
    assert after[: len(before)] == before
    assert [p.name for p in (here / "outputs").iterdir()] == ["first"]
    status = cli("status", str(run), cwd=here)
    assert fields(status.stdout)["state"] == "COMPLETED" and "continue" not in fields(status.stdout)


def test_resume_continues_the_latest_run_with_a_longer_schedule_without_a_jump(stopped):
    here, _, _ = stopped
    run = here / "outputs" / "first"
    if steps(run)[-1] < 8:
        pytest.skip("needs the continued run of the test before")
    lrs = {
        json.loads(line)["step"]: json.loads(line)["lr"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
    }
    result = cli("resume", "trainer.max_steps=12", cwd=here.parent)  # elsewhere: no latest run there
    assert result.returncode == 2 and "no run in" in result.stderr
    result = cli("resume", "trainer.max_steps=12", cwd=here)
    assert result.returncode == 0, result.stderr
    assert "hpctrain: continuing" in result.stdout
    new = {
        json.loads(line)["step"]: json.loads(line)["lr"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
    }
    assert max(new) == 12
    # The schedule ended at step 8 on its floor: it goes on from there, never back up (no silent jump).
    assert all(new[s] <= lrs[8] * (1 + 1e-9) for s in range(9, 13)), (lrs[8], new)


def test_what_a_resume_cannot_continue_changes_nothing(stopped, tmp_path: Path):
    here, command, _ = stopped
    run = here / "outputs" / "first"
    before = tree(run)
    # The seed: refused before anything is written.
    _one_line(cli(*command, "trainer.seed=7", cwd=here), "trainer.seed=7: checkpoint")
    # A fresh start over a run's checkpoints and metrics.
    _one_line(cli(*command, "trainer.resume=never", cwd=here), "trainer.resume=never")
    # Two processes: the kept global batch of one process (16) does not split into 2 × 16.
    two = [a for a in command if not a.startswith(("parallel=", "cluster.nproc="))]
    line = _one_line(cli(*two, "parallel=ddp", "cluster.nproc=2", cwd=here), "trainer.global_batch_size")
    assert "the resume keeps step_" in line and "global batch of 16" in line
    assert tree(run) == before  # refused before anything was written: not one byte changed
    # A model shape: refused when the checkpoint loads (in the workers); what the run made stays as it was,
    # and config.yaml is again the one its checkpoints were trained with.
    shape = cli(*command, "trainer.max_steps=20", "model.d_model=96", cwd=here)
    assert shape.returncode != 0 and "CheckpointMismatch" in shape.stderr, shape.stderr
    after = tree(run)
    kept = [k for k in before if k.startswith("checkpoints/") or k in ("metrics.jsonl", "config.yaml")]
    assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}
    # A folder of the user's, and another run's checkpoint folder.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my: own\n")
    _one_line(cli(*TINY, f"hydra.run.dir={mine}", cwd=here), "not an hpctrain run")
    assert [p.name for p in mine.iterdir()] == ["config.yaml"] and (
        mine / "config.yaml"
    ).read_text() == "my: own\n"
    # (issue 41: named for what it is, a run's checkpoints folder, which only the checkpoint manager writes)
    _one_line(cli(*TINY, f"hydra.run.dir={run / 'checkpoints'}", cwd=here), "is a run's checkpoints folder")
    assert tree(run) == after


def test_a_failed_run_is_failed_with_its_line_and_the_users_frames(tmp_path: Path):
    project = tmp_path / "proj"
    (project / "conf" / "data").mkdir(parents=True)
    (project / "blobs_e2e").mkdir()
    (project / "blobs_e2e" / "__init__.py").write_text("")
    (project / "blobs_e2e" / "data.py").write_text(
        "import torch\n\n"
        "class Blobs(torch.utils.data.Dataset):\n"
        "    def __init__(self, split):\n"
        "        self.x = torch.randint(0, 256, (400, 17))\n\n"
        "    def __len__(self):\n        return len(self.x)\n\n"
        "    def __getitem__(self, i):\n"
        "        if i >= 200:  # the pre-flight probe reads the first items only\n"
        "            return self.xs[i][:-1], self.x[i][1:]\n"
        "        return self.x[i][:-1], self.x[i][1:]\n"
    )
    (project / "conf" / "data" / "blobs.yaml").write_text("_target_: blobs_e2e.data.Blobs\n")
    args = [
        "--config-dir",
        "conf",
        "data=blobs",
        *TINY,
        "model.seq_len=16",
        "run=bad",
        "trainer.max_steps=10",
    ]
    result = cli(*args, cwd=project)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Traceback of your code (most recent call last):", result.stderr
    assert "return self.xs[i][:-1], self.x[i][1:]" in result.stderr
    assert "/hpctrain/" not in "\n".join(lines[:-1])
    assert lines[-1].startswith("hpctrain: rank 0") and "AttributeError" in lines[-1], result.stderr
    status = cli("status", cwd=project)
    assert status.returncode == 1, status.stdout
    got = fields(status.stdout)
    assert got["state"] == "FAILED" and "AttributeError" in got["error"], status.stdout
    assert got["continue"] == "hpctrain resume outputs/bad"
    follow = cli("logs", "outputs/bad", "-f", "-n", "3", cwd=project, timeout=60)  # a finished run: returns
    assert follow.returncode == 0 and "AttributeError" in follow.stdout, follow.stderr


def test_a_stop_only_the_workers_got_is_not_exit_0_and_a_skipped_checkpoint_is_never_overwritten(
    tmp_path: Path,
):
    from hpctrain.rundir import checkpoints as layout

    run = tmp_path / "run"
    first = cli(*TINY, "trainer.max_steps=4", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    damaged = run / "checkpoints" / "step_00000004"
    shard = next(p for p in damaged.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-7] + b"garbage")  # damaged: the resume skips it, loads step 2
    kept = tree(damaged)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = [*TINY, "trainer.max_steps=40", "faults.slow_rank=0:0.3", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and max(steps(run), default=0) < 6:
        time.sleep(0.2)
    worker = next(
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and b"hpctrain.worker" in _cmdline(p) and str(run).encode() in _cmdline(p)
    )
    os.kill(worker, signal.SIGTERM)  # the worker alone: the launcher never saw a signal
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, out + err
    assert "continue with: hpctrain resume" in out + err
    assert max(steps(run)) < 40
    aside = [p for p in (run / "checkpoints").iterdir() if p.name.startswith("step_00000004.")]
    assert len(aside) == 1 and tree(aside[0]) == kept  # the damaged one, byte for byte, moved aside
    assert layout.problem_with(damaged) is None  # the resumed run's own step 4
    status = cli("status", str(run), cwd=tmp_path)
    assert fields(status.stdout)["state"] == "STOPPED"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
