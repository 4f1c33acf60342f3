"""Issue 29, item 7: a transformers causal LM trains on hpctrain's own data (``data=text``,
``data=tokens``: windows of its config's ``n_positions``, or ``data.seq_len``); ``model=hf_lm
model.init_from=FOLDER`` builds it from a save_pretrained folder alone; ``hpctrain export --format hf`` writes
a tokenizer transformers loads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import hpctrain

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[3]
# A short run, packed as a command line reads (a table of overrides).
SHORT = ["data.max_bytes=60000", "logger=jsonl", "parallel=none", "cluster.nproc=1", "trainer.max_steps=2",
         "trainer.eval_batches=1", "trainer.micro_batch_size=4"]  # fmt: skip
GPT2 = (
    "_target_: transformers.GPT2LMHeadModel\nconfig:\n  _target_: transformers.GPT2Config\n  n_layer: 1\n"
    "  n_embd: 32\n  n_head: 2\n  vocab_size: 256\n  n_positions: 32\n"
)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return hpctrain(*args, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    here = tmp_path_factory.mktemp("hf")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256, n_positions=32)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(here / "pretrained"))
    (here / "conf" / "model").mkdir(parents=True)
    (here / "conf" / "model" / "gpt2_mine.yaml").write_text(GPT2)
    return here


def test_a_save_pretrained_folder_alone_trains_on_data_text_and_exports_for_transformers(folder: Path):
    run = folder / "outputs" / "pre"
    trained = cli(
        "model=hf_lm", f"model.init_from={folder / 'pretrained'}", "data=text", "run=pre", *SHORT, cwd=folder
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f"Initialised the model from {folder / 'pretrained'}" in trained.stdout + trained.stderr
    assert "Traceback" not in trained.stderr
    exported = cli("export", str(run), "--to", str(folder / "export"), "--format", "hf", cwd=folder)
    assert exported.returncode == 0, exported.stderr[-3000:]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder / "export"))
    text = "def f(x):\n    return 'é€'\n"
    assert tokenizer.encode(text) == list(text.encode())  # the ids hpctrain's byte data trained on
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert AutoModelForCausalLM.from_pretrained(str(folder / "export")).config.n_positions == 32


def test_a_gpt2_from_a_config_trains_on_a_token_file_with_a_shorter_window(folder: Path):
    prepared = cli(
        "prepare", str(REPO / "hpctrain" / "config"), "--out", str(folder / "corpus.bin"), cwd=folder
    )
    assert prepared.returncode == 0, prepared.stderr
    args = ["--config-dir", "conf", "model=gpt2_mine", "data=tokens", f"data.path={folder / 'corpus.bin'}"]
    trained = cli(*args, "data.seq_len=16", "run=tok", *SHORT, cwd=folder)
    assert trained.returncode == 0, trained.stderr[-3000:]
    too_long = cli(*args, "data.seq_len=64", *SHORT, "dry_run=true", cwd=folder)
    assert too_long.returncode == 2
    assert too_long.stderr.strip().splitlines() == [
        "hpctrain: data.seq_len=64: is longer than model GPT2LMHeadModel's 32 positions (valid: 1..32)"
    ]
