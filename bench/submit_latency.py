"""How long ``python -m hpctrain ... cluster=slurm_test`` takes to return, beside Python and torch imports.

    SLURM_CONF=... python bench/submit_latency.py [--runs 5]     # against a running cluster
    python bench/submit_latency.py                                # starts the test cluster itself (root)

Median of ``--runs`` invocations each of: a submission (until the command returns with the job queued), a
sweep of 2 members (one job array), the floor (``sbatch --parsable --wrap true``: Slurm's own client and
slurmctld), ``hpctrain --help``, ``hpctrain status`` of the submitted run, ``python -c pass`` and
``python -c "import torch"``, measured in this run on this machine, alternating; beside each wall time the
CPU seconds (user + system) the command's processes used, which a machine that other work keeps busy
inflates far less than the wall time. Then one submission again under ``python -X importtime``: the total time
spent importing, the largest top-level imports, and whether torch (or another heavy library) was imported;
and the number of ``sbatch`` calls each kind of submission made (a wrapper on PATH counts them). Target:
hpctrain's own time (a submission less the floor) ≤ 0.6 s, one sbatch
call per job or array, no torch. Submitted jobs are cancelled at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.cluster import environment_for_benchmarks  # noqa: E402

HEAVY = ("torch", "numpy", "transformers", "wandb", "tensorboard", "safetensors", "pandas", "scipy")
TARGET_S = 0.6


def timed(cmd: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall seconds of ``cmd``; its CPU seconds (user + system, its children included) appended to ``cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


def counting_sbatch(work: Path, env: dict[str, str]) -> tuple[dict[str, str], Path]:
    """An environment whose ``sbatch`` appends a line to a log, then runs the real one."""
    real = shutil.which("sbatch", path=env.get("PATH"))
    if real is None:
        sys.exit("no sbatch on PATH")
    shim_dir, log = work / "shim", work / "sbatch-calls.log"
    shim_dir.mkdir()
    shim = shim_dir / "sbatch"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    return {**env, "PATH": f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"}, log


def import_profile(cmd: list[str], env: dict[str, str]) -> tuple[float, list[tuple[float, str]], list[str]]:
    """Total import seconds, the largest top-level imports, and the heavy libraries imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd[1:]], cwd=REPO, env=env, capture_output=True, text=True
    )
    top: list[tuple[float, str]] = []
    names = set()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if not cumulative.strip().isdigit():
            continue  # the header line
        names.add(name.strip().split(".")[0])
        if name.startswith(" ") and not name.startswith("  "):  # a top-level import
            top.append((int(cumulative) / 1e6, name.strip()))
    top.sort(reverse=True)
    return sum(s for s, _ in top), top[:6], sorted(n for n in HEAVY if n in names)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    with (
        environment_for_benchmarks() as cluster_env,
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp,
    ):
        env, calls = counting_sbatch(Path(tmp), cluster_env)
        # Held (as the floor's job is): a job that started would import torch on this machine's cores while
        # the next submissions are timed (the first run was 0.7 s, the next ones 1.5 s, when they ran).
        held = ["cluster=slurm_test", "trainer.max_steps=1", "cluster.additional.hold=true"]
        single = [sys.executable, "-m", "hpctrain", *held]
        sweep = [sys.executable, "-m", "hpctrain", "-m", *held]
        kinds = ("submit", "sweep", "floor", "help", "status", "pass", "torch")
        times: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        # The floor: Slurm's own client submitting a trivial script to the same cluster (its process start,
        # munge credential and slurmctld round trip), which no submission can go below.
        floor = ["sbatch", "--parsable", "--hold", "--job-name=hpctrain", "--output=/dev/null"]
        floor += ["--wrap", "true"]
        sbatch_calls: dict[str, list[int]] = {"submit": [], "sweep": []}
        for i in range(opts.runs):
            for kind, cmd in (
                ("submit", [*single, f"hydra.run.dir={tmp}/run{i}"]),
                ("sweep", [*sweep, "optim.lr=1e-3,3e-4", f"hydra.sweep.dir={tmp}/sweep{i}"]),
            ):
                before = len(calls.read_text().splitlines()) if calls.exists() else 0
                times[kind].append(timed(cmd, env, cpu[kind]))
                sbatch_calls[kind].append(len(calls.read_text().splitlines()) - before)
            others = {
                "floor": floor,
                "help": [sys.executable, "-m", "hpctrain", "--help"],
                "status": [sys.executable, "-m", "hpctrain", "status", f"{tmp}/run{i}"],
                "pass": [sys.executable, "-c", "pass"],
                "torch": [sys.executable, "-c", "import torch"],
            }
            for kind, cmd in others.items():
                times[kind].append(timed(cmd, cluster_env if kind == "floor" else env, cpu[kind]))
        imports, top, heavy = import_profile([*single, f"hydra.run.dir={tmp}/profiled"], env)
        subprocess.run(["scancel", "--name=hpctrain"], env=env, check=False)

    rows = [
        ("python -m hpctrain ... cluster=slurm_test", "submit"),
        ("python -m hpctrain -m ... (2 members, 1 array)", "sweep"),
        ("sbatch --parsable --wrap true (the floor)", "floor"),
        ("python -m hpctrain --help", "help"),
        ("python -m hpctrain status RUN_DIR (queued)", "status"),
        ("python -c pass", "pass"),
        ('python -c "import torch"', "torch"),
    ]
    for name, key in rows:
        runs = ", ".join(f"{t:.3f}" for t in times[key])
        wall, used = statistics.median(times[key]), statistics.median(cpu[key])
        print(f"{name:48s} median {wall:6.3f} s, CPU {used:6.3f} s (runs: {runs})")
    submit, torch_import = statistics.median(times["submit"]), statistics.median(times["torch"])
    print(f"submission / torch import = {submit / torch_import:.2f}")
    floor_s = statistics.median(times["floor"])
    print(f"submission / sbatch floor = {submit / floor_s:.2f} (hpctrain's share: {submit - floor_s:.3f} s)")
    own_cpu = statistics.median(cpu["submit"]) - statistics.median(cpu["floor"])
    print(f"hpctrain's own CPU per submission (submission's CPU - the floor's): {own_cpu:.3f} s")
    print(
        f"sbatch calls per submission: {sorted(set(sbatch_calls['submit']))}, per sweep: "
        f"{sorted(set(sbatch_calls['sweep']))} (target: 1)"
    )
    print(
        f"imports of one submission (-X importtime): {imports:.3f} s in all; largest: "
        + ", ".join(f"{name} {s:.3f}" for s, name in top)
    )
    print(f"heavy libraries imported: {', '.join(heavy) or 'none'}")
    own = submit - floor_s
    verdict = "met" if own <= TARGET_S else "MISSED"
    print(f"target: hpctrain's own time per submission ≤ {TARGET_S} s: {verdict} ({own:.3f} s)")


if __name__ == "__main__":
    main()
