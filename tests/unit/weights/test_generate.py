"""Sampling (hpctrain.weights.generate, hpctrain.cli.generate, the run's tokenizer from hpctrain.data.codec)
in this process: the same seed gives the same text from a run directory and from its export; greedy
decoding follows the model's argmax; bad arguments are one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.cli import main
from hpctrain.data.codec import EXPORT_TOKENIZER, copy_tokenizer, tokenizer_for_data
from hpctrain.data.tokenizer import ByteTokenizer
from hpctrain.weights.export import export
from hpctrain.weights.generate import generate, load_model


def generate_main(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_a_seed_gives_the_same_text_from_the_run_and_its_export(saved_run: Path, tmp_path: Path) -> None:
    export(saved_run, tmp_path / "export", None, "safetensors", "fp32", 5.0)
    assert not (tmp_path / "export" / EXPORT_TOKENIZER).exists()  # bytes: nothing to copy
    sampled = [generate(source, "def ", 12, 1.0, 0, seed=3) for source in (saved_run, tmp_path / "export")]
    assert sampled[0] == sampled[1] and sampled[0].startswith("def ")
    assert generate(saved_run, "def ", 12, 1.0, 0, seed=4) != sampled[0]
    greedy = generate(saved_run, "ab", 1, 0.0, 0, seed=0)  # temperature 0: the argmax
    model, _, _ = load_model(saved_run, None)
    with torch.no_grad():
        best = int(model(torch.tensor([list(b"ab")]))[0, -1].argmax())
    assert greedy == "ab" + ByteTokenizer().decode([best])


def test_the_tokenizer_of_bytes_and_bad_arguments(
    saved_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert isinstance(tokenizer_for_data({"name": "text", "path": None}), ByteTokenizer)
    assert copy_tokenizer({"name": "text"}, tmp_path) == "bytes"
    for argv, words in (
        ([str(tmp_path / "none"), "--prompt", "x"], "no such file or directory"),
        ([str(saved_run), "--prompt", ""], "--prompt=: empty"),
        ([str(saved_run), "--prompt", "x", "--temperature", "-1"], "must be ≥ 0"),
    ):
        assert generate_main("generate", argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpctrain: ") and words in lines[0], lines
