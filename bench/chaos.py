"""Faults on a schedule on the test Slurm cluster: what each costs, and the effective training time ratio.

    SLURM_CONF=... python bench/chaos.py          # against a running 3-node cluster (`cluster up`)
    python bench/chaos.py                          # starts the test cluster itself (root)
    # one fault about every 2 minutes at this machine's ~72 ms a step, asynchronous saves, no spare-node job:
    python bench/chaos.py --steps 6900 --kill 1380 --stop 2760 --nan 4140 --preempt 5520 --lose-node 0 \
        --ckpt-every auto --mtbf-h 0.0333 --async-save
    # faults twice as often, and the spare-node job with node2 lost at step 1200:
    python bench/chaos.py --steps 2500 --kill 500 --stop 1000 --nan 1500 --preempt 2000 --lose-node 1200 \
        --ckpt-every auto --mtbf-h 0.0333 --async-save

Jobs of ``cluster=slurm_test`` (2 nodes x 2 tasks, a tiny GPT, ``--steps`` steps, a checkpoint every
``--ckpt-every`` steps, a metrics record every step): an uninterrupted one (the reference), then the same
with ``cluster.max_restarts=2`` and these faults, in this order:

- SIGKILL of rank 3 (node2) at step ``K`` (``faults.kill_at``): a restart inside the allocation;
- SIGSTOP of rank 1 (node1) at step ``S`` in the restarted start (``faults.stop_at=1:S@1``): a hung rank,
  which its peers' watchdog notices (``trainer.watchdog_min_s``); a restart inside the allocation;
- a NaN loss on rank 2 at step ``N`` (``faults.nan_at``): the non-finite guard skips the step;
- a pre-emption (``scancel --signal=USR2``) once step ``P`` is logged: checkpoint, requeue, resume (today's
  only route, for comparison in the same run).

Then the spare-node variant (``--lose-node L``; 0 leaves it out): the same job with ``cluster.spare_nodes=1``
on all three nodes (node3 waits), and node2 lost once step ``L`` is logged (its slurmd and every process on it
SIGKILLed: ``SlurmTestCluster.lose_node``); the spare takes its place inside the allocation, and the world
size is unchanged, so its final weights should equal the reference's bitwise. node2 comes back (a reboot)
once that job has ended.

Per fault: detection (the fault's own log line -> the restart's record in faults.jsonl, or the requeue),
restart -> rank 0 up again (process start or fork, rendezvous), -> checkpoint loaded, -> first step after,
the total (fault -> first step after), and steps lost (trained again). For the run: ETTR = the reference's
step time x steps / (wall time from the first step to the last), and whether the weights equal the
reference's (bitwise) at a checkpoint after the two restarts, and at the end (not expected: the skipped NaN
step is one update fewer). A timing is a figure, never an assertion. ``--json PATH`` also writes the figures
(each fault's costs, the run's wall time and ETTR, its saves) for ``bench/ettr_sim.py --validate``.

Over 400 lines: one benchmark, read top to bottom: the jobs it submits, the faults it injects, each fault's
measurement from the logs and the report; a split would scatter one schedule over files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.cluster import SlurmTestCluster, cluster_for_benchmarks  # noqa: E402

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) rank\d+ \w+ [\w.]+: (.*)$")
REQUEUE_FIGURE_S = 20.7  # bench/preemption.py, 2026-11-26: signal -> first step of the requeued job
TARGET_S = 10.0


def log_lines(run: Path, rank: int) -> list[tuple[float, str]]:
    path = run / "logs" / f"rank{rank}.log"
    lines = []
    for line in path.read_text().splitlines() if path.exists() else []:
        match = STAMP.match(line)
        if match:
            stamp = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
            lines.append((stamp, match[3]))
    return lines


def first_after(lines: list[tuple[float, str]], pattern: str, since: float) -> tuple[float, str] | None:
    return next(((t, text) for t, text in lines if t >= since and re.search(pattern, text)), None)


def metrics(run: Path) -> list[dict]:
    records = []
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def restarts(run: Path) -> list[dict]:
    """The fault policy's answers, from the run's fault log."""
    from hpctrain.rundir import RunDir

    return RunDir(run).read_answers()


def submit(run: Path, overrides: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", *overrides, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"submission failed:\n{done.stderr}")
    return json.loads((run / "job.json").read_text())["job_id"]


def state_of(job_id: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-j", job_id, "-o", "State"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    states = out.stdout.split()
    return states[-1] if states else "UNKNOWN"


def wait_for(condition, what: str, timeout: float, poll: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
    return found


def wait_final(job_id: str, env: dict[str, str], timeout: float) -> str:
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    return wait_for(lambda: (s := state_of(job_id, env)) in final and s, f"job {job_id} to end", timeout, 1.0)


def step_time(run: Path) -> float:
    """The uninterrupted run's step time: wall time from its first step to its last, per step."""
    records = metrics(run)
    return (records[-1]["time"] - records[0]["time"]) / (records[-1]["step"] - records[0]["step"])


