"""A user's model, data and loss checked before anything starts (hpctrain.submit.probe, run by the precheck):
each way a user's code goes wrong is one line, and an exception of their own shows their frames only.
In this process, from a copy of examples/user_project (tests/conftest.py's ``project``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from tests.support import CLI

WRONG = [
    (["model._target_=mynets.nosuch.build"], "model._target_=mynets.nosuch.build: cannot be imported"),
    (["model._target_=builtins.dict"], "returned dict, not an nn.Module"),
    (
        ["model._target_=mynets.bad.needs_depth"],
        "cannot take its arguments: missing a required argument: 'depth'",
    ),
    (["+model.depth=3"], "got an unexpected keyword argument 'depth'"),
    (["model._target_=", "data=digits8"], "model._target_=: missing or empty"),
    (["data._target_=mynets.bad.not_a_dataset"], "returned int, not a map-style dataset"),
    (["data._target_=mynets.bad.StrItems"], "item 0 is a str"),
    (
        ["data._target_=mynets.bad.OneHotDigits"],
        "loss._target_=hpctrain.train.loss.cross_entropy: cannot read",
    ),
    (["model=gpt2_tiny"], "a batch of it cannot go through model transformers.GPT2LMHeadModel"),
    (["loss._target_=mynets.nosuch.f"], "loss._target_=mynets.nosuch.f: cannot be imported"),
    (["data.num_workers=-1"], "data.num_workers=-1: must be ≥ 0"),
    (["data.num_workers=two"], "data.num_workers=two: expected int"),
    (["data.target_key=''"], "data.target_key=: empty"),
    (["data.collate=5"], "data.collate=5: not a callable"),
    (
        ["+data.collate._target_=mynets.nosuch.collate"],
        "data.collate._target_=mynets.nosuch.collate: cannot be",
    ),
    (
        ["model._target_='mynets.cnn\tbuild'"],
        "model._target_=mynets.cnn\\tbuild: not a dotted import path",
    ),
    (["parallel=tp"], "parallel.tp=2: model Sequential has no tensor-parallel plan: set parallel.tp_plan"),
    (
        ["parallel=tp", "parallel.tp_plan={head: rowwise}"],
        "parallel.tp_plan[head]=rowwise: the pattern names no",
    ),
    (["parallel=pp"], "parallel.pp=2: model Sequential has no block list to split into pipeline stages"),
    (["data=text"], "data=text: cuts windows of the model's seq_len"),
    (
        ["parallel=fsdp", "parallel.block_classes=[Conv3d]"],
        "parallel.block_classes=Conv3d: no module of this",
    ),
    (["model.width='a\x1bb'"], "model.width=a\\x1bb: contains the control character"),
    (["model.width=a\x1bb"], "cannot parse override 'model.width=a\\x1bb'"),
]


@pytest.mark.parametrize(("args", "words"), WRONG, ids=[" ".join(a) for a, _ in WRONG])
def test_wrong_user_inputs_are_one_line(
    in_project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
):
    """In this process (the same precheck the CLI runs, without an interpreter start per case)."""
    code = main(
        ["--config-dir", "conf", "model=cnn", "data=digits8", *args, f"hydra.run.dir={tmp_path / 'r'}"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("hpctrain: "), err
    assert words in err[0], err
    assert not (tmp_path / "r").exists(), "nothing written"


def test_users_own_exception_shows_their_traceback_only(cli: CLI, in_project: Path, tmp_path: Path):
    result = cli(
        "--config-dir",
        "conf",
        "model=cnn",
        "data=digits8",
        "model._target_=mynets.bad.raising",
        f"hydra.run.dir={tmp_path}/r",
        cwd=in_project,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "hpctrain: model._target_=mynets.bad.raising: raised ValueError: width must be even"
    assert 'mynets/bad.py", line 6, in raising' in result.stderr
    assert "/hpctrain/" not in result.stderr and "hydra" not in result.stderr.lower()
    assert not (tmp_path / "r").exists()
