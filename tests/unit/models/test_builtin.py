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


@pytest.mark.parametrize("spec", [TINY_GPT, TINY_VIT], ids=["gpt", "vit"])
def test_built_for_a_checkpoint_the_random_init_is_zeros_and_the_rest_as_ever(spec) -> None:
    """``random_init=False`` (a resume): every weight torch.nn.init would draw is zeros (no RNG drawn, no
    NaN for a throwaway step before the load), what the model sets itself (LayerNorm's ones, buffers) is
    as in a normal build, and torch.nn.init is itself again afterwards."""
    torch.manual_seed(0)
    normal = build_model(spec)
    before = torch.random.get_rng_state()
    skipped = build_model(spec, random_init=False)
    assert torch.equal(torch.random.get_rng_state(), before), "the skipped init drew from the RNG"
    state = skipped.state_dict()
    drawn = [
        k for k, v in normal.state_dict().items() if v.float().std() > 0 and not torch.equal(v, state[k])
    ]
    assert drawn and all(not state[k].any() for k in drawn), drawn
    kept = [k for k in state if k not in drawn]
    assert kept and all(torch.equal(state[k], normal.state_dict()[k]) for k in kept)
    weight = torch.empty(3, 3)
    torch.nn.init.normal_(weight)
    assert weight.std() > 0, "torch.nn.init.normal_ was left replaced"


class RandomFeatures(torch.nn.Module):
    """Random features kept in a buffer the state dict leaves out: no checkpoint restores them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("projection", torch.nn.init.normal_(torch.empty(4, 8)), persistent=False)
        self.head = torch.nn.Linear(8, 2)


def test_built_for_a_checkpoint_a_buffer_drawn_at_random_is_drawn_as_ever() -> None:
    spec = ModelConfig(target=f"{__name__}.RandomFeatures", args={})
    torch.manual_seed(0)
    normal = build_model(spec)
    torch.manual_seed(0)
    skipped = build_model(spec, random_init=False)
    assert torch.equal(skipped.projection, normal.projection) and normal.projection.std() > 0
    assert not skipped.head.weight.any() and normal.head.weight.any()
