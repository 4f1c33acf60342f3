"""``hpctrain plan OVERRIDES...``: memory per GPU, time and cost per run, and layouts that fit, as a table.

Takes the overrides a training command would (``hpctrain plan model=gpt2_350m parallel=fsdp
cluster=a100x32``), starts nothing. Exit status: 0 when the run fits (or there is no GPU to judge: CPU
profiles report host memory only), 1 when it does not fit, 2 for a bad config. Torch-free for the built-in
models; a model without declared shapes (a user's ``_target_``) is measured first
(:mod:`hpctrain.submit.measure`), which imports torch.
"""

from __future__ import annotations

import sys

from hpctrain.cli.common import Parser
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
    return EXIT_DOES_NOT_FIT if not est.verdict.fits else 0
