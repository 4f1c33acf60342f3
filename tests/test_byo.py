"""Bring your own model, data and loss: examples/user_project, copied to a folder outside the package and
run from there as a user would (``python -m hpctrain --config-dir conf ...``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO, hpctrain, metrics
from test_resume import model_and_optimizer

from hpctrain.cli import main
from hpctrain.errors import CheckpointMismatch
from hpctrain.train.overrides import check_changes, config_changes

EXAMPLE = REPO / "examples" / "user_project"
SHORT = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "logger=jsonl"]
# Test-only user code that goes wrong in the ways a user's code does.
BAD = """
import torch


def raising(width: int = 3, num_classes: int = 10):
    raise ValueError("width must be even")


def needs_depth(depth: int, width: int = 3):
    return torch.nn.Linear(depth, width)


def not_a_dataset(split: str):
    return 5


class StrItems(torch.utils.data.Dataset):
    def __init__(self, split: str):
        pass

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return "an image"


class Pooled(torch.nn.Module):
    # embed, blocks, head, but the forward pools over the sequence: not what the stages give

    def __init__(self, vocab_size: int = 256, width: int = 64, depth: int = 4):
        super().__init__()
        from mynets.mixer import Residual

        self.embed = torch.nn.Embedding(vocab_size, width)
        self.blocks = torch.nn.ModuleList(Residual(width) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


class OneHotDigits(torch.utils.data.Dataset):
    def __init__(self, split: str):
        pass

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(1, 8, 8), torch.nn.functional.one_hot(torch.tensor(i), 10).float()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user") / "project"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    (folder / "mynets" / "bad.py").write_text(BAD)
    return folder


def user(project: Path, *args: str, timeout: float = 300):
    return hpctrain("--config-dir", "conf", *args, cwd=project, timeout=timeout)


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run)}


