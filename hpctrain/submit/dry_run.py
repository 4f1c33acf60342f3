"""``dry_run=true``: what a submission would do, said and nothing started, once every check passed.

A single run: its memory and time plan in one line, the smallest layout that fits when far more GPUs were
asked for, a note on an example profile's placeholders, then the rendered submission (the launcher's own
dry run: :func:`hpctrain.submit.hydra_app.dry_run`). A sweep: its members, listed (a grid), or how its
sampler chooses them. No torch here beyond the measure of a user's model (cached by the precheck).
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.schema import Config
from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError


def show_dry_run(first: Config, composed: DictConfig) -> int:
    """A single run's dry run; its exit status."""
    from hpctrain.plan.estimate import estimate
    from hpctrain.plan.search import smallest_fit
    from hpctrain.plan.text import oversized_line, summary
    from hpctrain.submit.hydra_app import dry_run
    from hpctrain.submit.measure import measured_for
    from hpctrain.submit.precheck import example_note

    try:  # a user's model: measured by the precheck already (cached), else now
        measured = measured_for(first)
        est = estimate(first, measured)
    except ConfigError as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(summary(first, est), flush=True)  # the memory and time plan, one line
    fit = smallest_fit(first, est, measured)
    if fit is not None:  # far more GPUs than the model needs: the smallest layout that fits
        print(f"hpctrain: {oversized_line(est, fit)}", file=sys.stderr, flush=True)
    note = example_note(first)
    if note is not None:  # a submission would be refused: said before the plan of it
        print(f"note: {note}; without dry_run it is refused until they are yours")
    return dry_run(first, composed)


def list_dry_sweep(overrides: list[str], composed: DictConfig, first: Config) -> int | None:
    """A sweep's dry run, said without Hydra's run: a sampler's (chosen as results come: nothing to list)
    or a grid's members. None: Hydra's own run lists it (an interval sweep)."""
    from hpctrain.config.redact import secret_env
    from hpctrain.submit.sweep import describe_sampler_sweep, interval_sweep, sampler_sweep, sweep_members

    members = sweep_members(overrides)
    where = "a job array" if first.cluster.kind == "slurm" else "one after another here"
    if sampler_sweep(overrides, composed):
        for line in describe_sampler_sweep(overrides, composed, where):
            print(line)
        return 0
    if not members or interval_sweep(overrides):
        return None
    sweep_dir = Path(composed.hydra.sweep.dir).absolute()
    print(f"Dry run: nothing started. {len(members)} members would run ({where}) in {sweep_dir}:")
    secrets = secret_env(first.cluster.env)
    for i, member in enumerate(members):
        line = " ".join(member)
        for value in secrets.values():  # a secret cluster.env value is never printed
            line = line.replace(value, "***")
        print(f"  {i}  {line}")
    return 0
