"""The local launcher end to end (hpctrain.launch.local): the embedded default run, dying workers, a dying
launcher, Ctrl-C. (Its dry run: tests/unit/launch/test_dry_run.py; W&B offline:
tests/e2e/observe/test_wandb.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import FAST, REPO, hpctrain, metrics, worker_pids


def test_bare_command_trains_and_says_where_outputs_are(tmp_path: Path):
    started = time.monotonic()
    result = hpctrain(cwd=tmp_path, timeout=240)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    run_dirs = list((tmp_path / "outputs").glob("*/*"))
    assert len(run_dirs) == 1
    run = run_dirs[0].resolve()
    assert f"Outputs in {run}" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "checkpoints", "logs"):
        assert str(run / name) in result.stdout
    losses = [r["loss"] for r in metrics(run)]
    assert len(losses) >= 10
    assert losses[-1] < 0.7 * losses[0], f"loss did not decrease enough: {losses}"
    assert sorted(p.name for p in (run / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]
    # No warning of any kind (deprecations, FutureWarnings, torch's or ours) in a default run (issue 17, e).
    # It is also the README's `python -m hpctrain`, run here for tests/e2e/test_readme_commands.py.
    for text in (result.stdout, result.stderr, *(p.read_text() for p in (run / "logs").glob("*.log"))):
        assert "warning" not in text.lower() and "Traceback" not in text, text[-2000:]
    print(f"default run: {elapsed:.1f} s, loss {losses[0]:.3f} → {losses[-1]:.3f}")


def _start(run: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    args = [*FAST, "trainer.max_steps=100000", "trainer.log_every=1", "trainer.ckpt_every=0", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_training(run: Path, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run / "metrics.jsonl").exists() and len(metrics(run)) >= 3:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("training did not start")


def _rank_pid(run: Path, rank: int) -> int:
    match = re.search(r"rank \d+/\d+ on .*, pid (\d+)", (run / "logs" / f"rank{rank}.log").read_text())
    assert match, f"rank {rank} did not log its pid"
    return int(match.group(1))


def _assert_no_workers_left(run: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while worker_pids(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not worker_pids(run), f"orphans: {worker_pids(run)}"


def test_sigkilled_worker_stops_the_run_and_is_named(run_dir: Path):
    proc = _start(run_dir)
    try:
        _wait_for_training(run_dir, proc)
        victim = _rank_pid(run_dir, 1)
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=30)  # the others stop within kill_grace_s, not at max_steps
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    first = stderr.strip().splitlines()[0]
    assert first.startswith(f"hpctrain: rank 1 (pid {victim}) was killed by SIGKILL"), stderr
    _assert_no_workers_left(run_dir)


def test_killed_launcher_leaves_no_workers(run_dir: Path):
    proc = _start(run_dir)
    try:
        _wait_for_training(run_dir, proc)
        assert len(worker_pids(run_dir)) == 2
        proc.kill()  # SIGKILL: the launcher gets no chance to clean up
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _assert_no_workers_left(run_dir)


def test_interrupted_launcher_stops_workers(run_dir: Path):
    proc = _start(run_dir)
    try:
        _wait_for_training(run_dir, proc)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT
    _assert_no_workers_left(run_dir)


def test_ctrl_c_lets_a_slow_step_finish_and_save(run_dir: Path):
    """A step longer than cluster.kill_grace_s: the workers are not killed before they have saved."""
    proc = _start(run_dir, "faults.slow_rank=0:2", "cluster.kill_grace_s=0.5")
    try:
        _wait_for_training(run_dir, proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-2000:]
    saved = sorted((run_dir / "checkpoints").glob("step_*"))
    assert saved, f"no checkpoint after Ctrl-C: {stderr[-2000:]}"
    assert "checkpoint saved" in (run_dir / "logs" / "rank0.log").read_text()
    _assert_no_workers_left(run_dir)


def test_a_ctrl_c_while_the_ranks_start_is_held_until_they_can_save(run_dir: Path):
    """Ctrl-C before any worker is up (the launch's own fork server still importing torch): each worker
    starts with the stop signals blocked and takes the forwarded SIGINT once its handlers are in, so the run
    stops after its first step with a checkpoint, not with a KeyboardInterrupt in a rank's start-up."""
    own_server = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_FORKSERVER"}
    proc = _start(run_dir, env=own_server)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "logs").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        time.sleep(0.3)  # the launcher's handler is in; its fork server takes seconds more
        assert not list((run_dir / "logs").glob("rank*.log")), "a worker was up already: too late to test"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-2000:]
    logs = [p.read_text() for p in sorted((run_dir / "logs").glob("rank*.log"))]
    assert len(logs) == 2 and not [log for log in logs if "Traceback" in log], logs
    assert "Stopped by Ctrl-C after step" in logs[0] and "checkpoint saved" in logs[0], logs[0][-2000:]
    assert sorted((run_dir / "checkpoints").glob("step_*")), "no checkpoint"
    _assert_no_workers_left(run_dir)


def test_a_second_ctrl_c_stops_at_once(run_dir: Path):
    proc = _start(run_dir, "faults.slow_rank=0:60", "cluster.kill_grace_s=0.5")
    try:
        deadline = time.monotonic() + 90
        log = run_dir / "logs" / "rank0.log"
        while not (log.exists() and "Training from step" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(1)  # inside the first (60 s) step
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        assert proc.poll() is None, "the first Ctrl-C must wait for the step"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)  # at once: the step it is in sleeps 60 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT
    _assert_no_workers_left(run_dir)
