"""What every subcommand shares: exit codes, the two error kinds, a parser that raises, small formatters.

Bad arguments are one line on stderr and exit status 2; a target that cannot be found or read, or a Slurm
query that fails, is one line on stderr and exit status 1. No torch import here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from hpctrain.jobs.status import fmt, plural
from hpctrain.jobs.targets import JobsError
from hpctrain.observe.text import table

# --trust-code of export and generate: a folder from elsewhere may name code to build its model with.
TRUST_HELP = (
    "build the model even when the folder names something other than a model class (a factory function): "
    "only for folders you trust, as it runs code they choose"
)
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad arguments: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_or_exit(
        self, argv: list[str], intermixed: bool = False, prefix: str | None = None
    ) -> argparse.Namespace | int:
        """The parsed arguments; or, for a bad line, that one line on stderr (after ``prefix``, the prog
        unless given) and :data:`EXIT_USAGE`, not argparse's usage; for ``--help``, its exit status."""
        try:
            return self.parse_intermixed_args(argv) if intermixed else self.parse_args(argv)
        except UsageError as err:
            print(f"{prefix or self.prog}: {' '.join(str(err).split())}", file=sys.stderr)
            return EXIT_USAGE
        except SystemExit as exit_:  # --help
            return exit_.code if isinstance(exit_.code, int) else EXIT_OK


def guarded(prog: str, run: Callable[[], int]) -> int:
    """Run a subcommand; its errors become one line on stderr and an exit status."""
    try:
        return run()
    except UsageError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except JobsError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_FAILED
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


# The plain-text table every subcommand prints lives in observe (reports use it too); JobsError, fmt and
# plural in jobs (status and summary lines use them).
__all__ = ["JobsError", "fmt", "plural", "table"]
