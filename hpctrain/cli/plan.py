"""``hpctrain plan OVERRIDES...``: memory per GPU, time and cost per run, and layouts that fit, as a table.

Takes the overrides a training command would (``hpctrain plan model=gpt2_350m parallel=fsdp
cluster=a100x32``), starts nothing. Exit status: 0 when the run fits (or there is no GPU to judge: CPU
profiles report host memory only), 1 when it does not fit, 2 for a bad config. Torch-free for the built-in
models; a model without declared shapes (a user's ``_target_``) is measured first
(:mod:`hpctrain.submit.measure`), which imports torch.

``--rehearse`` also runs every distinct rank's start-up here, with a fake process group
(:mod:`hpctrain.task.rehearse`): per rank the bytes of its sharded tensors beside the estimate, or the one
line a rank would fail with (exit 2). The outcome is kept for the dry run's plan line and the submission's
checks (:mod:`hpctrain.plan.rehearsal`).
"""

from __future__ import annotations

import sys
from typing import Any

from hpctrain.cli.common import Parser
from hpctrain.config.shape import run_shape
from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError

EXIT_DOES_NOT_FIT = 1


def run(name: str, argv: list[str]) -> int:
    """``hpctrain plan OVERRIDES... [--top N] [--config-dir DIR]``."""
    parser = Parser(
        prog="hpctrain plan",
        description="Memory per GPU, step time and cost of a run, and layouts that fit; starts nothing.",
        epilog="Exit status: 0 fits (or nothing to judge), 1 does not fit, 2 bad config.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="the overrides a training command takes, e.g. model=gpt2_350m"
    )
    parser.add_argument("--top", type=int, default=3, help="how many alternative layouts to list (default 3)")
    parser.add_argument("--config-dir", "-cd", help="your config directory, searched besides hpctrain's")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="also run every distinct rank's start-up here (fake process group, meta device)",
    )
    args = parser.parse_or_exit(argv)
    if isinstance(args, int):
        return args
    from hpctrain.cli.train import one_process
    from hpctrain.config.compose import user_config_dirs
    from hpctrain.plan.check import check_run
    from hpctrain.plan.estimate import estimate
    from hpctrain.plan.search import alternatives, smallest_fit
    from hpctrain.plan.text import oversized_line, report
    from hpctrain.submit.measure import measured_for
    from hpctrain.submit.precheck import composed_run

    try:
        overrides = one_process(list(args.overrides))
        cfg = composed_run(overrides, user_config_dirs(args.config_dir))  # as train composes it
        check_run(cfg)
        measured = measured_for(cfg)
        est = estimate(cfg, measured)
    except ConfigError as err:
        user_traceback = getattr(err, "user_traceback", None)  # the user's own code raised: show where
        if user_traceback:
            print(user_traceback, file=sys.stderr, end="")
        print(f"hpctrain: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    alts = alternatives(cfg, limit=args.top, measured=measured) if args.top > 0 else []
    print(report(cfg, est, alts))
    fit = smallest_fit(cfg, est, measured)
    if fit is not None:  # far more GPUs than the model needs: the smallest layout that fits
        print(f"hpctrain: {oversized_line(est, fit)}", file=sys.stderr)
    if cfg.cluster.kind == "slurm":  # Slurm's estimated start in each partition it may go to
        from hpctrain.launch.queue import start_estimates

        print("\n".join(start_estimates(cfg.cluster)))
    if args.rehearse and not _rehearse(cfg, measured):
        return EXIT_BAD_CONFIG
    return EXIT_DOES_NOT_FIT if not est.verdict.fits else 0


def _rehearse(cfg: Any, measured: Any) -> bool:
    """Rehearse ``cfg``'s start-up, print a row per rank and the verdict (the outcome is kept); False when
    a rank fails or the plan cannot be rehearsed (its line printed)."""
    import time

    from hpctrain.errors import printable
    from hpctrain.plan.layout import layout_of
    from hpctrain.plan.rehearsal import (
        AGREE,
        RehearsalRefused,
        compared,
        planned,
        refuse_too_many,
        rehearse_and_record,
        whole_grads,
    )
    from hpctrain.plan.units import size
    from hpctrain.task.rehearse import Rehearsed, StartupFailure, roles

    shape = run_shape(cfg)
    chosen = roles(shape)
    try:
        refuse_too_many(len(chosen), shape.world_size)
    except RehearsalRefused as err:
        print(f"hpctrain: --rehearse: {err}", file=sys.stderr)
        return False
    lay = layout_of(cfg, tokens=(measured.tokens_per_sample or 1) if measured is not None else None)
    print(
        f"\nRehearsal: {len(chosen)} of {shape.world_size} ranks' start-up, here, with a fake process "
        "group (no collective moves data) and the model on the meta device: one rank per pipeline, tensor, "
        "context and expert coordinate, at the first and last FSDP shard"
    )
    print(
        f"{'rank':>5}  {'role':<40} {'params est/rehearsed':>22} {'grads est/rehearsed':>22} "
        f"{'optim est/rehearsed':>22} {'save plan':>11} {'dp':>9} {'samples':>7} {'s':>5}"
    )
    gaps: list[tuple[float, str]] = []
    whole = [0]  # the most a rank's backward adds, making a gradient whole (none in a rehearsal)

    def row(r: Rehearsed) -> None:
        plan = planned(cfg, lay, r, measured)
        pairs = compared(plan, r)
        whole[0] = max(whole[0], whole_grads(plan))
        for what, (est, got) in pairs.items():
            said = f"rank {r.role.rank}'s {what}: estimated {est:,} B, rehearsed {got:,} B"
            gaps.append((abs(est - got) / max(got, 1), said))
        pair = {k: _pair(est, got) for k, (est, got) in pairs.items()}
        print(
            f"{r.role.rank:>5}  {str(r.role)[:40]:<40} {pair['params']:>22} {pair['grads']:>22} "
            f"{pair['optimizer']:>22} {size(r.checkpoint):>11} {f'{r.dp[0]}/{r.dp[1]}':>9} {r.samples:>7} "
            f"{r.seconds:>5.2f}",
            flush=True,
        )

    began = time.perf_counter()
    try:
        done = rehearse_and_record(cfg, progress=row, chosen=chosen)
    except (StartupFailure, RehearsalRefused, ValueError) as err:
        print(f"hpctrain: --rehearse: {printable(str(err))}", file=sys.stderr)
        return False
    gap, where = max(gaps, default=(0.0, ""))
    agreement = (
        f"the planner and the rehearsal agree within {AGREE:.0%} on every rank's parameters, gradients and "
        f"optimizer state (largest gap {gap:.2%})"
        if gap <= AGREE
        else f"the planner's estimate is off by {gap:.1%}: {where}"
    )
    if whole[0]:
        agreement += (
            f"; the planner adds up to {size(whole[0])} a rank for the vocabulary-parallel embedding's "
            "gradient, which a backward makes whole under TP without FSDP (a rehearsal runs no backward)"
        )
    seconds = time.perf_counter() - began
    print(
        f"Rehearsed {len(done)} of {shape.world_size} ranks in {seconds:.1f} s, each one started; {agreement}"
    )
    return True


def _pair(estimated: int, rehearsed: int) -> str:
    """Both in the unit of the larger: ``1.23/1.23 GiB``."""
    from hpctrain.plan.units import size_unit

    unit, scale = size_unit(max(estimated, rehearsed))
    return f"{estimated / scale:.2f}/{rehearsed / scale:.2f} {unit}"
