"""``hpctrain resume [RUN_DIR] [OVERRIDES...]``: continue a run (the latest under ./outputs or ./multirun when
no RUN_DIR is given) with the command that started it, in the folder it was typed in, plus OVERRIDES
(:mod:`hpctrain.submit.resume`). Everything ``hpctrain train`` checks is checked again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError


def run(name: str, argv: list[str]) -> int:
    from hpctrain.cli.train import train
    from hpctrain.rundir.runs import latest_run
    from hpctrain.submit.resume import resume_command

    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: hpctrain resume [RUN_DIR] [OVERRIDES...]\n\n{__doc__.split(':', 1)[1].strip()}")
        return 0
    given = argv[0] if argv and "=" not in argv[0] and not argv[0].startswith("-") else None
    extra = argv[1:] if given is not None else argv
    try:
        run_dir = Path(given) if given is not None else latest_run(Path.cwd())
        _refuse_a_sweep(run_dir)
        cwd, overrides = resume_command(run_dir, extra)
    except ConfigError as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(f"hpctrain: continuing {run_dir}", flush=True)
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))  # the user's packages import from there, as under `python -m hpctrain`
    return train(overrides)


def _refuse_a_sweep(run_dir: Path) -> None:
    """A sweep directory is continued by its own ``-m`` command (each member resumes itself, and a sampler
    asks for the trials still to run), not by ``resume``: say so, with the command sweep.json recorded."""
    import shlex

    from hpctrain.rundir.records import read_sweep

    try:
        record = read_sweep(run_dir)
    except (OSError, ValueError, TypeError, KeyError):  # unreadable: resume_command says what it is not
        return
    if record is None:
        return
    command = list(record.command or [])
    lead = command[:1] if command[:1] == ["train"] else []  # typed as ``hpctrain train …``: -m after it
    again = [*lead, "-m", *command[len(lead) :]]
    typed = f"hpctrain {shlex.join(again)}" if command else "the -m command that started it"
    why = f"is a sweep ({len(record.members)} members): run its -m command again: {typed}"
    raise ConfigError(
        "RUN_DIR",
        str(run_dir),
        why,
        valid=f"that command, or one member's run directory, e.g. {run_dir / '0'}",
    )