def tensors(checkpoint: Path) -> dict:
    from hpctrain.checkpoint.tiers import read_checkpoint

    out: dict = {}

    def walk(tree: object, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix.rstrip(".")] = tree

    walk(read_checkpoint(checkpoint)["model_optim"], "")
    return out


def bitwise(a: Path, b: Path) -> bool:
    import torch

    x, y = tensors(a), tensors(b)
    same = [torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k] for k in x if k in y]
    return x.keys() == y.keys() and all(same)


def restart_row(run: Path, record: dict, fault_rank: int, fault_line: str, what: str) -> dict:
    """The phases of one restart inside the allocation, from the logs and the restart's record."""
    fault = first_after(log_lines(run, fault_rank), fault_line, 0)
    assert fault is not None, f"no {fault_line!r} in rank {fault_rank}'s log"
    decided = record["time"]
    rank0 = log_lines(run, 0)
    up = first_after(rank0, r"^rank 0/\d+ on", decided)
    loaded = first_after(rank0, r"^Resumed from", decided)
    first = next(r for r in metrics(run) if r["time"] >= decided)
    fault_step = int(re.search(r"at step (\d+)", fault[1])[1])  # type: ignore[index]
    return {
        "fault": what,
        "detect": decided - fault[0],
        "restart": (up[0] - decided) if up else float("nan"),
        "load": (loaded[0] - up[0]) if up and loaded else float("nan"),
        "first step": first["time"] - (loaded[0] if loaded else decided),
        "total": first["time"] - fault[0],
        "lost": fault_step - 1 - record["resume_step"],
        "how": f"restart inside the allocation (resumed from {record['resume_step']})",
    }


