"""Weights out and in (hpctrain.weights.export, hpctrain.weights.load, hpctrain.cli.export) in this process:
a checkpoint exported as safetensors or a torch state dict holds the model's weights bit for bit (the tied
head once), loads back into a fresh model, and a bad argument is one line that leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hpctrain.cli import main
from hpctrain.config.io import load_run_config
from hpctrain.errors import ConfigError
from hpctrain.models import build_model
from hpctrain.rundir import RunDir
from hpctrain.weights.export import EXPORT_META, checkpoint_of, export
from hpctrain.weights.load import load_into, read_checkpoint_model


def export_main(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_safetensors_and_pt_hold_the_weights_and_load_back(saved_run: Path, tmp_path: Path) -> None:
    expected = torch.load(saved_run / "weights.pt", weights_only=True)
    expected.pop("head.weight")  # tied: saved once, as tok_emb.weight
    assert read_checkpoint_model(checkpoint_of(saved_run, None)).keys() == expected.keys()
    written = export(saved_run, tmp_path / "st", None, "safetensors", "fp32", 5.0)
    assert (written["step"], written["parameters"]) == (2, sum(t.numel() for t in expected.values()))
    weights = load_file(tmp_path / "st" / "model.safetensors")
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in expected)
    meta = json.loads((tmp_path / "st" / EXPORT_META).read_text())
    assert meta["format"] == "hpctrain-export" and meta["model"]["_target_"] == "hpctrain.models.gpt.GPT"
    export(saved_run, tmp_path / "pt", 2, "pt", "bf16", 5.0)
    half = next((tmp_path / "pt").glob("*.pt"))
    assert all(t.dtype == torch.bfloat16 for t in torch.load(half, weights_only=True).values())
    fresh = build_model(load_run_config(RunDir(saved_run).config).model)
    load_into(fresh, tmp_path / "st")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())
    assert fresh.head.weight is fresh.tok_emb.weight


def test_a_step_without_a_checkpoint_and_a_bad_argument_are_one_line(
    saved_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=r"^--step=7: no committed checkpoint of that step \(valid: 2\)"):
        checkpoint_of(saved_run, 7)
    for argv, words in (
        (["--format", "onnx"], "--format=onnx: not a known format"),
        (["--step", "7"], "--step=7: no committed checkpoint of that step (valid: 2)"),
        (["--max-shard-gb", "0"], "--max-shard-gb=0.0: must be > 0"),
    ):
        assert export_main("export", [str(saved_run), "--to", str(tmp_path / "x"), *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpctrain: ") and words in lines[0], lines
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.partial-*"))
