"""What filled a GPU's memory when a rank ran out of it: the CUDA allocator's history, armed before the model
is built, and on ``torch.OutOfMemoryError`` a snapshot and its summary in the run directory.

``trainer.memory_history``: true arms it on a CUDA run; null (the default) arms it when an earlier attempt of
the run ran out of memory (its fault log says so), so the next one shows why; false never. A CPU run has
no allocator history (its out-of-memory kill is the host's: hpctrain.launch.exits names it with the peak
RSS and the plan's host memory).

On the OOM each rank writes ``memory/rank<R>.pickle`` (the allocator's snapshot, for torch's viewer at
https://pytorch.org/memory_viz) and ``memory/rank<R>.json``: the bytes allocated, the largest live
allocations grouped by the first frame outside torch (``gpt.py:88 in forward``). Its supervisor names them
in the rank's verdict, beside the plan's figure for the rank (hpctrain plan). The error itself is raised on:
the exit status is never 0.

Cost: recording keeps each allocation's Python stack in a ring of :data:`MAX_ENTRIES` (PyTorch's
"Understanding CUDA memory usage" page advises recording in a job that already ran out); it was not measured
here, where no GPU is lent (tests/gpu/test_cuda_path.py measures it on one).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_json, atomic_write

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000  # allocations and frees kept, each with its stack
TOP = 5  # the largest live allocations a summary names
OOM_KIND = "out of memory"  # hpctrain.resilience.policy.OOM, as the fault log records it


def wanted(setting: bool | None, on_cuda: bool, run_dir: Path) -> bool:
    """Whether to arm the history: ``trainer.memory_history``, or (null) after an attempt that ran out."""
    if not on_cuda or setting is False:
        return False
    if setting:
        return True
    return any(r.get("kind") == OOM_KIND for r in RunDir(run_dir).read_answers())


def arm() -> None:
    from hpctrain import torchapi

    torchapi.record_memory_history(MAX_ENTRIES)


def top_allocations(snapshot: dict[str, Any], top: int = TOP) -> tuple[int, list[dict[str, Any]]]:
    """The bytes allocated, and the ``top`` places holding the most of them: the live blocks of every segment
    grouped by their first frame outside torch (the innermost, where the history has one)."""
    places: dict[str, list[int]] = {}
    allocated = 0
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            size = int(block.get("size", 0))
            allocated += size
            where = _place(block.get("frames") or [])
            held = places.setdefault(where, [0, 0])
            held[0] += size
            held[1] += 1
    ranked = sorted(places.items(), key=lambda item: -item[1][0])[:top]
    return allocated, [{"bytes": b, "blocks": n, "where": where} for where, (b, n) in ranked]


def _place(frames: list[dict[str, Any]]) -> str:
    for frame in frames:
        name = str(frame.get("filename", ""))
        if name and "/torch/" not in name and not name.startswith("??"):
            return f"{_short(name)}:{frame.get('line', '?')} in {frame.get('name', '?')}"
    return "no frame outside torch" if frames else "no stack recorded"


def _short(file: str) -> str:
    parts = Path(file).parts
    for root in ("hpctrain", "site-packages"):
        if root in parts:
            return "/".join(parts[parts.index(root) + (root == "site-packages") :])
    return "/".join(parts[-2:])


def write_oom(run_dir: Path, rank: int) -> Path | None:
    """On an out-of-memory error with the history armed: the snapshot and its summary (module docstring);
    the summary's path, None when nothing could be written (the OOM is raised on all the same)."""
    import pickle

    from hpctrain import torchapi

    rd = RunDir(run_dir)
    try:
        snapshot = torchapi.memory_snapshot()
        allocated, top = top_allocations(snapshot)
        rd.memory.mkdir(parents=True, exist_ok=True)
        atomic_write(rd.memory_snapshot(rank), pickle.dumps(snapshot))  # plain data, for torch's viewer
        summary = {"allocated": allocated, "top": top}
        atomic_json(rd.memory_summary(rank), summary)
    except (OSError, RuntimeError) as err:  # a full disk, a snapshot torch cannot take
        log.warning("no memory snapshot written: %s", err)
        return None
    log.error("Out of memory: %s", summary_line(summary))
    return rd.memory_summary(rank)


def summary_line(summary: dict[str, Any]) -> str:
    """'70.1 GiB allocated; largest: 20.0 GiB in 12 blocks at models/gpt.py:88 in forward, ... (plan: 61.2 GiB
    per GPU)'."""
    gib = 1024**3
    top = ", ".join(
        f"{t['bytes'] / gib:.2f} GiB in {t['blocks']} at {t['where']}" for t in summary["top"][:3]
    )
    plan = f" (plan: {summary['plan'] / gib:.2f} GiB for the rank)" if summary.get("plan") else ""
    return f"{summary['allocated'] / gib:.2f} GiB allocated; largest: {top or 'none'}{plan}"


def read_summary(run_dir: Path, rank: int) -> str | None:
    """The one line of a rank's memory summary, None when it wrote none."""
    try:
        return summary_line(json.loads(RunDir(run_dir).memory_summary(rank).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
