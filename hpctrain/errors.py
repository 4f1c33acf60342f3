"""The one error type a user sees for bad input: a single line naming the key, the value and what is valid."""

from __future__ import annotations

from typing import Any

EXIT_BAD_CONFIG = 2  # the exit status of a command refused in one line (a bad input), everywhere


class ConfigError(ValueError):
    """A rejected configuration. ``str()`` is one line: ``key=value: reason; valid: ...``."""

    def __init__(self, key: str, value: Any, reason: str, valid: str | None = None) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        self.valid = valid
        super().__init__(self.one_line())

    def one_line(self) -> str:
        shown = _show(self.value)
        text = f"{self.key}={shown}: {self.reason}" if self.key else self.reason
        if self.valid:
            text += f" (valid: {self.valid})"
        # Never more than one line, whatever the pieces held; no control character reaches the terminal.
        return printable(text, limit=None)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    # Control characters are shown escaped (\n, \x1b): the line stays one line and the terminal untouched.
    text = _escape(str(value))
    # Long enough for any real path; a pasted blob is cut so the message stays one readable line.
    return text if len(text) <= 400 else text[:397] + "..."


def _escape(text: str) -> str:
    return "".join(repr(ch)[1:-1] if ord(ch) < 32 or ord(ch) == 127 else ch for ch in text)


def printable(text: str, limit: int | None = 600) -> str:
    """``text`` as one terminal line: whitespace runs folded to a space, control characters escaped, cut at
    ``limit`` characters (None: whole)."""
    line = _escape(" ".join(text.split()))
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


class UserCodeError(ConfigError):
    """The user's own code raised: the one line, plus their traceback (their frames only: hpctrain's,
    Python's and installed packages' left out) for the caller to show above it."""

    def __init__(self, key: str, value: Any, err: BaseException) -> None:
        self.user_traceback = user_traceback(err)
        super().__init__(key, value, f"raised {type(err).__name__}: {first_line(err)}")


# Optional packages and the extra of hpctrain that installs each (pyproject.toml's optional-dependencies).
EXTRAS = {
    "transformers": "hf",
    "safetensors": "hf",
    "tokenizers": "hf",
    "datasets": "hf",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "optuna": "sweep",
    "hydra_plugins.hydra_optuna_sweeper": "sweep",
    "peft": "peft",
    "torchao": "float8",
}
# Packages whose import name is not the name pip installs them by: the message names what pip knows.
DISTRIBUTIONS = {"hydra_plugins.hydra_optuna_sweeper": "hydra-optuna-sweeper"}


def distribution(package: str) -> str:
    """The name a user knows a package by (pip's), for an import name such as ``transformers.models``."""
    return DISTRIBUTIONS.get(package) or package.split(".")[0]


def pip_line(package: str) -> str:
    """How to install an optional package: hpctrain's extra when one has it, else the package itself."""
    extra = EXTRAS.get(package) or EXTRAS.get(package.split(".")[0])
    return f"pip install 'hpctrain[{extra}]'" if extra else f"pip install {distribution(package)}"


class MissingPackage(ConfigError):
    """An optional package the run needs is not installed: one line naming it and its pip line."""

    def __init__(self, key: str, value: Any, package: str) -> None:
        self.package = package
        super().__init__(
            key,
            value,
            f"needs the package {distribution(package)!r}, not installed here",
            valid=pip_line(package),
        )


def require_package(key: str, value: Any, package: str) -> None:
    """Raise MissingPackage unless ``package`` can be imported here (found without importing it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        found = False
    if not found:
        raise MissingPackage(key, value, package)


class CheckpointMismatch(RuntimeError):
    """A committed, intact checkpoint that does not fit this run (another model shape, another config that
    cannot be honoured on resume). ``str()`` is one line: what differs and how to start fresh instead."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


START_FRESH = "to start fresh, use another run=NAME (or a new hydra.run.dir)"


def _library_roots() -> tuple[str, ...]:
    """Where code that is not the user's lives: hpctrain itself, the interpreter's standard library and
    every installed package (site-packages sits under one of the prefixes)."""
    import os
    import sys
    import sysconfig

    roots = {os.path.dirname(os.path.abspath(__file__)) + os.sep}
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        roots.add(os.path.join(os.path.abspath(prefix), ""))
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(os.path.join(os.path.abspath(path), ""))
    return tuple(roots)


