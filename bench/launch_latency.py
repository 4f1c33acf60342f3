"""How soon a local run trains: workers as fresh interpreters vs forked from a fork server.

    python bench/launch_latency.py [--rounds 3] [--suite]

For ``python -m hpctrain`` (the embedded default: 2 ranks, 300 steps) and an 8-rank 3d run
(``parallel=3d cluster.nproc=8``, 5 steps), from the command's start to the first step's log line (both run
with ``trainer.log_every=1``, so step 1 logs one) and to the command's exit, for:

- spawn: ``cluster.fork_server=false``, every rank a fresh interpreter (hpctrain before the fork server);
- per-launch: the default, a server of the launch's own, which the CLI starts while Hydra composes the run;
- per-launch, late: the same server started only when the launcher starts (what starting it early gains);
- persistent: ``HPCTRAIN_FORKSERVER`` naming a server started before the rounds (``python -m
  hpctrain.forkserver --socket PATH``), as on a workstation iterating on runs.

Variants alternate within each round (the order rotates from round to round); medians, and each variant's
ratio to spawn measured in the same run. ``--suite`` also times ``pytest`` of three test files (the local
launcher's, resume's and every layout's) with the session's persistent server and with
``HPCTRAIN_TEST_FORKSERVER=off`` (every rank spawned), alternating.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpctrain.errors import ConfigError  # noqa: E402
from hpctrain.launch.forked import FORKSERVER_ENV, OFF, SERVER_MODULE, ForkServer  # noqa: E402

RUNS = {
    "default (2 ranks)": ["trainer.log_every=1"],
    "3d (8 ranks)": [
        "parallel=3d",
        "parallel.microbatches=2",
        "cluster.nproc=8",
        "trainer.micro_batch_size=2",
        "trainer.max_steps=5",
        "trainer.log_every=1",
    ],
}
# The CLI with the early start switched off: the launcher starts its server when it starts the workers.
LATE = (
    "import sys; from hpctrain.launch import forked; forked.prestart = lambda argv: None; "
    "from hpctrain.cli import main; sys.exit(main(sys.argv[1:]))"
)
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 INFO hpctrain\.observe\.loggers: step 1 \|")


def launch(variant: str, args: list[str], work: Path, server: str) -> tuple[float, float]:
    """Seconds from the command's start to rank 0's step-1 line, and to the command's exit."""
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != FORKSERVER_ENV}
    command = [sys.executable, "-m", "hpctrain", *args, f"hydra.run.dir={run}"]
    if variant == "spawn":
        env[FORKSERVER_ENV] = OFF
    elif variant == "per-launch, late":
        command[1:3] = ["-c", LATE]
    elif variant == "persistent":
        env[FORKSERVER_ENV] = server
    started = time.time()
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True)
    ended = time.time()
    found = STAMP.search((run / "logs" / "rank0.log").read_text())
    assert found, f"{variant}: no step-1 line in rank 0's log"
    first = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return first - started, ended - started


def start_server(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    path = str(work / "s.sock")
    env = {k: v for k, v in os.environ.items() if k != FORKSERVER_ENV}
    server = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, "--socket", path], cwd=REPO, env=env)
    while True:
        try:
            client = ForkServer.connect(path)
            break
        except ConfigError:
            time.sleep(0.05)
    client.ready(timeout=600)
    client.close()
    return server, path


def suite(rounds: int) -> None:
    tests = [
        "tests/e2e/launch/test_local.py",
        "tests/e2e/checkpoint/test_resume.py",
        "tests/e2e/parallel/test_layouts.py",
    ]
    times: dict[str, list[float]] = {"persistent server": [], "spawned ranks": []}
    for i in range(rounds):
        order = list(times) if i % 2 == 0 else list(times)[::-1]
        for name in order:
            env = {k: v for k, v in os.environ.items() if k != FORKSERVER_ENV}
            env["HPCTRAIN_TEST_FORKSERVER"] = "persistent" if name == "persistent server" else "off"
            started = time.monotonic()
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                cwd=REPO,
                env=env,
                check=True,
                capture_output=True,
            )
            times[name].append(time.monotonic() - started)
            print(f"  suite, {name}: {times[name][-1]:.0f} s", flush=True)
    spawned = statistics.median(times["spawned ranks"])
    persistent = statistics.median(times["persistent server"])
    print(
        f"{' + '.join(tests)}: spawned {spawned:.0f} s, persistent server {persistent:.0f} s, "
        f"ratio {persistent / spawned:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suite", action="store_true", help="also time three test files, with and without")
    parser.add_argument("--runs", nargs="*", choices=list(RUNS), default=list(RUNS))
    args = parser.parse_args()
    variants = ["spawn", "per-launch", "per-launch, late", "persistent"]
    with tempfile.TemporaryDirectory(prefix="fsbench") as tmp:
        work = Path(tmp)
        server, path = start_server(work)
        try:
            for name in args.runs:
                got: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
                for i in range(args.rounds):
                    for variant in variants[i % 4 :] + variants[: i % 4]:
                        got[variant].append(launch(variant, RUNS[name], work, path))
                        first, end = got[variant][-1]
                        print(f"  {name}, {variant}: first step {first:.2f} s, exit {end:.2f} s", flush=True)
                base = [statistics.median(x[k] for x in got["spawn"]) for k in (0, 1)]
                print(f"{name}: median of {args.rounds}, ratio to spawn in ()")
                for variant in variants:
                    first, end = (statistics.median(x[k] for x in got[variant]) for k in (0, 1))
                    print(
                        f"  {variant:17s} first step {first:6.2f} s ({first / base[0]:.2f})   "
                        f"exit {end:6.2f} s ({end / base[1]:.2f})",
                        flush=True,
                    )
        finally:
            server.terminate()
            server.wait()
    if args.suite:
        suite(max(1, args.rounds // 2))


if __name__ == "__main__":
    main()
