"""What a user's model declares for expert and context parallelism, read as a TP plan is: ``MOE_PLAN``
names its experts modules (grouped weights, experts as dimension 0), ``CONTEXT_PLAN`` where its stream is
split and its attention; a plan naming nothing, a wrong role, experts ep does not divide, or no plan at all
is one line naming what to declare. In-process (nothing distributed is under test)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models.moe import GroupedExperts
from hpctrain.parallel.context import require_context_plan
from hpctrain.parallel.moe import experts_of, require_experts


class Mixer(nn.Module):
    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(nn.ModuleDict({"ffn": GroupedExperts(experts, 8, 16)}) for _ in range(2))


class DeclaredMixer(Mixer):
    MOE_PLAN: ClassVar[dict[str, str]] = {"layers.*.ffn": "experts"}


def test_a_declared_moe_plan_names_the_experts() -> None:
    model = DeclaredMixer()
    assert [name for name, _ in require_experts(model, 2)] == ["layers.0.ffn", "layers.1.ffn"]
    assert experts_of(Mixer()) == []  # neither declared nor built of MoE layers


@pytest.mark.parametrize(
    ("plan", "ep", "words"),
    [
        (None, 2, ["parallel.ep=2", "declares no experts", "MOE_PLAN"]),
        ({"layers.*.nothing": "experts"}, 2, ["MOE_PLAN[layers.*.nothing]", "names no module"]),
        ({"layers.*.ffn": "expert"}, 2, ["MOE_PLAN[layers.*.ffn]=expert", "valid: experts"]),
        (
            {"layers.*.ffn": "experts"},
            3,
            ["parallel.ep=3", "does not divide the 4 experts", "valid: 1, 2, 4"],
        ),
        ({"embed": "experts"}, 3, ["parallel.ep=3", "does not divide the 16 experts of embed"]),
    ],
)
def test_a_bad_moe_plan_is_one_line(plan: dict[str, str] | None, ep: int, words: list[str]) -> None:
    cls = type("Declared", (Mixer,), {"MOE_PLAN": plan} if plan else {})
    with pytest.raises(ConfigError) as refused:
        require_experts(cls(), ep)
    message = str(refused.value)
    assert "\n" not in message and all(w in message for w in words), message


class Attention(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.attn = Attention()


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        (None, ["parallel.cp=2", "declares no attention", "CONTEXT_PLAN"]),
        ({"embed": "enter", "attn": "atention"}, ["CONTEXT_PLAN[attn]=atention", "valid: enter"]),
        ({"embed": "enter", "attn.q": "attention"}, ["CONTEXT_PLAN[attn.q]", "names no module"]),
        ({"attn": "attention"}, ["parallel.cp=2", "where the stream starts"]),
    ],
)
def test_a_bad_context_plan_is_one_line(plan: dict[str, str] | None, words: list[str]) -> None:
    cls = type("Declared", (Plain,), {"CONTEXT_PLAN": plan} if plan else {})
    with pytest.raises(ConfigError) as refused:
        require_context_plan(cls(), 2)
    message = str(refused.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_declared_context_plan_is_read() -> None:
    cls = type("Declared", (Plain,), {"CONTEXT_PLAN": {"embed": "enter", "attn": "attention"}})
    assert require_context_plan(cls(), 2) == {"embed": "enter", "attn": "attention"}
