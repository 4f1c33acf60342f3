"""The effective training time ratio (ETTR) projected from 8 to 16,384 GPUs: for hpctrain's recovery as it is
configured (restarts inside the allocation, a spare node for a lost one), without spares, and for requeue-only
recovery (every fault ends the job, which waits in the queue again), under each checkpoint-interval rule
(hpctrain.plan.ettr: Young, Daly's first order, the availability optimum of arXiv 2410.18124).

    python bench/ettr_sim.py                                  # a 70B-class state, the published rates
    python bench/ettr_sim.py --ckpt-gib 1000 --write-gbps 100 --read-gbps 200 --queue-wait-h 2
    python bench/ettr_sim.py --validate chaos.json            # the model against bench/chaos.py --json

Inputs: the failure rate of a job by its GPUs (Kokolis et al., HPCA 2025; ``--mttf`` GPUS:HOURS,… for a
site's own), the share of each fault class (``--shares``; an assumption, printed), the recovery each class
costs (measured by bench/chaos.py, plus the checkpoint's load at ``--read-gbps``), a save's cost (the
checkpoint at ``--write-gbps``; ``--async-stall`` the fraction of it training waits for when saves are
written beside it: 0.150-0.185 measured by bench/checkpoint_stall.py), and a requeue's queue wait
(exponential, ``--queue-wait-h`` mean). Each cell is the Monte Carlo's mean over ``--runs`` runs of
``--days`` days of work; the analytic ETTR (Daly 2006, one fault class of the mean cost) is printed beside
the table's hpctrain row for the availability rule, as a check of the simulation itself.

``--validate``: the simulation fed bench/chaos.py's own measurements (its faults' costs, their rate over its
wall time, its checkpoint interval and save cost) against the ETTR chaos.py measured (target: within 2
points).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpctrain.checkpoint import intervals
from hpctrain.plan import ettr

GB = 1e9


def parse_points(text: str) -> tuple[tuple[int, float], ...]:
    points = []
    for part in text.split(","):
        gpus, _, hours = part.partition(":")
        points.append((int(gpus), float(hours)))
    return tuple(points)


def parse_shares(text: str) -> dict[str, float]:
    shares = {k: float(v) for k, v in (p.split("=") for p in text.split(","))}
    if set(shares) != set(ettr.DEFAULT_SHARES):
        raise SystemExit(f"--shares names {', '.join(ettr.DEFAULT_SHARES)}, each once")
    return shares


def table(opts: argparse.Namespace) -> None:
    save_full = opts.ckpt_gib * 2**30 / (opts.write_gbps * GB)
    save_s = save_full * opts.async_stall if opts.async_stall is not None else save_full
    load_s = opts.ckpt_gib * 2**30 / (opts.read_gbps * GB)
    wait_s = opts.queue_wait_h * ettr.HOUR
    shares = parse_shares(opts.shares) if opts.shares else dict(ettr.DEFAULT_SHARES)
    points = parse_points(opts.mttf) if opts.mttf else ettr.KOKOLIS_MTTF_H
    # The fast tier (checkpoint.local_every): each rank's state to node-local memory and a peer node, so
    # every class here rolls back to the last fast copy and loads it from memory; the shared checkpoint is
    # written every --shared-every-min of work, its cost spread over the steps (a whole job lost, the only
    # case that needs it, is left out: with spares none is).
    recoveries = {
        "hpctrain (spares+fast)": None,
        "hpctrain (spares)": ettr.hpctrain_classes(load_s, spares=True, shares=shares),
        "hpctrain (no spare)": ettr.hpctrain_classes(load_s, spares=False, shares=shares),
        "requeue only": ettr.requeue_only_classes(load_s, shares),
    }
    print(
        f"checkpoint {opts.ckpt_gib:g} GiB: a save costs {save_s:.1f} s"
        + (
            f" ({opts.async_stall:g} of a {save_full:.1f} s write, beside training)"
            if opts.async_stall
            else ""
        )
        + f", a load {load_s:.1f} s; a requeue waits {opts.queue_wait_h:g} h in the queue on average; "
        f"faults: {', '.join(f'{k} {v:.0%}' for k, v in shares.items())} (assumed)"
    )
    print(f"MTTF by GPUs: {', '.join(f'{g}: {ettr.mttf_h(g, points):.1f} h' for g in ettr.SIZES)}")
    rules = intervals.RULES
    print(f"\n{'GPUs':>6} {'recovery':<22} " + " ".join(f"{r:>13}" for r in rules) + "   analytic")
    for gpus in ettr.SIZES:
        mttf_s = ettr.mttf_h(gpus, points) * ettr.HOUR
        for name, classes in recoveries.items():
            save, shared_share = save_s, 0.0
            if classes is None:  # the fast tier: per rank, at node-local speed
                fast_s = opts.ckpt_gib * 2**30 / gpus / (opts.local_gbps * GB)
                save = fast_s
                classes = ettr.hpctrain_classes(fast_s, spares=True, shares=shares)
                shared_share = save_s / (opts.shared_every_min * 60 + save_s)
            requeues = "no spare" in name or "requeue" in name
            base = ettr.Scenario(1.0, save, mttf_s, classes, wait_s if requeues else 0)
            cells, analytic = [], ""
            for rule in rules:
                sc = ettr.with_interval(base, rule)
                value = ettr.expected_ettr(sc, opts.days * 86400, opts.runs) * (1 - shared_share)
                shown = f"{sc.tau_s / 60:4.0f}m" if sc.tau_s >= 60 else f"{sc.tau_s:4.0f}s"
                cells.append(f"{value:.4f} ({shown})")
                if rule == "availability" and name == "hpctrain (spares)":
                    recovery = ettr.mean_recovery_s(classes)
                    analytic = f"{intervals.daly_ettr(sc.tau_s, save, mttf_s, recovery):.4f}"
            print(f"{gpus:>6} {name:<22} " + " ".join(f"{c:>13}" for c in cells) + f"   {analytic}")
    print(
        "\ncells: ETTR (the interval between saves: minutes or seconds of work); spares+fast: the fast tier "
        f"every interval at {opts.local_gbps:g} GB/s a rank, the shared checkpoint every "
        f"{opts.shared_every_min:g} min"
    )


def validate(path: Path, runs: int) -> None:
    """The simulation fed chaos.py's measurements, against the ETTR chaos.py measured (against the reference
    job's step); with chaos.py's accounting of the run's wall time against its own median step, when it
    recorded one."""
    chaos = json.loads(path.read_text())
    step_s = chaos["reference_step_s"]
    faults = chaos["faults"]
    classes = tuple(
        ettr.FaultClass(f["fault"], 1.0, f["total"], rolls_back=f["lost"] > 0 and "NaN" not in f["fault"])
        for f in faults
    )
    saves = chaos["saves"]
    kept = [i for i, final in enumerate(saves.get("final", [True] * len(saves["every"]))) if final]
    every = statistics.mean(saves["every"][i] for i in kept) if kept else chaos["steps"] / saves["count"]
    save_s = statistics.median(saves["cost_s"][i] for i in kept) if kept else 0.0
    wall = chaos["wall_s"]
    work = step_s * (chaos["steps"] - 1)
    scenario = ettr.Scenario(every * step_s, save_s, wall / len(faults), classes)
    predicted = ettr.expected_ettr(scenario, work, runs)
    lo = min(ettr.simulate(scenario, work, i) for i in range(runs))
    hi = max(ettr.simulate(scenario, work, i) for i in range(runs))
    print(
        f"chaos.py measured ETTR {chaos['ettr']:.3f} ({len(faults)} faults in {wall:.0f} s, a save every "
        f"{every:.1f} steps at {save_s:.3f} s, step {step_s * 1000:.1f} ms)"
    )
    print(
        f"simulated {predicted:.3f} (mean of {runs} runs; {lo:.3f}-{hi:.3f}): "
        f"{(predicted - chaos['ettr']) * 100:+.1f} points (target: within 2)"
    )
    if "ettr_own" in chaos and saves.get("taken"):
        # The reference job's step includes its own saves and bookkeeping, and the machine drifts between
        # the two jobs (60-64 ms a step here): the run's own median step is what training alone cost.
        print(
            f"against its own median step ({chaos['own_step_s'] * 1000:.1f} ms) the run measured "
            f"{chaos['ettr_own']:.3f}; its wall less steps, recoveries and rework leaves "
            f"{chaos['rest_s'] / saves['taken']:.3f} s for each of its {saves['taken']} saves, bookkeeping "
            f"(logging, heartbeats) included"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ckpt-gib", type=float, default=1050.0, help="a 70B model's bf16 weights and fp32 Adam state"
    )
    parser.add_argument(
        "--write-gbps", type=float, default=100.0, help="the file system's aggregate write, GB/s"
    )
    parser.add_argument("--read-gbps", type=float, default=200.0, help="its aggregate read, GB/s")
    parser.add_argument(
        "--async-stall", type=float, default=None, help="saves beside training: the stall's share"
    )
    parser.add_argument("--local-gbps", type=float, default=2.0, help="a rank's fast-tier copy, GB/s")
    parser.add_argument(
        "--shared-every-min", type=float, default=60.0, help="with the fast tier: shared saves"
    )
    parser.add_argument("--queue-wait-h", type=float, default=1.0, help="a requeue's mean wait in the queue")
    parser.add_argument("--mttf", help="GPUS:HOURS,… (default: Kokolis et al.'s 8:1128,1024:8,16384:1.8)")
    parser.add_argument("--shares", help="node=…,crash=…,hang=… (default: 0.6, 0.3, 0.1)")
    parser.add_argument("--days", type=float, default=30.0, help="work per simulated run")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--validate", type=Path, help="bench/chaos.py --json's figures")
    opts = parser.parse_args()
    if opts.validate is not None:
        validate(opts.validate, opts.runs)
    else:
        table(opts)


if __name__ == "__main__":
    main()
