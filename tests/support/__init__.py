"""Helpers every tier shares (``from tests.support import ...``): run the real CLI in a subprocess, read what
a run left in its directory, find its worker processes, compare checkpoints tensor by tensor.

Fixtures (``run_dir``, ``cli`` for an in-process command line, the user project) live in tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]
# The standard library's own sources: a corpus every machine has.
STDLIB = Path(sysconfig.get_paths()["stdlib"])

# Small and fast: a 2-layer GPT on 200 kB of the standard library's sources.
FAST = ["data.max_bytes=200000", "trainer.eval_batches=1", "logger=jsonl"]


def fork_server_imports() -> list[str]:
    """What the session's fork server imports besides torch (``--import``): transformers' model classes'
    common base when transformers is installed (the examples' gpt2_tiny and llama_tiny, LoRA and exports
    import it in every rank, ~5 CPU-s each here; forked from the server, a rank has it already)."""
    import importlib.util

    return ["transformers.modeling_utils"] if importlib.util.find_spec("transformers") is not None else []


def hpctrain(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m hpctrain ARGS`` to completion, output captured: this checkout's hpctrain, whatever ``cwd``
    is (a user's project folder, say) and whichever copy is installed."""
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": this_checkout_first(), **(env or {})},
    )


def trained(run: Path, *overrides: str, timeout: float = 600) -> Path:
    """``run``, trained here by ``python -m hpctrain OVERRIDES`` (a reference the tests hold others to)."""
    result = hpctrain(*overrides, f"hydra.run.dir={run}", timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def this_checkout_first() -> str:
    """PYTHONPATH with this checkout first: a process started outside it imports this hpctrain too, not an
    installed copy (an editable install of another checkout, on a machine shared by several)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    return os.pathsep.join([str(REPO), *rest])


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def worker_pids(run_dir: Path) -> list[int]:
    """Live processes running ``hpctrain.worker RUN_DIR`` (read from /proc, no extra dependency)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hpctrain.worker" in cmdline and str(run_dir).encode() in cmdline:
            found.append(int(entry.name))
    return found


def flat_tensors(tree: object, prefix: str = "") -> dict[str, torch.Tensor]:
    import torch

    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flat_tensors(value, f"{prefix}{key}."))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            out.update(flat_tensors(value, f"{prefix}{i}."))
    elif isinstance(tree, torch.Tensor):
        out[prefix.rstrip(".")] = tree
    return out


def model_and_optimizer(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every model and optimizer tensor of a committed checkpoint, by flattened key."""
    from hpctrain.checkpoint.tiers import read_checkpoint

    state = read_checkpoint(checkpoint)["model_optim"]
    tensors = flat_tensors(state)
    assert any(k.startswith("model.") for k in tensors) and any(k.startswith("optim.state.") for k in tensors)
    return tensors


def assert_same_state(run: Path, reference: Path, step: int) -> None:
    """``run``'s checkpoint of ``step`` holds the very model and optimizer tensors of ``reference``'s: the
    same keys, each bitwise equal."""
    import torch

    from hpctrain.rundir.checkpoints import checkpoint_name

    ours, theirs = (model_and_optimizer(d / "checkpoints" / checkpoint_name(step)) for d in (run, reference))
    unequal = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert ours.keys() == theirs.keys() and not unequal, f"{len(unequal)} tensors differ, e.g. {unequal[:3]}"


def checkpoint_values(run_dir: Path, step: int) -> dict[str, object]:
    """Every tensor and plain value of the weights, optimizer and scheduler in the run's checkpoint of
    ``step``, by flattened key."""
    from hpctrain.checkpoint.tiers import read_checkpoint
    from hpctrain.rundir import RunDir
    from hpctrain.rundir import checkpoints as layout

    out: dict[str, object] = {}

    def walk(tree: object, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix.rstrip(".")] = tree

    saved = read_checkpoint(RunDir(run_dir).checkpoints / layout.checkpoint_name(step))
    walk({k: v for k, v in saved.items() if k in ("model_optim", "scheduler")}, "")
    return out


def refused(result: subprocess.CompletedProcess[str], words: list[str]) -> str:
    """The one line a refused command printed: exit status 2, one line on stderr starting ``hpctrain: `` and
    holding every word, no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hpctrain: ")
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


# The ``cli`` fixture of tests/conftest.py: ``hpctrain ARGS`` in this process, its exit status and output.
CLI = Callable[..., "subprocess.CompletedProcess[str]"]
