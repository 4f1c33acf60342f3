"""Issue 29, item 6: an unknown key of a user's model or dataset says "did you mean", lists the real
parameters of the user's factory (from its signature) and hpctrain's own keys; any parameter of the
factory is a plain override (no ``+``), as is hpctrain's ``data.collate._target_``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.launch.project import PROJECT_DIR_ENV

NET = (
    "import torch\n\ndef wide_net(width=8, num_classes=10, depth=1):\n"
    "    return torch.nn.Linear(4, num_classes)\n"
)
DATA = (
    "import torch\n\nclass Pairs(torch.utils.data.Dataset):\n"
    "    def __init__(self, split, n=32, noise=0.0):\n        self.n = n\n"
    "    def __len__(self):\n        return self.n\n"
    "    def __getitem__(self, i):\n        return torch.zeros(4), torch.tensor(i % 10)\n"
    "\ndef stack(items):\n    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])\n"
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    (tmp_path / "keyproj").mkdir()
    (tmp_path / "keyproj" / "__init__.py").write_text("")
    (tmp_path / "keyproj" / "nets.py").write_text(NET)
    (tmp_path / "keyproj" / "data.py").write_text(DATA)
    for group, text in (
        ("model", "_target_: keyproj.nets.wide_net\nwidth: 8\n"),
        ("data", "_target_: keyproj.data.Pairs\n"),
    ):
        (tmp_path / "conf" / group).mkdir(parents=True)
        (tmp_path / "conf" / group / "mine.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PROJECT_DIR_ENV, str(tmp_path))
    return [
        "--config-dir",
        "conf",
        "model=mine",
        "data=mine",
        "parallel=none",
        "cluster.nproc=1",
        "dry_run=true",
    ]


def _line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_misspelt_model_key_says_did_you_mean_and_lists_the_factorys_parameters(project, capsys):
    line = _line(capsys, [*project, "model.widht=32"])
    assert "did you mean width?" in line and "+model" not in line
    assert "keyproj.nets.wide_net's parameters: width, num_classes, depth" in line
    assert "hpctrain's: init_from, init_strict" in line


def test_a_misspelt_data_key_lists_the_datasets_own_parameters(project, capsys):
    line = _line(capsys, [*project, "data.nois=0.1"])
    assert "did you mean noise?" in line
    assert "keyproj.data.Pairs's parameters: n, noise" in line and "num_workers" in line
    assert "max_bytes" not in line  # a built-in dataset's key, not the user's


def test_any_parameter_of_the_factory_is_a_plain_override(project, capsys):
    # num_classes and depth are not in conf/model/mine.yaml, n not in conf/data/mine.yaml: no + needed
    argv = [
        *project,
        "model.num_classes=10",
        "model.depth=2",
        "data.n=16",
        "data.collate._target_=keyproj.data.stack",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    assert main([*argv, "--cfg", "job"]) == 0
    printed = capsys.readouterr().out
    assert "depth: 2" in printed and "_target_: keyproj.data.stack" in printed
