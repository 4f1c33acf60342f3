"""The mixture-of-experts layer in one process: dropless top-k routing equals running each token through its
experts and mixing by the renormalised gates; a capacity drops the assignments past each expert's limit and
counts them; the load-balancing loss is Switch's E · Σ f·P (1 when balanced) and its gradient reaches the
router without changing the output."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hpctrain.models.moe import MoE, set_aux_loss_scale


def _layer(capacity: float = 0.0, aux: float = 0.0) -> MoE:
    torch.manual_seed(0)
    layer = MoE(d_model=8, experts=4, top_k=2, mlp_ratio=2, capacity=capacity, aux_loss_weight=aux)
    for p in layer.experts.parameters():  # biases too: a dropped assignment would show
        torch.nn.init.normal_(p, std=0.3)
    return layer


def _by_hand(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    e = layer.experts
    probs = F.softmax(layer.router(x), dim=-1)
    top_p, top_e = probs.topk(layer.top_k, dim=-1)
    gates = top_p / top_p.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(layer.top_k):
            i = int(top_e[t, j])
            h = F.gelu(x[t] @ e.w_in[i] + e.b_in[i], approximate="tanh")
            out[t] += gates[t, j] * (h @ e.w_out[i] + e.b_out[i])
    return out


def test_dropless_routing_is_each_token_through_its_top_k_experts() -> None:
    layer = _layer().train()
    x = torch.randn(2, 16, 8)
    out = layer(x)
    torch.testing.assert_close(out.reshape(-1, 8), _by_hand(layer, x.reshape(-1, 8)), rtol=1e-5, atol=1e-6)
    assert layer.stats.assignments is not None and int(layer.stats.assignments.sum()) == 2 * 16 * 2
    assert int(layer.stats.dropped) == 0  # type: ignore[arg-type]


def test_a_capacity_drops_what_exceeds_it_and_counts_it() -> None:
    layer = _layer(capacity=0.5).train()
    x = torch.randn(32, 8)
    out = layer(x)
    limit = math.ceil(0.5 * 2 * 32 / 4)
    assigned = layer.stats.assignments
    assert assigned is not None
    expected_dropped = int((assigned - limit).clamp(min=0).sum())
    assert expected_dropped > 0 and int(layer.stats.dropped) == expected_dropped  # type: ignore[arg-type]
    assert not torch.allclose(out, _by_hand(layer, x), atol=1e-4)  # the dropped assignments are missing


def test_evaluation_counts_nothing() -> None:
    layer = _layer().eval()
    layer(torch.randn(4, 8))
    assert layer.stats.assignments is None


def test_the_load_balancing_loss_is_switch_s_and_reaches_the_router_only_through_its_gradient() -> None:
    layer = _layer(aux=0.5).train()
    x = torch.randn(64, 8)
    probs = F.softmax(layer.router(x), dim=-1)
    f = torch.bincount(probs.topk(2, dim=-1).indices.reshape(-1), minlength=4).float() / (64 * 2)
    expected = 4 * (f * probs.mean(0)).sum()
    set_aux_loss_scale(1.0)
    out = layer(x)
    assert layer.stats.aux is not None
    torch.testing.assert_close(layer.stats.aux, expected.detach(), rtol=1e-6, atol=0)
    # The output is the layer's without the loss; the router's gradient gains weight · d aux / d router.
    torch.testing.assert_close(out, _by_hand(layer, x), rtol=1e-5, atol=1e-6)
    # A zero main loss: what reaches the router is the auxiliary loss's gradient alone.
    (out * 0).sum().backward()
    weight = layer.router.weight.detach().clone().requires_grad_(True)
    (0.5 * 4 * (f * F.softmax(x @ weight.T, dim=-1).mean(0)).sum()).backward()
    torch.testing.assert_close(layer.router.weight.grad, weight.grad, rtol=1e-5, atol=1e-9)


def test_a_balanced_router_scores_one() -> None:
    layer = MoE(d_model=4, experts=4, top_k=1, aux_loss_weight=0.0).train()
    torch.nn.init.zeros_(layer.router.weight)  # uniform probabilities; topk then picks expert 0 for all
    layer(torch.randn(8, 4))
    assert layer.stats.aux is not None
    # Uniform P = 1/4 everywhere: E · Σ f · 1/4 = Σ f = 1 whatever the assignments.
    assert float(layer.stats.aux) == 1.0
