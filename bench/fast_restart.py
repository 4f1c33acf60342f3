"""A restart inside the job from the fast tier vs one from the shared checkpoint: process start → the first
step after it, GPT-2 small (124M parameters, AdamW: 1.4 GiB of state).

    python bench/fast_restart.py [--rounds 2] [--seq-len 64] [--dir /tmp] [--inside]

One process (``cluster.nproc=1``, fp32, synthetic tokens, ``model=gpt2_124m`` at ``--seq-len``), under
``--dir``. Per round, the two cases alternate (A/B in the same run, so the machine's noise falls on both):

- **shared**: a run trains 2 steps and saves ``step_2`` in the run directory (synchronously, at its end);
  its files are dropped from the page cache (``posix_fadvise``: the shared file system is read cold, as a
  restarted job on another node reads it), and a restart trains step 3 from it.
- **fast**: a run with ``checkpoint.local_every=1`` under a fixed ``HPCTRAIN_JOB_ID`` kills itself with
  SIGKILL at the start of step 4 (``faults.kill_at``: its copy of step 2 or 3 is in ``/dev/shm``), and the
  restart with the same job id loads the fast tier and trains from there.

Each restart is timed from just before ``python -m hpctrain`` starts to the ``time`` of its first
metrics.jsonl record (``trainer.log_every=1``), and split with rank 0's log: launch (interpreter, imports,
spawn, rendezvous), build (model, optimizer, data), load (the resume's "checked and loaded in" figure), and
the step itself. Prints each round, the medians, and the ratios shared ÷ fast of the whole restart, of the
part in the process (build + load + step) and of the load alone. A timing is a figure, never an assertion.

``--inside`` restarts inside one launch instead, as a job restarts a failed rank without a requeue: the
launcher (``cluster.max_restarts=1``) forks the new worker from its fork server, torch already imported
(:func:`inside_restart`); timed from the SIGKILL's log line to the first step after the restart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resume_cost import drop_from_cache, filesystem, first, hpctrain_run, log_lines, timed_start

from hpctrain.rundir import checkpoints as layout

KILL_AT = 5  # the step rank 0 kills itself at in --inside: steps 1..KILL_AT-1 were done before
TRAINING_FROM = re.compile(r"^Training from step (\d+) ")
LOADED = re.compile(r"^Resumed from .*(?:checked and loaded|files checked and loaded) in ([\d.]+) s")


def base(run: Path, seq_len: int, *extra: str) -> list[str]:
    return [
        "model=gpt2_124m",
        f"model.seq_len={seq_len}",
        "data=synthetic",
        "data.num_samples=64",
        "cluster.nproc=1",
        "parallel=none",
        "trainer.global_batch_size=1",
        "trainer.micro_batch_size=1",
        "trainer.precision=fp32",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "trainer.ckpt_every=0",
        "logger=jsonl",
        f"hydra.run.dir={run}",
        *extra,
    ]


def load_seconds(run: Path) -> float:
    found = [float(m[1]) for _, text in log_lines(run) if (m := LOADED.match(text))]
    return found[-1] if found else float("nan")


def shared_restart(root: Path, seq_len: int) -> dict[str, float]:
    run = root / f"shared-{uuid.uuid4().hex[:6]}"
    hpctrain_run(base(run, seq_len, "trainer.max_steps=2"))
    for path in (run / "checkpoints" / layout.checkpoint_name(2)).rglob("*"):
        if path.is_file():
            drop_from_cache(path)
    (run / "metrics.jsonl").unlink()
    (run / "logs" / "rank0.log").unlink()
    launched = hpctrain_run(base(run, seq_len, "trainer.max_steps=3"))
    return _figures(run, launched)


def fast_restart(root: Path, seq_len: int) -> dict[str, float]:
    run = root / f"fast-{uuid.uuid4().hex[:6]}"
    job = f"bench-{uuid.uuid4().hex[:8]}"
    args = ("checkpoint.local_every=1", "trainer.max_steps=5")
    env = {layout.JOB_ID_ENV: job}
    hpctrain_run(base(run, seq_len, *args, "faults.kill_at=0:4"), env=env, ok=False)
    (run / "metrics.jsonl").unlink()
    (run / "logs" / "rank0.log").unlink()
    try:
        launched = hpctrain_run(base(run, seq_len, *args), env=env)
        figures = _figures(run, launched)
    finally:
        layout.FastTierPaths(Path("/dev/shm"), layout.run_key(run), f"local-{job}").remove_job()
    if "fast tier" not in (run / "logs" / "rank0.log").read_text():
        sys.exit(f"{run}: the restart did not load the fast tier")
    return figures


def inside_restart(root: Path, seq_len: int, case: str) -> dict[str, float]:
    """``--inside``: one launch with ``cluster.max_restarts=1``; rank 0 kills itself (SIGKILL) at the start of
    step KILL_AT and the launcher restarts its worker inside the same job (forked from its fork server:
    torch is imported already), which loads the shared checkpoint (``trainer.ckpt_every=1``, synchronous,
    written with ``O_DIRECT``: not in the page cache) or its fast-tier copy (``checkpoint.local_every=1``,
    written in the background: the newest complete one may be a step older). Timed from the kill's log line
    to the first step's record after the restart (not the run's last step, which evaluates); ``again``:
    steps redone."""
    run = root / f"inside-{case}-{uuid.uuid4().hex[:6]}"
    tier = "trainer.ckpt_every=1" if case == "shared" else "checkpoint.local_every=1"
    args = [a for a in base(run, seq_len) if a != "trainer.ckpt_every=0" or case == "fast"]
    hpctrain_run(
        [*args, tier, "trainer.max_steps=7", "cluster.max_restarts=1", f"faults.kill_at=0:{KILL_AT}"]
    )
    lines = log_lines(run)
    killed, _ = first(lines, "Killing this rank")
    after = [(t, text) for t, text in lines if t >= killed]
    rank_up, _ = first(after, "rank 0/")
    training, text = first(after, "Training from step")
    loads = [float(m[1]) for _, line in after if (m := LOADED.match(line))]
    if not loads or (case == "fast") != any("fast tier" in line for _, line in after):
        sys.exit(f"{run}: the restart did not load the {case} tier")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stepped = next(r["time"] for r in records if r["time"] > training)
    return {
        "total": stepped - killed,
        "launch": rank_up - killed,
        "build": training - rank_up - loads[0],
        "load": loads[0],
        "step": stepped - training,
        "in_process": stepped - rank_up,
        "again": KILL_AT - 1 - int(TRAINING_FROM.match(text)[1]),
    }


def _figures(run: Path, launched: float) -> dict[str, float]:
    start = timed_start(run, launched)
    load = load_seconds(run)
    return {
        "total": start.total,
        "launch": start.launch,
        "build": start.build + start.check + start.load - load,
        "load": load,
        "step": start.first_step,
        "in_process": start.build + start.check + start.load + start.first_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument(
        "--inside", action="store_true", help="restarts inside one launch (see inside_restart)"
    )
    opts = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    print(
        f"gpt2_124m (seq {opts.seq_len}), 1 process, fp32, AdamW; runs under {opts.dir} "
        f"({filesystem(opts.dir)}), fast tier in /dev/shm; {opts.rounds} round(s), A/B alternating; "
        f"{'restarts inside one launch' if opts.inside else 'restarts through the command'}",
        flush=True,
    )
    rows: dict[str, list[dict[str, float]]] = {"shared": [], "fast": []}
    with tempfile.TemporaryDirectory(prefix="hpctrain-fast-restart-", dir=opts.dir) as tmp:
        for round_ in range(opts.rounds):
            order = ("shared", "fast") if round_ % 2 == 0 else ("fast", "shared")
            for case in order:
                if opts.inside:
                    figures = inside_restart(Path(tmp), opts.seq_len, case)
                else:
                    figures = (shared_restart if case == "shared" else fast_restart)(Path(tmp), opts.seq_len)
                rows[case].append(figures)
                print(
                    f"  round {round_ + 1} {case:>6}: {'kill' if opts.inside else 'restart'} → first step "
                    f"{figures['total']:6.2f} s "
                    f"(launch {figures['launch']:.2f}, build {figures['build']:.2f}, "
                    f"load {figures['load']:.2f}, step {figures['step']:.2f})"
                    + (f", {figures['again']:.0f} step(s) again" if "again" in figures else ""),
                    flush=True,
                )
    med = {case: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for case, rs in rows.items()}
    print(f"\nmedians of {opts.rounds} round(s) (s):")
    print(f"{'':>8} {'total':>7} {'launch':>7} {'build':>7} {'load':>7} {'step':>7} {'in-process':>10}")
    for case, m in med.items():
        print(
            f"{case:>8} {m['total']:7.2f} {m['launch']:7.2f} {m['build']:7.2f} {m['load']:7.2f} "
            f"{m['step']:7.2f} {m['in_process']:10.2f}"
        )
    s, f = med["shared"], med["fast"]
    print(
        f"shared ÷ fast: whole restart {s['total'] / f['total']:.2f}×, in the process "
        f"{s['in_process'] / f['in_process']:.2f}×, load {s['load'] / f['load']:.2f}× (target ≥ 3×)"
    )


if __name__ == "__main__":
    main()
