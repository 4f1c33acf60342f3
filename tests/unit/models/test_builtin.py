"""The built-in models (hpctrain.models.builtin, build_model of hpctrain.models): built from their specs,
deterministic under a seed, ordinary Hydra targets; and the core never asks which model it trains."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config.schema import ModelConfig
from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.gpt import GPT
from hpctrain.models.vit import ViT
from tests.support import REPO

TINY_GPT = GPTConfig(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
TINY_VIT = ViTConfig(n_layers=2, d_model=32, n_heads=4, image_size=8, patch_size=2, num_classes=10)


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


def test_build_model_dispatch() -> None:
    assert isinstance(build_model(TINY_GPT), GPT)
    assert isinstance(build_model(TINY_VIT), ViT)
    with pytest.raises(Exception, match="nosuch"):
        build_model(ModelConfig(target="hpctrain.models.nosuch.ResNet"))


def test_init_deterministic_under_seed() -> None:
    for cfg in (TINY_GPT, TINY_VIT):
        torch.manual_seed(7)
        a = build_model(cfg).state_dict()
        torch.manual_seed(7)
        b = build_model(cfg).state_dict()
        torch.manual_seed(8)
        c = build_model(cfg).state_dict()
        for k in a:
            torch.testing.assert_close(a[k], b[k])
        assert any(not torch.equal(a[k], c[k]) for k in a)