def lost_node_variant(
    cluster: SlurmTestCluster, env: dict[str, str], run: Path, job: list[str], at: int, ref_step: float
) -> dict | None:
    """The spare-node job: node2 lost once step ``at`` is logged; its row (phases as a restart's) with the
    job's ETTR. None when ``at`` is 0."""
    if at <= 0:
        return None
    job_id = submit(run, [*job, "cluster.spare_nodes=1", "cluster.max_restarts=1"], env)
    wait_for(lambda: any(r["step"] >= at for r in metrics(run)), f"step {at} of the spare-node job", 3600)
    last_before = metrics(run)[-1]["step"]
    cluster.lose_node("node2")
    lost_at = time.time()
    try:
        print(f"spare-node job {job_id}: {wait_final(job_id, env, 3600)}", flush=True)
    finally:
        cluster.revive_node("node2")
    record = next((r for r in restarts(run) if r.get("lost")), None)
    if record is None:
        print(f"no restart for the lost node in {run / 'faults.jsonl'}", flush=True)
        return None
    decided = record["time"]
    rank0 = log_lines(run, 0)
    up = first_after(rank0, r"^rank 0/\d+ on", decided)
    loaded = first_after(rank0, r"^Resumed from", decided)
    first = next(r for r in metrics(run) if r["time"] >= decided)
    records = metrics(run)
    wall = records[-1]["time"] - records[0]["time"]
    return {
        "fault": "node lost (spare)",
        "detect": decided - lost_at,
        "restart": (up[0] - decided) if up else float("nan"),
        "load": (loaded[0] - up[0]) if up and loaded else float("nan"),
        "first step": first["time"] - (loaded[0] if loaded else decided),
        "total": first["time"] - lost_at,
        "lost": max(0, last_before - record["resume_step"]),
        "how": f"restart inside the allocation on {'+'.join(record['nodes'])} (resumed from "
        f"{record['resume_step']})",
        "ettr": ref_step * (records[-1]["step"] - records[0]["step"]) / wall,
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt-every", default="5", help="steps between checkpoints, or auto (Young/Daly)")
    parser.add_argument("--mtbf-h", type=float, default=24.0, help="cluster.mtbf_h (for --ckpt-every auto)")
    parser.add_argument("--kill", type=int, default=12, help="step of the SIGKILL (rank 3)")
    parser.add_argument("--stop", type=int, default=24, help="step of the SIGSTOP (rank 1, restarted start)")
    parser.add_argument("--nan", type=int, default=31, help="step of the NaN loss (rank 2)")
    parser.add_argument("--preempt", type=int, default=40, help="pre-empt once this step is logged")
    parser.add_argument("--lose-node", type=int, default=20, help="lose node2 of the spare-node job (0: no)")
    parser.add_argument("--dir", type=Path, help="where the run directories go (kept)")
    parser.add_argument(
        "--json", type=Path, help="also write the figures here (bench/ettr_sim.py --validate reads them)"
    )
    parser.add_argument(
        "--async-save", action="store_true", help="trainer.async_checkpoint=true in every job (default: sync)"
    )
    parser.add_argument(
        "--classes",
        action="store_true",
        help="the failure classes instead (bench/chaos_classes.py: the user's bug, a full disk, a host OOM, "
        "a kill and a hang, each classified and answered), on this machine, without Slurm",
    )
    opts = parser.parse_args()
    if opts.classes:
        import chaos_classes

        sys.argv = [sys.argv[0], *(["--dir", str(opts.dir)] if opts.dir else [])]
        chaos_classes.main()
        return
    job = [
        "cluster=slurm_test",
        "cluster.time=01:00:00",
        f"trainer.max_steps={opts.steps}",
        f"trainer.ckpt_every={opts.ckpt_every}",
        f"cluster.mtbf_h={opts.mtbf_h}",
        "trainer.keep_last=100000",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "data.max_bytes=200000",
        "logger=jsonl",
        "cluster.dist_timeout_s=60",
        f"trainer.async_checkpoint={str(opts.async_save).lower()}",
    ]
    faults = [
        "cluster.max_restarts=2",
        f"faults.kill_at=3:{opts.kill}",
        f"faults.stop_at=1:{opts.stop}@1",
        f"faults.nan_at=2:{opts.nan}",
        "trainer.watchdog_factor=10",
        "trainer.watchdog_min_s=3",
    ]
    two_nodes = [*job, "cluster.exclude=node3"]
    with cluster_for_benchmarks(num_nodes=3) as (cluster, env), contextlib.ExitStack() as stack:
        root = opts.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hpct-chaos-")))
        reference, chaos = root.resolve() / "reference", root.resolve() / "chaos"
        ref_job = submit(reference, two_nodes, env)
        print(f"reference job {ref_job}: {wait_final(ref_job, env, 3600)}", flush=True)
        chaos_job = submit(chaos, [*two_nodes, *faults], env)
        wait_for(lambda: any(r["step"] >= opts.preempt for r in metrics(chaos)), "the pre-emption step", 3600)
        subprocess.run(["scancel", "--signal=USR2", chaos_job], env=env, check=True)
        signalled = time.time()
        print(f"chaos job {chaos_job}: {wait_final(chaos_job, env, 3600)}", flush=True)

        rows = []
        records = [r for r in restarts(chaos) if r.get("action") == "restart"]
        if len(records) >= 1:
            rows.append(
                restart_row(chaos, records[0], 3, r"Killing this rank \(SIGKILL\)", "SIGKILL of a rank")
            )
        if len(records) >= 2:
            rows.append(
                restart_row(chaos, records[1], 1, r"Stopping this rank \(SIGSTOP\)", "SIGSTOP (hung rank)")
            )
        nan = first_after(log_lines(chaos, 2), r"A NaN loss at step", 0)
        if nan is not None:
            after = next(r for r in metrics(chaos) if r["step"] == opts.nan + 1 and r["time"] >= nan[0])
            rows.append(
                {
                    "fault": "NaN loss",
                    "detect": 0.0,
                    "restart": 0.0,
                    "load": 0.0,
                    "first step": after["time"] - nan[0],
                    "total": after["time"] - nan[0],
                    "lost": 0,
                    "how": "skipped by the non-finite guard (1 batch without update)",
                }
            )
        rank0 = log_lines(chaos, 0)
        saved = first_after(rank0, r"^Stopped by", signalled)
        up = first_after(rank0, r"^rank 0/\d+ on", signalled)
        loaded = first_after(rank0, r"^Resumed from", signalled)
        stopped_at = re.search(r"after step (\d+)", saved[1]) if saved else None
        stop_step = int(stopped_at[1]) if stopped_at else opts.preempt
        first = next((r for r in metrics(chaos) if r["time"] >= (loaded[0] if loaded else signalled)), None)
        if first is not None and up and loaded:
            at = saved[0] if saved else signalled
            rows.append(
                {
                    "fault": "pre-emption (USR2)",
                    "detect": at - signalled,
                    "restart": up[0] - at,
                    "load": loaded[0] - up[0],
                    "first step": first["time"] - loaded[0],
                    "total": first["time"] - signalled,
                    "lost": stop_step - first["step"] + 1,
                    "how": "checkpoint, requeue, new job start",
                }
            )
        ref_step = step_time(reference)
        records_chaos = metrics(chaos)
        saves = saves_of(chaos, opts.steps)  # read here: without --dir the run's folder goes with the block
        wall = records_chaos[-1]["time"] - records_chaos[0]["time"]
        ettr = ref_step * (opts.steps - 1) / wall
        # The run's own undisturbed step (the median of its steps' own times): the ETTR against it does not
        # move with the machine between the reference job and this one (60-64 ms a step from run to run).
        own_step = statistics.median(r["step_time_s"] for r in records_chaos if "step_time_s" in r)
        ettr_own = own_step * (opts.steps - 1) / wall
        # A checkpoint both runs have, after both restarts and before the NaN step.
        common = {p.name for p in (chaos / "checkpoints").glob("step_*")} & {
            p.name for p in (reference / "checkpoints").glob("step_*")
        }
        between = sorted(n for n in common if opts.stop < int(n[5:]) < opts.nan)
        mid = int(between[-1][5:]) if between else 0
        same_mid = (
            bitwise(chaos / "checkpoints" / between[-1], reference / "checkpoints" / between[-1])
            if between
            else None
        )
        end = f"step_{opts.steps:08d}"
        same_end = bitwise(chaos / "checkpoints" / end, reference / "checkpoints" / end)
        spare = lost_node_variant(cluster, env, root.resolve() / "spare", job, opts.lose_node, ref_step)
        if spare is not None:
            rows.append(spare)
            spare["same"] = bitwise(
                root.resolve() / "spare" / "checkpoints" / end, reference / "checkpoints" / end
            )

    heads = ("detect", "restart", "load", "1st step", "total")
    print("\n" + f"{'fault':22s} " + " ".join(f"{h:>8s}" for h in heads) + "  lost  how")
    for r in rows:
        cells = " ".join(f"{r['first step' if h == '1st step' else h]:7.2f}s" for h in heads)
        print(f"{r['fault']:22s} {cells} {r['lost']:5d}  {r['how']}")
    # The target is for a killed or hung rank; the lost node has its own line below.
    restarts_total = [r["total"] for r in rows if r["how"].startswith("restart") and "ettr" not in r]
    if restarts_total:
        print(
            f"\nfault -> next step inside the allocation: median {statistics.median(restarts_total):.2f} s "
            f"(target <= {TARGET_S:.0f} s); through a requeue: {REQUEUE_FIGURE_S} s (bench/preemption.py), "
            f"ratio {statistics.median(restarts_total) / REQUEUE_FIGURE_S:.2f}"
        )
    print(
        f"ETTR {ettr:.3f} (reference step {ref_step * 1000:.0f} ms x {opts.steps - 1} steps / {wall:.1f} s "
        f"from first step to last; {sum('ettr' not in r for r in rows)} faults)"
    )
    faults_s = sum(r["total"] for r in rows if "ettr" not in r)
    rework_s = sum(r["lost"] for r in rows if "ettr" not in r) * own_step
    rest_s = wall - own_step * (opts.steps - 1) - faults_s - rework_s
    print(
        f"ETTR {ettr_own:.3f} against the run's own median step ({own_step * 1000:.1f} ms): of its "
        f"{wall:.1f} s, {own_step * (opts.steps - 1):.1f} s of steps, {faults_s:.1f} s of fault recovery, "
        f"{rework_s:.1f} s trained again, {rest_s:.1f} s the rest ({rest_s / max(saves['taken'], 1):.3f} s "
        f"for each of its {saves['taken']} saves, with logging and evaluation)"
    )
    print(f"weights at step {mid} (after both restarts) bitwise equal to the uninterrupted run's: {same_mid}")
    print(
        f"final weights bitwise equal: {same_end} (not expected: the NaN step was skipped: one update fewer)"
    )
    if spare is not None:
        print(
            f"node lost, spare in its place: ETTR {spare['ettr']:.3f} ({spare['wall']:.1f} s from first step "
            f"to last); final weights bitwise equal to the uninterrupted run's: {spare['same']}"
        )
    if opts.json is not None:
        opts.json.write_text(
            json.dumps(
                {
                    "steps": opts.steps,
                    "reference_step_s": ref_step,
                    "wall_s": wall,
                    "ettr": ettr,
                    "own_step_s": own_step,
                    "ettr_own": ettr_own,
                    "rest_s": rest_s,
                    "faults": [{k: v for k, v in r.items() if k != "same"} for r in rows if "ettr" not in r],
                    "saves": saves,
                },
                indent=1,
            )
        )
        print(f"figures in {opts.json}")


AUTO = re.compile(r"ckpt_every=auto: a save every (\d+) steps \((.*) ([\d.]+) s, MTBF")


def saves_of(run: Path, steps: int) -> dict:
    """The run's checkpoints and what ``ckpt_every=auto`` took a save to cost (its log's choices; ``final``:
    the choice a start kept, the second with saves beside training, which charges what the write cost the
    steps beside it)."""
    chosen = [m for _, line in log_lines(run, 0) if (m := AUTO.search(line))]
    return {
        "count": len(list((run / "checkpoints").glob("step_*"))),
        # Every save the run made, pruned ones too (rank 0 logs each commit).
        "taken": sum(1 for _, line in log_lines(run, 0) if line.startswith("Committed ")),
        "every": [int(m[1]) for m in chosen],
        "cost_s": [float(m[3]) for m in chosen],
        "final": [
            m[2].startswith("asynchronous")
            or i + 1 == len(chosen)
            or not chosen[i + 1][2].startswith("asynch")
            for i, m in enumerate(chosen)
        ],
        "steps": steps,
    }


if __name__ == "__main__":
    main()
