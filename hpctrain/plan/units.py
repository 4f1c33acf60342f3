"""How the plan writes sizes, times, FLOPs and money: one formatter each, in the unit that keeps the number
at 1 or more (a 100k-parameter model's state is ``1.56 MiB``, not ``0.00 GiB``; its step ``20.3 µs``, not
``0.000 s``). Every place that prints a plan (``hpctrain plan``, a dry run's line, the refusal of a run
that does not fit) writes through these. Torch-free.
"""

from __future__ import annotations

import math

_BYTES = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
# Durations below a second in SI submultiples; above a minute in minutes, then hours, then days.
_SHORT = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))
_LONG = (("d", 86400.0), ("h", 3600.0), ("min", 60.0))
_SI = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, trailing zeros kept and thousands separated:
    1.50, 12.5, 125, 1,250."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def size(n: float, decimals: int = 2) -> str:
    """Bytes in binary units, the largest that keeps the number ≥ 1, with ``decimals`` decimals: 80.00 GiB,
    12.50 MiB, 3.25 KiB, 512 B (the GiB figures of large models read as they always did)."""
    unit, scale = size_unit(n)
    return f"{n / scale:.{decimals}f} {unit}" if scale > 1 else f"{n:.0f} B"


def size_unit(n: float) -> tuple[str, int]:
    """The binary unit :func:`size` writes ``n`` bytes in, and its bytes: ("MiB", 2**20); ("B", 1)."""
    return next(((unit, scale) for unit, scale in _BYTES if abs(n) >= scale), ("B", 1))


def duration(seconds: float, digits: int = 3) -> str:
    """Seconds, with ``digits`` significant digits, in the unit that keeps the number ≥ 1: 1.60 s,
    120 ms, 20.3 µs, 4.50 min, 2.00 h."""
    if seconds == 0:
        return "0 s"
    for unit, scale in _LONG:
        if abs(seconds) >= 2 * scale:  # 90 s stays seconds; two minutes and more are minutes
            return f"{significant(seconds / scale, digits)} {unit}"
    for unit, scale in _SHORT:
        if abs(seconds) >= scale:
            return f"{significant(seconds / scale, digits)} {unit}"
    return f"{significant(seconds / 1e-9, digits)} ns"


def gpu_time(hours: float) -> str:
    """GPU time of a run: GPU-hours from a hundredth of one up, else GPU-seconds (never ``0.00
    GPU-hours``)."""
    if hours == 0 or abs(hours) >= 0.01:
        return f"{significant(hours)} GPU-hours"
    return f"{significant(hours * 3600)} GPU-seconds"


def flop(n: float) -> str:
    """A number of floating-point operations with an SI prefix: 448 TFLOP, 5.51 GFLOP."""
    for prefix, scale in _SI:
        if abs(n) >= scale:
            return f"{significant(n / scale)} {prefix}FLOP"
    return f"{significant(n)} FLOP"


def money(amount: float) -> str:
    """Dollars with cents, or two significant digits below a cent ($0.0012, never $0.00 for a cost)."""
    if amount == 0 or abs(amount) >= 0.01:
        return f"${amount:,.2f}"
    return f"${significant(amount, 2)}"
