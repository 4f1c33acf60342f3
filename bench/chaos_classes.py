"""The failure classes of issue 43, each injected for real into a run on this machine, and whether hpctrain
classified each attempt's end right and answered it as the class asks.

    python bench/chaos_classes.py            # also: python bench/chaos.py --classes
    python bench/chaos_classes.py --dir D    # keep the run directories in D

Each case is one local run of 2 ranks (the user's bug: 1), ``cluster.max_restarts=2``, 8 steps:

============  ====================================================  ===================================
case          how (real, no flag that pretends)                     expected, per attempt
============  ====================================================  ===================================
kill          ``faults.kill_at=1:3``: rank 1 sends itself SIGKILL  killed → restart
hang          ``faults.stop_at=1:3``: rank 1 stops itself           hung → restart
              (SIGSTOP); its launcher reads its stale heartbeat
user's bug    a ``_target_`` model that raises at its third         raised → restart, raised → stopped
              forward on every attempt                              (the same error at the same step)
full disk     the run directory on a 1,000 KiB tmpfs: the first     storage → stopped
              checkpoint fills it
host OOM      ``faults.oom_at=1:3`` in a memory cgroup of 3 GiB:    out of memory → stopped
              the kernel's OOM killer ends rank 1
============  ====================================================  ===================================

Prints each case's attempts as recorded in faults.jsonl (the class, the answer, the verdict) against the
expected ones, the share of attempts classified right and answered correctly, and the restarts spent on the
user's deterministic bug. A node's device error (a GPU Xid, ECC) needs a GPU: not injected here. Root is
needed for the tmpfs and the cgroup (as in CI).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.limits import join, memory_limit, small_disk  # noqa: E402
from tests.support.user_project import broken_project  # noqa: E402

RUN = ["data.max_bytes=200000", "trainer.eval_batches=1", "logger=jsonl", "trainer.max_steps=8"]
RUN += ["trainer.log_every=1", "trainer.eval_every=0", "cluster.max_restarts=2"]
HANG = ["trainer.watchdog_min_s=2", "trainer.watchdog_factor=5"]
# (case, expected (class, answer) of each attempt in order)
EXPECTED = {
    "kill": [("killed", "restart")],
    "hang": [("hung", "restart")],
    "user's bug": [("raised", "restart"), ("raised", "stopped")],
    "full disk": [("storage", "stopped")],
    "host OOM": [("out of memory", "stopped")],
}


def hpctrain(args: list[str], cwd: Path, group: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Its own fork server (in the cgroup with its ranks, where there is one), this checkout's hpctrain.
    env = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_FORKSERVER"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=(lambda: join(group)) if group is not None else None,
    )


def attempts(run: Path) -> list[dict]:
    """The fault policy's answers, from the run's fault log."""
    from hpctrain.rundir import RunDir

    return RunDir(run).read_answers()


def run_case(case: str, root: Path) -> list[dict]:
    run = root / case.replace(" ", "_").replace("'", "") / "run"
    if case == "kill":
        hpctrain([*RUN, "faults.kill_at=1:3", f"hydra.run.dir={run}"], REPO)
    elif case == "hang":
        hpctrain([*RUN, *HANG, "faults.stop_at=1:3", f"hydra.run.dir={run}"], REPO)
    elif case == "user's bug":
        project = run.parent / "project"
        broken = broken_project(project)
        one = ["parallel=none", "cluster.nproc=1"]
        hpctrain([*broken, *one, *RUN, f"hydra.run.dir={run}"], project)
    elif case == "full disk":
        with small_disk(run.parent / "disk", 1000) as disk:
            run = disk / "run"
            hpctrain([*RUN, "trainer.ckpt_every=2", f"hydra.run.dir={run}"], REPO)
            return attempts(run)
    elif case == "host OOM":
        with memory_limit(3 * 1024**3) as group:
            hpctrain([*RUN, "faults.oom_at=1:3", f"hydra.run.dir={run}"], REPO, group)
    return attempts(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help="where the run directories go (kept)")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="chaos-classes-"))
    right = total = 0
    user_restarts = 0
    for case, expected in EXPECTED.items():
        found = run_case(case, root)
        got = [(r.get("kind"), r.get("action")) for r in found]
        for i, want in enumerate(expected):
            total += 1
            right += i < len(got) and got[i] == want
        total += max(0, len(got) - len(expected))  # an attempt more than the class asks is wrong
        if case == "user's bug":
            user_restarts = sum(1 for r in found if r.get("action") == "restart")
        mark = "right" if got == expected else "WRONG"
        print(f"{case:<11} {mark:<5} expected {expected}, recorded {got}")
        for record in found:
            print(f"{'':<11} {record.get('verdict', record.get('cause', ''))}")
    print(
        f"\nattempts classified and answered right: {right} of {total} ({100 * right / max(total, 1):.0f} %)"
    )
    print(f"restarts spent on the user's deterministic bug: {user_restarts} (the second attempt shows it is)")


if __name__ == "__main__":
    main()