@pytest.mark.parametrize(
    "args",
    [
        ["model=gpt2_tiny", "data=bytes", "data.max_bytes=100000"],
        ["model=gpt2_tiny", "data=bytes", "data.max_bytes=100000", "data.shift=false", "loss=model"],
    ],
    ids=["gpt2-bytes", "gpt2-own-loss"],  # the CNN trains in the resume test below
)
def test_users_model_and_data_train_from_their_folder(project: Path, tmp_path: Path, args: list[str]):
    run = tmp_path / "run"
    result = user(project, *args, *SHORT, "trainer.max_steps=30", "cluster.nproc=2", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr
    seen = losses(run)
    first, last = sum(seen[s] for s in (1, 2, 3)) / 3, sum(seen[s] for s in (28, 29, 30)) / 3
    assert last < 0.8 * first, (first, last)
    assert "val_loss" in metrics(run)[-1]


def test_resume_of_a_users_model_and_data_with_workers_is_exact(project: Path, tmp_path: Path):
    args = [
        "model=cnn", "data=digits8", "data.num_workers=2", *SHORT, "trainer.max_steps=20",
        "trainer.ckpt_every=10", "cluster.nproc=2", "optim.lr=1e-2", "optim.warmup_steps=2",
    ]  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    assert user(project, *args, f"hydra.run.dir={a}").returncode == 0
    # The second half again from the first's step-10 checkpoint, with new workers (a crash before the resume,
    # tests/test_resume.py's case, changes nothing of what is loaded).
    resumed = user(project, *args, f"trainer.resume={a}/checkpoints/step_00000010", f"hydra.run.dir={b}")
    assert resumed.returncode == 0, resumed.stderr
    assert "(step 10)" in resumed.stdout
    expected = losses(a)
    assert expected[20] < 0.8 * expected[1], expected  # it learns
    assert {s: v for s, v in losses(b).items() if s > 10} == {s: expected[s] for s in range(11, 21)}
    # Another split of the user's data cannot continue this run (checked as the worker does, in one line);
    # other workers can.
    checkpoint = b / "checkpoints" / "step_00000020"
    saved = (checkpoint / "config.yaml").read_text()
    edited = tmp_path / "edited" / "config.yaml"
    edited.parent.mkdir()
    edited.write_text(
        saved.replace("val_fraction: 0.1", "val_fraction: 0.2").replace("num_workers: 2", "num_workers: 0")
    )
    changes = config_changes(checkpoint, edited)
    assert set(changes) == {"data.val_fraction"}
    with pytest.raises(CheckpointMismatch, match=r"^data.val_fraction=0.2: checkpoint .* was trained with"):
        check_changes(checkpoint, changes)
    final_a = model_and_optimizer(a / "checkpoints" / "step_00000020")
    final_b = model_and_optimizer(b / "checkpoints" / "step_00000020")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_transformers_gpt2_under_ddp_and_fsdp_matches_one_process(project: Path, tmp_path: Path):
    """5 steps of the same global batch of 16: 1 process vs DDP and FSDP + activation checkpointing on 2."""
    common = [
        "model=gpt2_tiny", "data=bytes", "data.max_bytes=100000", *SHORT, "trainer.max_steps=5",
        "trainer.global_batch_size=16", "trainer.micro_batch_size=8",
    ]  # fmt: skip
    layouts = {
        "one": ["parallel=none", "cluster.nproc=1", "trainer.micro_batch_size=16"],
        "ddp": ["parallel=ddp", "cluster.nproc=2"],
        "fsdp": ["parallel=fsdp", "parallel.activation_checkpointing=full", "cluster.nproc=2"],
    }
    runs = {}
    for name, extra in layouts.items():
        runs[name] = tmp_path / name
        result = user(project, *common, *extra, f"hydra.run.dir={runs[name]}")
        assert result.returncode == 0, (name, result.stderr)
    reference = losses(runs["one"])
    weights = model_and_optimizer(runs["one"] / "checkpoints" / "step_00000005")
    for name in ("ddp", "fsdp"):
        got = losses(runs[name])
        assert max(abs(got[s] - reference[s]) for s in range(1, 6)) < 1e-5, (name, got, reference)
        final = model_and_optimizer(runs[name] / "checkpoints" / "step_00000005")
        worst = max(float((final[k] - weights[k]).abs().max()) for k in weights if k.startswith("model."))
        assert worst < 1e-5, (name, worst)


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
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, args: list[str], words: str
):
    """In this process (the same precheck the CLI runs, without an interpreter start per case)."""
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    code = main(
        ["--config-dir", "conf", "model=cnn", "data=digits8", *args, f"hydra.run.dir={tmp_path / 'r'}"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("hpctrain: "), err
    assert words in err[0], err
    assert not (tmp_path / "r").exists(), "nothing written"


def test_users_own_exception_shows_their_traceback_only(project: Path, tmp_path: Path):
    result = user(
        project,
        "model=cnn",
        "data=digits8",
        "model._target_=mynets.bad.raising",
        f"hydra.run.dir={tmp_path}/r",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "hpctrain: model._target_=mynets.bad.raising: raised ValueError: width must be even"
    assert 'mynets/bad.py", line 6, in raising' in result.stderr
    assert "/hpctrain/" not in result.stderr and "hydra" not in result.stderr.lower()
    assert not (tmp_path / "r").exists()


def test_built_in_models_are_ordinary_targets():
    from hpctrain.config.compose import compose, to_typed

    for option, target in (("gpt", "hpctrain.models.gpt.GPT"), ("vit", "hpctrain.models.vit.ViT")):
        assert to_typed(compose([f"model={option}", "data=synthetic"])).model.target == target
    # The core never asks which model it trains: no model names outside the models' own rooms.
    hits = []
    for path in (REPO / "hpctrain").rglob("*.py"):
        if path.parent.name in ("models",) or path.name in ("parity.py", "plan_measure.py"):
            continue
        text = path.read_text()
        hits += [
            f"{path.name}: {w}"
            for w in ("GPTSpec", "ViTSpec", ".arch", "GPTConfig", "ViTConfig")
            if w in text
        ]
    assert not hits, hits