def is_user_file(filename: str) -> bool:
    """Whether a traceback frame's file is the user's own code (not hpctrain, not Python, no package)."""
    import os

    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_library_roots())


def user_traceback(err: BaseException) -> str | None:
    """The frames of ``err``'s traceback that are the user's own code, as Python prints a traceback, with
    the exception's last line; None when no frame is the user's (the error is not theirs)."""
    import traceback

    frames = [f for f in traceback.extract_tb(err.__traceback__) if is_user_file(f.filename)]
    if not frames and not (isinstance(err, SyntaxError) and is_user_file(err.filename or "")):
        return None
    lines = ["Traceback of your code (most recent call last):\n", *traceback.format_list(frames)]
    return "".join([*lines, *traceback.format_exception_only(err)])


def underlying(err: BaseException) -> BaseException:
    """The error a wrapper stands for: DCP's ``CheckpointException`` (``failures``: {rank: (exception,
    traceback)}, its own text only "CheckpointException ranks:dict_keys([1])" on its first line) by its first
    failing rank's own error; any other error itself."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple) and inner:  # (exception, traceback) in some torch versions
            inner = inner[0]
        if isinstance(inner, BaseException):
            return inner
    return err


def first_line(err: BaseException, limit: int = 300) -> str:
    """An exception's message in one line (its type when it has none)."""
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:limit]


# Errors that mean a programming error where hpctrain's own code raised them; the errors hpctrain raises on
# purpose (a script that failed, a requeue refused) report someone else's failure.
BUG_TYPES = (
    AssertionError,
    AttributeError,
    IndexError,
    KeyError,
    NameError,
    NotImplementedError,
    TypeError,
    UnboundLocalError,
    ZeroDivisionError,
)


def error_facts(err: BaseException) -> dict[str, Any]:
    """What failure attribution reads of an error a worker recorded (hpctrain.resilience.attribution): its
    ``errno`` and path (an OSError, or one behind the error), and whose frame raised it (``origin``, with
    that ``frame`` as ``file:line in function``):

    - "hpctrain": hpctrain's own code raised a programming error itself (:data:`BUG_TYPES`), a bug;
    - "user": the innermost frame of the user's or hpctrain's code is the user's;
    - "injected": a fault injected on purpose (hpctrain.faults);
    - "library": otherwise (torch raised it on hpctrain's call: a device, a peer, a library's own fault);
    - "refusal": hpctrain's deliberate refusals (a rejected config, a checkpoint that does not fit).
    """
    import os
    import re
    import traceback

    facts: dict[str, Any] = {}
    chained: BaseException | None = err
    seen: set[int] = set()
    while chained is not None and id(chained) not in seen:  # the OSError behind a wrapper (a failed save's)
        if isinstance(chained, OSError) and chained.errno is not None:
            facts["errno"] = chained.errno
            if chained.filename is not None:
                facts["filename"] = os.fsdecode(chained.filename)
            break
        seen.add(id(chained))
        chained = chained.__cause__ or chained.__context__
    if "errno" not in facts:  # relayed in words (a collective save's failure carries its ranks' tracebacks)
        found = re.search(r"\[Errno (\d+)\]", str(err))
        if found:
            facts["errno"] = int(found.group(1))
    if isinstance(err, (ConfigError, CheckpointMismatch)) and not isinstance(err, UserCodeError):
        facts["origin"] = "refusal"
        return facts
    own = os.path.dirname(os.path.abspath(__file__)) + os.sep
    injected = os.path.join(own, "faults", "")
    # The user's code raised, and hpctrain said so: the frames are the original error's.
    raised = err.__cause__ if isinstance(err, UserCodeError) and err.__cause__ is not None else err
    frames = traceback.extract_tb(raised.__traceback__)
    facts["origin"] = "library"
    for depth, frame in enumerate(reversed(frames)):
        named = frame.filename and not frame.filename.startswith("<")
        path = os.path.abspath(frame.filename) if named else ""
        where = f"{frame.filename}:{frame.lineno} in {frame.name}"
        if path.startswith(injected):
            facts.update(origin="injected", frame=where)
            break
        if is_user_file(frame.filename):
            facts.update(origin="user", frame=where)
            break
        if path.startswith(own):  # hpctrain's bug: a programming error where its own code raised it
            if depth == 0 and isinstance(raised, BUG_TYPES):
                facts.update(origin="hpctrain", frame=where)
            break
    return facts
