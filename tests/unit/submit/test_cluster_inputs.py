"""Bad values of the keys issue 32 added (cluster.pack, a partition list), through the real command line: one
line on stderr naming key and value, exit 2, nothing created, no traceback. No Slurm needed (those that ask
Slurm are in tests/slurm/test_site.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import CLI

SLURM = "cluster=slurm_test"

BAD = [
    (["-m", SLURM, "cluster.pack=0", "optim.lr=1e-3,2e-3"], ["cluster.pack=0", "≥ 1"]),
    (["-m", SLURM, "cluster.pack=-2", "optim.lr=1e-3,2e-3"], ["cluster.pack=-2"]),
    (["-m", SLURM, "cluster.pack=3", "optim.lr=1e-3,2e-3"], ["cluster.pack=3", "2 members", "1..2"]),
    ([SLURM, "cluster.pack=2"], ["cluster.pack=2", "a single run", "1..1"]),
    ([SLURM, "cluster.pack=abc"], ["cluster.pack", "abc"]),
    ([SLURM, "cluster.pack="], ["cluster.pack"]),
    ([SLURM, "cluster.pack='x\n'"], ["cluster.pack", "\\n"]),
    ([SLURM, "cluster.partition='debug,,long'"], ["cluster.partition=debug,,long", "empty partition name"]),
    ([SLURM, "cluster.partition='debug,lo\tng'"], ["cluster.partition", "\\t"]),
]


@pytest.mark.parametrize(("overrides", "words"), BAD, ids=[repr(" ".join(o)) for o, _ in BAD])
def test_bad_cluster_values_are_one_line(
    cli: CLI, tmp_path: Path, overrides: list[str], words: list[str]
) -> None:
    where = "hydra.sweep.dir" if "-m" in overrides else "hydra.run.dir"
    result = cli("dry_run=true", *overrides, f"{where}={tmp_path / 'out'}")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: "), result.stderr
    assert all(word in lines[0] for word in words), (words, lines[0])
    assert "Traceback" not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == [], "something was created"


EVAL_JOB = [
    ([SLURM, "trainer.eval_job=nope"], ["trainer.eval_job=nope", "no cluster profile", "slurm_test"]),
    ([SLURM, "trainer.eval_job=local"], ["trainer.eval_job=local", "not a Slurm cluster profile"]),
    (["trainer.eval_job=slurm_test"], ["trainer.eval_job=slurm_test", "runs here"]),
    ([SLURM, "trainer.eval_job=''"], ["trainer.eval_job=", "no cluster profile so named"]),
    ([SLURM, "trainer.eval_job='slurm_test\n'"], ["trainer.eval_job", "\\n"]),
]


@pytest.mark.parametrize(("overrides", "words"), EVAL_JOB, ids=[repr(" ".join(o)) for o, _ in EVAL_JOB])
def test_bad_eval_job_is_one_line(cli: CLI, tmp_path: Path, overrides: list[str], words: list[str]) -> None:
    test_bad_cluster_values_are_one_line(cli, tmp_path, overrides, words)
