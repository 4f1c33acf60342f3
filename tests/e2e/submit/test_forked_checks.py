"""The checks that import torch (a user's model, data and loss on the meta device, init_from, the memory fit:
hpctrain.submit.torchside) run in a child of the persistent fork server the suite's runs share
(``HPCTRAIN_FORKSERVER``): the command's own process imports no torch, and what it says is what it says when
it checks itself (``HPCTRAIN_FORKSERVER=off``): the same one line, the user's own traceback, nothing written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import hpctrain, this_checkout_first

# ``-X importtime``: the command's interpreter lists every module it imports on stderr (the forked child
# does not: it was not started, and torch was imported by its server). Not PYTHONPROFILEIMPORTTIME: the
# child's environment is the command's, and a fork cannot be what that variable makes of a fresh interpreter
# (the server starts one instead, which imports torch).
IMPORTS_TORCH = re.compile(r"^import time:.*\|\s+torch$", re.M)
SAID = re.compile(r"^(?!import time:).*$", re.M)
CNN = ["--config-dir", "conf", "model=cnn", "data=digits8"]


def _said(stderr: str) -> list[str]:
    return [line for line in SAID.findall(stderr) if line.strip()]


def _listing_imports(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -X importtime -m hpctrain ARGS`` in the project, with the suite's fork server."""
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpctrain", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": this_checkout_first()},
    )


def _both_ways(
    project: Path, run: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    forked = _listing_imports(project, *args, f"hydra.run.dir={run}")
    here = hpctrain(*args, f"hydra.run.dir={run}", cwd=project, env={"HPCTRAIN_FORKSERVER": "off"})
    return forked, here


@pytest.mark.parametrize(
    "args, last",
    [
        (
            [*CNN, "model._target_=mynets.bad.raising"],
            "hpctrain: model._target_=mynets.bad.raising: raised ValueError: width must be even",
        ),
        (
            [*CNN, "model._target_=mynets.bad.needs_depth"],
            "hpctrain: model._target_=mynets.bad.needs_depth: cannot take its arguments: missing a required "
            "argument: 'depth'",
        ),
        (
            [*CNN, "data._target_=mynets.bad.StrItems"],
            None,  # the line as the in-process check words it
        ),
        (["--config-dir", "conf", "model=gpt2_tiny", "data=digits8"], None),
    ],
    ids=["users-exception", "missing-argument", "str-items", "transformers-on-images"],
)
def test_a_refusal_from_the_servers_child_is_the_one_of_this_process(
    project: Path, tmp_path: Path, args: list[str], last: str | None
) -> None:
    forked, here = _both_ways(project, tmp_path / "r", *args)
    assert forked.returncode == here.returncode == 2, forked.stderr[-3000:]
    assert not IMPORTS_TORCH.search(forked.stderr), "the command imported torch itself"
    said, expected = _said(forked.stderr), _said(here.stderr)
    # From the traceback (when the user's code raised) to the one line: the same. Not above it: importing
    # transformers here prints torchao's load warnings, which the server's child (imported already) does not.
    start = next((i for i, line in enumerate(expected) if line.startswith("Traceback")), len(expected) - 1)
    assert said[-(len(expected) - start) :] == expected[start:], (said, expected)
    assert said[-1].startswith("hpctrain: ") and "Traceback (most recent call last)" not in said[-1]
    if last is not None:
        assert said[-1] == last
    if "raising" in " ".join(args):  # the user's frames, and none of hpctrain's
        assert any('mynets/bad.py", line 6, in raising' in line for line in said)
        assert not any("/hpctrain/" in line for line in said)
    assert not (tmp_path / "r").exists(), "nothing written"


def test_a_users_model_checked_by_the_servers_child_trains(project: Path, tmp_path: Path) -> None:
    run = tmp_path / "r"
    result = _listing_imports(
        project,
        "--config-dir",
        "conf",
        "model=gpt2_tiny",
        "data=bytes",
        "data.max_bytes=60000",
        "trainer.max_steps=1",
        "trainer.eval_batches=1",
        "logger=jsonl",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not IMPORTS_TORCH.search(result.stderr), "the command imported torch itself"
    assert (run / "checkpoints").is_dir()
