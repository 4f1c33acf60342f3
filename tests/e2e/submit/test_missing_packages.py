"""A missing optional package is named with its pip line before anything is written: one line, exit 2, no
traceback, no run directory, no outputs/ or multirun/ folder, no output file. The packages are installed
here (the dev extra), so each is taken away from one CLI process: a ``sitecustomize`` on its PYTHONPATH
refuses to import the named modules (ModuleNotFoundError with its ``name``, as Python raises for a package
that is not there), ``importlib.util.find_spec`` finds none of them, and ``pkgutil`` lists none (Hydra finds
its plugins by listing ``hydra_plugins``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.launch.forked import FORKSERVER_ENV, OFF
from tests.support import hpctrain, refused, this_checkout_first

# What an uninstalled package looks like from inside the process, for the top-level modules (and dotted
# subpackages) listed in HPCTRAIN_TEST_ABSENT.
ABSENT = """
import importlib.abc
import importlib.util
import os
import pkgutil
import sys

ABSENT = tuple(name for name in os.environ.get("HPCTRAIN_TEST_ABSENT", "").split(",") if name)


def absent(name):
    return any(name == gone or name.startswith(gone + ".") for gone in ABSENT)


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if absent(fullname):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, Absent())
_find_spec = importlib.util.find_spec


def find_spec(name, package=None):
    full = importlib.util.resolve_name(name, package) if name.startswith(".") else name
    return None if absent(full) else _find_spec(name, package)


importlib.util.find_spec = find_spec
_iter_modules = pkgutil.iter_modules


def iter_modules(path=None, prefix=""):
    return (found for found in _iter_modules(path, prefix) if not absent(found.name))


pkgutil.iter_modules = iter_modules
"""

SMALL = ["data.max_bytes=50000", "trainer.max_steps=2"]
OPTUNA = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optim.lr=interval(0.0001,0.01)", *SMALL]
GPT2 = (
    "{_target_: transformers.GPT2Config, n_layer: 1, n_embd: 32, n_head: 2, vocab_size: 256, n_positions: 64}"
)
HF_LM = ["model=hf_lm", f"+model.config={GPT2}", *SMALL]
EXPORT_HF = ["export", "{src}", "--to", "hf", "--format", "hf"]
PLUGIN = "hydra_plugins.hydra_optuna_sweeper"
SWEEP, HF, TB, WANDB, FLOAT8 = (
    f"pip install 'hpctrain[{x}]'" for x in ("sweep", "hf", "tensorboard", "wandb", "float8")
)


@pytest.mark.parametrize(
    ("absent", "argv", "words"),
    [
        (PLUGIN, OPTUNA, ["hydra/sweeper=optuna", "'hydra-optuna-sweeper'", SWEEP]),
        ("optuna", OPTUNA, ["hydra/sweeper=optuna", "'optuna'", SWEEP]),
        ("wandb", ["logger=wandb", *SMALL], ["logger=wandb", "'wandb'", WANDB]),
        ("tensorboard", ["logger=tensorboard", *SMALL], ["logger=tensorboard", "'tensorboard'", TB]),
        ("transformers", HF_LM, ["model._target_=transformers.", "'transformers'", HF]),
        ("transformers", ["model._target_=transformers.GPT2LMHeadModel", *SMALL], ["'transformers'", HF]),
        (
            "tokenizers",
            ["prepare", "{src}", "--out", "c.bin", "--tokenizer", "train:300"],
            ["--tokenizer=train:300", "'tokenizers'", HF],
        ),
        ("datasets", ["prepare", "{dataset}", "--out", "c.bin"], ["INPUT=", "'datasets'", HF]),
        ("transformers", EXPORT_HF, ["--format=hf", "'transformers'", HF]),
        ("tokenizers", EXPORT_HF, ["--format=hf", "'tokenizers'", HF]),
        ("torchao", ["trainer.precision=fp8", *SMALL], ["trainer.precision=fp8", "'torchao'", FLOAT8]),
        ("tokenizers", ["generate", "{export}", "--prompt", "hi"], ["SOURCE={export}", "'tokenizers'", HF]),
        ("tokenizers", ["generate", "{run}", "--prompt", "hi"], ["SOURCE={run}", "'tokenizers'", HF]),
    ],
    ids=[
        "optuna-plugin",
        "optuna",
        "wandb",
        "tensorboard",
        "hf-lm",
        "transformers-target",
        "tokenizer",
        "saved-dataset",
        "export-hf",
        "export-hf-tokenizer",
        "fp8",
        "generate-export",
        "generate-run",
    ],
)
def test_a_missing_package_is_its_pip_line_before_anything_is_written(
    tmp_path: Path, absent: str, argv: list[str], words: list[str]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("some text to tokenize\n" * 50)
    dataset = tmp_path / "dataset"  # what `datasets`' save_to_disk leaves, as far as prepare looks
    dataset.mkdir()
    for name in ("dataset_info.json", "state.json"):
        (dataset / name).write_text("{}")
    export = tmp_path / "export"  # an export of a run whose token file had a tokenizers tokenizer
    export.mkdir()
    (export / "hpctrain.json").write_text("{}")
    (export / "tokenizer.json").write_text("{}")
    run = tmp_path / "run"  # such a run: its token file, and the tokenizer beside it
    run.mkdir()
    (run / "config.yaml").write_text(f"data:\n  name: tokens\n  path: {tmp_path / 'c.bin'}\n")
    (tmp_path / "c.tokenizer.json").write_text("{}")
    here = tmp_path / "here"
    here.mkdir()
    paths = {"{src}": src, "{dataset}": dataset, "{export}": export, "{run}": run}

    def filled(text: str) -> str:
        for name, path in paths.items():
            text = text.replace(name, str(path))
        return text

    refused(hpctrain(*map(filled, argv), cwd=here, env=without(tmp_path, absent)), list(map(filled, words)))
    assert list(here.iterdir()) == [], "nothing written"


def test_lora_and_its_exports_need_no_peft(tmp_path: Path) -> None:
    """hpctrain's LoRA writes PEFT's names and adapter folder itself: it trains and exports without PEFT,
    so no refusal names it (a user's ``_target_`` that imports it gets its pip line, as any package)."""
    run, env = tmp_path / "lora", without(tmp_path, "peft")
    small = ["parallel=none", "cluster.nproc=1", "logger=jsonl"]
    trained = hpctrain("model.adapters=lora", *SMALL, *small, f"hydra.run.dir={run}", env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    for how in ("--adapters-only", "--merge"):
        exported = hpctrain("export", str(run), "--to", str(tmp_path / how), how, env=env)
        assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "--adapters-only" / "adapter_config.json").is_file()


def without(tmp_path: Path, absent: str) -> dict[str, str]:
    """The environment of a CLI process, and of every process it starts, in which ``absent`` (comma-separated
    module names) is not installed. No fork server of the test session's: its ranks would have them."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(ABSENT)
    return {
        "PYTHONPATH": f"{site}:{this_checkout_first()}",
        "HPCTRAIN_TEST_ABSENT": absent,
        FORKSERVER_ENV: OFF,
    }
