"""How much hpctrain asks of Slurm's controller: a sweep's submission, ``status``, ``summary`` and ``cancel``
at 10, 100 and 1,000 members, and watchers following jobs for a minute.

    SLURM_CONF=... python bench/rpc.py [--members 10 100 1000] [--watchers 8] [--watch-s 60]
    python bench/rpc.py                 # starts the test cluster itself (root)

Two counts per phase: the requests slurmctld received from this user (``sdiag``'s per-user table, reset
before the phase; ``sdiag``'s own requests left out), and the Slurm client commands hpctrain started (a PATH
shim writes each one down: ``sacct`` goes to slurmdbd, which ``sdiag`` does not count). Sites rate-limit
both per user (snakemake's executor allows 40 calls, then 4 a minute: #467). The sweeps are submitted held
(``+cluster.additional.hold=true``): their members wait in the queue and none runs; ``cancel`` removes them.
The watchers are ``hpctrain logs RUN -f`` of as many members, each of its own process, as a user following
several runs from several shells: they share one ``squeue`` per interval (hpctrain.slurm.watch); the
reference, in the same run, is the same watchers each with a cache of its own (nothing shared). Counts are
figures of a run, printed beside the member count.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.cluster import environment_for_benchmarks  # noqa: E402

CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "sacctmgr")
SWEEP = [
    "cluster=slurm_test",
    "cluster.nodes=1",
    "+cluster.additional.hold=true",
    "data.max_bytes=200000",
    "logger=jsonl",
]
SDIAG_OWN = ("REQUEST_STATS_INFO", "REQUEST_STATS_RESET")


def shim(where: Path, calls: Path) -> str:
    """A folder of client commands that write their name down and run the real one: prepended to PATH."""
    where.mkdir()
    for name in CLIENTS:
        real = subprocess.run(["which", name], capture_output=True, text=True).stdout.strip()
        if not real:
            continue
        script = where / name
        script.write_text(f'#!/bin/sh\necho {name} >> "{calls}"\nexec {real} "$@"\n')
        script.chmod(0o755)
    return str(where)


def reset(env: dict[str, str]) -> None:
    subprocess.run(["sdiag", "--reset"], env=env, check=True, capture_output=True)


def user_requests(env: dict[str, str]) -> int:
    """This user's requests to slurmctld since the reset, sdiag's own (by message type) left out."""
    out = subprocess.run(["sdiag"], env=env, check=True, capture_output=True, text=True).stdout
    by_type, _, by_user = out.partition("Remote Procedure Call statistics by user")
    line = r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)"
    own = sum(int(m.group(2)) for m in re.finditer(line, by_type, flags=re.M) if m.group(1) in SDIAG_OWN)
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    total = sum(int(m.group(2)) for m in re.finditer(line, by_user, flags=re.M) if m.group(1) == me)
    return max(0, total - own)


def clients(calls: Path) -> dict[str, int]:
    names = calls.read_text().split() if calls.exists() else []
    return {name: names.count(name) for name in CLIENTS if name in names}


def phase(env: dict[str, str], calls: Path, argv: list[str], cwd: Path) -> tuple[int, dict[str, int], str]:
    """Run ``python -m hpctrain ARGV``; (slurmctld requests, client commands by name, its output)."""
    calls.unlink(missing_ok=True)
    reset(env)
    result = subprocess.run(
        [sys.executable, "-m", "hpctrain", *argv], cwd=cwd, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"hpctrain {' '.join(argv)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return user_requests(env), clients(calls), result.stdout


def watchers(
    env: dict[str, str],
    calls: Path,
    runs: list[Path],
    seconds: float,
    until_asked: bool = False,
    apart: bool = False,
) -> tuple[int, dict[str, int]]:
    """``hpctrain logs RUN -f`` of each run, in parallel for ``seconds`` (``until_asked``: until each has
    had its first answer, its ``waiting for`` note, at most ``seconds``): (requests, client commands).
    ``apart``: each watcher with a cache of its own, so none shares another's snapshot (the reference)."""
    calls.unlink(missing_ok=True)
    reset(env)
    notes = [calls.with_name(f"watcher{n}.err") for n in range(len(runs))]
    procs = []
    for run, note in zip(runs, notes, strict=True):
        with open(note, "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "hpctrain", "logs", str(run), "-f"],
                    cwd=REPO,
                    env={**env, "HPCTRAIN_CACHE": f"{env['HPCTRAIN_CACHE']}-{note.stem}"} if apart else env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if until_asked and all("waiting for" in note.read_text() for note in notes):
            break
        time.sleep(0.2)
    else:
        if until_asked:
            sys.exit(f"a watcher had no answer in {seconds} s: {[n.read_text()[-500:] for n in notes]}")
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)
    return user_requests(env), clients(calls)


def described(requests: int, by_client: dict[str, int]) -> str:
    listed = ", ".join(f"{name} {n}" for name, n in by_client.items()) or "none"
    return f"{requests:4d} slurmctld requests; clients: {listed}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, nargs="+", default=[10, 100, 1000], help="sweep sizes")
    parser.add_argument("--watchers", type=int, default=8, help="parallel `hpctrain logs -f` processes")
    parser.add_argument("--watch-s", type=float, default=60.0, help="how long the watchers follow")
    opts = parser.parse_args()
    with (
        environment_for_benchmarks(num_nodes=2) as base,
        tempfile.TemporaryDirectory(prefix="hpct-rpc-") as tmp,
    ):
        calls = Path(tmp) / "calls"
        env = {**base, "PATH": f"{shim(Path(tmp) / 'bin', calls)}{os.pathsep}{base['PATH']}"}
        env["HPCTRAIN_CACHE"] = str(Path(tmp) / "cache")  # a watch snapshot of no earlier run
        env.pop("HPCTRAIN_FORKSERVER", None)
        for members in opts.members:
            sweep = Path(tmp) / f"sweep{members}"
            argv = ["-m", *SWEEP, f"trainer.seed=range(0,{members})", f"hydra.sweep.dir={sweep}"]
            started = time.perf_counter()
            submitted = phase(env, calls, argv, REPO)
            seconds = time.perf_counter() - started
            print(
                f"{members:5d} members  submit   {described(*submitted[:2])}  ({seconds:.0f} s)", flush=True
            )
            for command in ("status", "summary"):
                done = phase(env, calls, [command, str(sweep)], REPO)
                print(f"{members:5d} members  {command:<8} {described(*done[:2])}", flush=True)
            if members == opts.members[-1] and opts.watchers:
                runs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())[: opts.watchers]
                shared = watchers(env, calls, runs, opts.watch_s)
                apart = watchers(env, calls, runs, opts.watch_s, apart=True)
                who = f"{len(runs)} watchers (`hpctrain logs RUN -f`) for {opts.watch_s:.0f} s"
                print(f"{who}, sharing the snapshot: {described(*shared)}", flush=True)
                print(f"{who}, each its own (reference): {described(*apart)}", flush=True)
                ratio = shared[0] / apart[0] if apart[0] else float("nan")
                print(f"shared / apart: {ratio:.2f} × the requests", flush=True)
            done = phase(env, calls, ["cancel", str(sweep)], REPO)
            print(f"{members:5d} members  cancel   {described(*done[:2])}", flush=True)


if __name__ == "__main__":
    main()
