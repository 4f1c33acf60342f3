"""The one error type a user sees for bad input: a single line naming the key, the value and what is valid."""

from __future__ import annotations

from typing import Any


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
        return _escape(" ".join(text.split()))


def _show(value: Any) -> str:
    if value is None:
        return "null"
    # Control characters are shown escaped (\n, \x1b): the line stays one line and the terminal untouched.
    text = _escape(str(value))
    # Long enough for any real path; a pasted blob is cut so the message stays one readable line.
    return text if len(text) <= 400 else text[:397] + "..."


def _escape(text: str) -> str:
    return "".join(repr(ch)[1:-1] if ord(ch) < 32 or ord(ch) == 127 else ch for ch in text)


class CheckpointMismatch(RuntimeError):
    """A committed, intact checkpoint that does not fit this run (another model shape, another config that
    cannot be honoured on resume). ``str()`` is one line: what differs and how to start fresh instead."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


START_FRESH = "to start fresh, use a new hydra.run.dir or trainer.resume=never"
