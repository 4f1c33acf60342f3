"""``python -m hpctrain`` / ``hpctrain``: one table of subcommands drives dispatch, ``--help`` and the README.

    hpctrain [OVERRIDES...]          train (the bare form); ``-m`` sweeps, ``--cfg job`` prints the config
    hpctrain SUBCOMMAND ARGS...      one of :data:`SUBCOMMANDS`

Each subcommand's module is imported only when it runs, and none imports torch at import (``export`` and
``generate`` do when they run): submitting and looking after jobs from a login node stays fast. Nothing
outside this package imports it.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

from hpctrain.observe.streams import guarded_std_streams, is_lost
from hpctrain.version import EXIT_UNSUPPORTED, UnsupportedEnvironment, environment_problem


class Subcommand(NamedTuple):
    usage: str  # the arguments, as shown by --help and in the README
    help: str  # one line
    module: str  # hpctrain.cli.<module>, which has run(name, argv) -> exit status


_PREPARE = "INPUT... --out PATH.bin [--tokenizer T] [--workers N]"
# Every subcommand: its arguments, its one line of help, its module (a table, one row a line).
SUBCOMMANDS: dict[str, Subcommand] = {
    "train": Subcommand("[OVERRIDES...]", "compose, check and launch a run (also the bare form)", "train"),
    "resume": Subcommand("[RUN_DIR] [OVERRIDES...]", "continue a run (default: the latest)", "resume"),
    "plan": Subcommand(
        "[OVERRIDES...] [--rehearse]",
        "memory per GPU, step time, cost and layouts that fit; --rehearse: every rank's start-up, here",
        "plan",
    ),
    "status": Subcommand("[TARGET]", "state and progress of a run (the latest), a sweep or a job", "jobs"),
    "logs": Subcommand("TARGET [-f] [-n N] [--rank R]", "the tail of a rank's log; -f follows it", "logs"),
    "cancel": Subcommand("TARGET", "cancel a run's Slurm job, or every member of a sweep", "jobs"),
    "save": Subcommand("RUN_DIR [--wait S]", "a running run saves a checkpoint now, trains on", "control"),
    "stop": Subcommand("RUN_DIR [--wait S]", "a running run saves a checkpoint, ends, no requeue", "control"),
    "stacks": Subcommand("RUN_DIR [--wait S]", "every rank's Python stacks, grouped, in seconds", "control"),
    "nodes": Subcommand("[--file PATH] [--forget NODE]", "nodes that failed this project's runs, left out",
                        "nodes"),
    "summary": Subcommand("SWEEP_DIR [--csv PATH]", "final metrics of every sweep member, a table", "jobs"),
    "eval": Subcommand("RUN_DIR [--step N] [OVERRIDES...]", "the run's validation of a checkpoint", "eval"),
    "report": Subcommand(
        "RUN_DIR|SWEEP_DIR [--out DIR]", "PNGs: loss, throughput, evaluations, sweep, scaling", "report"
    ),
    "prepare": Subcommand(_PREPARE, "write a token file for data=tokens", "prepare"),
    "export": Subcommand("RUN_DIR --to DIR [--format F] [--step N]", "a checkpoint as one model's weights",
                         "export"),
    "generate": Subcommand("SOURCE --prompt TEXT [--seed S]", "sample text from a trained language model",
                           "generate"),
}  # fmt: skip
# The subcommands that start a run (or an evaluation) refuse an unsupported torch before anything is composed
# or written; the others look at files and Slurm without torch, and work whatever torch is installed.
STARTS_RUNS = ("train", "resume", "eval")


def _lines() -> list[tuple[str, str]]:
    return [(f"hpctrain {name} {sub.usage}", sub.help) for name, sub in SUBCOMMANDS.items()]


def usage() -> str:
    from hpctrain.config.compose import GROUPS, group_options

    width = max(len(left) for left, _ in _lines())
    rows = "\n".join(f"  {left.ljust(width)}  {text}" for left, text in _lines())
    groups = "\n".join(f"  {group.ljust(9)} {', '.join(group_options(group))}" for group in GROUPS)
    return (
        "usage: hpctrain [OVERRIDES...] | hpctrain SUBCOMMAND ARGS...\n\n"
        f"Subcommands:\n{rows}\n\n"
        f"Config groups (GROUP=OPTION; --config-dir DIR adds yours):\n{groups}\n\n"
        "TARGET is a run directory, a sweep directory or a Slurm job id. `hpctrain SUBCOMMAND --help` says\n"
        "more; `hpctrain --hydra-help` lists the config groups and Hydra's own flags.\n"
    )


def readme_table() -> str:
    """The README's list of commands (tests/unit/cli/test_main.py checks the README holds exactly this)."""
    rows = "\n".join(f"| `{left.strip()}` | {text} |" for left, text in _lines())
    return "| command | what it does |\n|---|---|\n" + rows + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # ``hpctrain … | tee log`` and Ctrl-C kills tee first: a console whose reader went away must neither end
    # a command's supervision of its ranks nor turn its exit status into a failure. Any other command only
    # writes: it ends, quietly and successfully (``hpctrain logs -f RUN | grep -m1 …`` ends with grep).
    supervises = (argv[0] if argv and argv[0] in SUBCOMMANDS else "train") in STARTS_RUNS
    with guarded_std_streams(end=not supervises):
        try:
            return _main(argv)
        except OSError as err:
            if not is_lost(err):
                raise
            return 0


def _main(argv: list[str]) -> int:
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else "train"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    helping = argv in (["-h"], ["--help"], ["help"])
    # First of all: an unsupported Python (any command) or torch (a command that starts a run), in one line.
    refusal = environment_problem(need_torch=name in STARTS_RUNS and not helping)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return EXIT_UNSUPPORTED
    if helping:
        print(usage(), end="")
        return 0
    module = importlib.import_module(f"hpctrain.cli.{SUBCOMMANDS[name].module}")
    try:
        return int(module.run(name, rest))
    except UnsupportedEnvironment as err:  # a torch its metadata misreported, refused where it was imported
        print(err, file=sys.stderr)
        return EXIT_UNSUPPORTED
    except SystemExit as exit_:  # Hydra's run and the task it runs end with one (its line already printed)
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt:
        print(f"hpctrain {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if is_lost(err):  # the reader of our output went away: main's to answer, with no line
            raise
        line = _expected_failure(err)
        if line is None:
            raise  # a fault of hpctrain's own: its traceback is what a bug report needs
        print(f"hpctrain {name}: {line}", file=sys.stderr)
        return 1


def _expected_failure(err: Exception) -> str | None:
    """The one line for a failure that is not hpctrain's fault, None for one that is (a bug).

    The user's own code raised (a model class of theirs under export, generate or plan): their frames go
    to stderr first. The file system refused (a read-only run directory, a full disk, no permission): the
    path and the system's words."""
    from hpctrain.errors import first_line, user_traceback

    if isinstance(err, OSError) and (err.filename is not None or err.strerror):
        where = f"{err.filename}: " if err.filename is not None else ""
        return f"{where}{err.strerror or first_line(err)}"
    frames = user_traceback(err)
    if frames is not None:
        print(frames, file=sys.stderr, end="")
        return f"your code raised {type(err).__name__}: {first_line(err)}"
    return None
