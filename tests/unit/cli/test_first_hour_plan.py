"""Issue 29, item 5: ``hpctrain plan`` plans the run ``hpctrain train`` would start (one composition, the
data chosen for the model included): on the commands the README and docs/ show (the README's headline,
docs/plan.md's examples), plan accepts exactly what train accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.launch.project import PROJECT_DIR_ENV

README_COMMANDS = [
    ["model=vit", "data=digits", "cluster.nproc=2"],
    ["model=vit", "parallel=3d", "cluster=a100x32"],
    ["model=gpt2_124m", "cluster=a100x32"],
    ["model=vit", "cluster=a100x32"],
    ["model.n_layers=32", "model.d_model=4096", "model.n_heads=32", "cluster=a100x32", "parallel=ddp"],
]


@pytest.mark.parametrize("argv", README_COMMANDS, ids=lambda a: " ".join(a)[:40])
def test_plan_and_train_agree(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PROJECT_DIR_ENV, str(tmp_path))
    planned = main(["plan", *argv])
    plan_out = capsys.readouterr()
    trained = main([*argv, "dry_run=true"])
    train_out = capsys.readouterr()
    assert "Traceback" not in plan_out.err + train_out.err
    assert planned in (0, 1), plan_out.err  # 2 would be a config plan refuses
    assert (planned == 0) == (trained == 0), (plan_out, train_out)
    # The data train chose for the model is the one plan planned, said the same way.
    chosen = [line for line in train_out.out.splitlines() if line.startswith("hpctrain: data=")]
    assert chosen == [line for line in plan_out.out.splitlines() if line.startswith("hpctrain: data=")]
    assert list(tmp_path.iterdir()) == []
