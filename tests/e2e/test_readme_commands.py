"""Issue 29, acceptance b: every command of the README's ``bash`` blocks, run as written on a fresh copy of
the checkout, in order, prints no traceback and no warning and exits 0.

What the lines are: ``python -m hpctrain …`` and ``hpctrain …`` run as written (``hpctrain`` is
``python -m hpctrain`` of the copy); a command on a Slurm profile runs as a dry run (``dry_run=true``: the
whole check and the rendered submission, nothing submitted), so the test needs no cluster; ``cd DIR`` moves
the following lines of its block. Not run: ``pip install`` (the environment is the suite's own, installed
once; reinstalling from the copy would change it for every other test) and the lines that start and stop
the Slurm test cluster (``python -m tests.slurm.cluster up|down``: test infrastructure, which
tests/slurm/ runs under its lock). Other fences (plain, ``python``) show output or code, not commands.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM_PROFILES = {p.stem for p in (REPO / "conf" / "cluster").glob("*.yaml")} - {"local"}
SKIPPED = (re.compile(r"^pip install "), re.compile(r"tests\.slurm\.cluster (up|down)"))


def readme_commands() -> list[tuple[int, str, list[str]]]:
    """(block number, the folder relative to the checkout, the command) for every command line."""
    text = (REPO / "README.md").read_text()
    commands = []
    for number, block in enumerate(re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)):
        folder = "."
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words:  # `A && B`: each command in turn
                cut = words.index("&&") if "&&" in words else len(words)
                command, words = words[:cut], words[cut + 1 :]
                text = shlex.join(command)
                if not command or any(p.search(text) for p in SKIPPED):
                    continue
                if command[0] == "cd":
                    folder = str(Path(folder) / command[1])
                    continue
                commands.append((number, folder, command))
    return commands


def _argv(words: list[str]) -> list[str]:
    if words[0] == "hpctrain":
        words = ["python", "-m", "hpctrain", *words[1:]]
    assert words[:3] == ["python", "-m", "hpctrain"], f"not an hpctrain command: {words}"
    rest = words[3:]
    if any(w.startswith("cluster=") and w.split("=", 1)[1] in SLURM_PROFILES for w in rest):
        rest.append("dry_run=true")
    return [sys.executable, "-m", "hpctrain", *rest]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of the checkout: the files git tracks or would track, nothing a run left."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO, check=True,
        capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


def test_the_readme_has_commands():
    blocks = {number for number, _, _ in readme_commands()}
    assert len(blocks) >= 3 and len(readme_commands()) >= 6


def test_every_readme_command_runs_as_written(checkout: Path):
    env = {**os.environ, "PYTHONPATH": str(checkout)}  # the copy's hpctrain, as an editable install of it
    env.pop("SLURM_CONF", None)
    for number, folder, words in readme_commands():
        result = subprocess.run(
            _argv(words), cwd=checkout / folder, env=env, capture_output=True, text=True, timeout=900
        )
        shown = f"README block {number}, in {folder}: {shlex.join(words)}\n"
        shown += result.stdout[-2000:] + result.stderr[-3000:]
        assert result.returncode == 0, shown
        output = result.stdout + result.stderr
        assert "Traceback" not in output, shown
        assert not re.search(r"\bwarning\b", output, flags=re.I), shown
