"""The built-in GPT (hpctrain.models.gpt): shapes and stable layer names, causality, GPT-2's initialisation,
tied embeddings, and a tiny model that overfits a batch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.gpt import GPT
from hpctrain.models.synthetic import SyntheticTokens

TINY_GPT = GPTConfig(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)


def test_gpt_shapes_and_layer_names() -> None:
    model = GPT(TINY_GPT)
    logits = model(torch.randint(0, 64, (3, 10)))
    assert logits.shape == (3, 10, 64)
    assert list(model.layers.keys()) == ["0", "1"]
    names = {n for n, _ in model.named_parameters()}
    assert {"layers.1.attn.q.weight", "layers.1.attn.o.bias", "layers.0.mlp.fc_out.weight"} <= names


def test_gpt_rejects_long_sequence() -> None:
    with pytest.raises(ValueError, match=r"17.*seq_len=16"):
        GPT(TINY_GPT)(torch.zeros(1, 17, dtype=torch.long))


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(TINY_GPT).eval()
    idx = torch.randint(0, 64, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (idx[:, 9] + 1) % 64
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    # The changed position itself must see the change, or the check above proves nothing.
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_init_gpt2_statistics() -> None:
    cfg = GPTConfig(n_layers=4, d_model=256, n_heads=4, vocab_size=512, seq_len=64)
    torch.manual_seed(0)
    model = GPT(cfg)
    assert model.layers["0"].attn.q.weight.std().item() == pytest.approx(0.02, rel=0.05)
    residual_std = 0.02 / (2 * cfg.n_layers) ** 0.5
    assert model.layers["3"].attn.o.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert model.layers["3"].mlp.fc_out.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert torch.count_nonzero(model.layers["0"].mlp.fc_in.bias) == 0
    assert torch.all(model.norm.weight == 1) and torch.all(model.norm.bias == 0)


def test_tied_embeddings() -> None:
    tied = GPT(TINY_GPT)
    assert tied.head.weight is tied.tok_emb.weight
    untied = GPT(replace(TINY_GPT, tie_embeddings=False))
    assert untied.head.weight is not untied.tok_emb.weight


@pytest.mark.usefixtures("one_thread")
def test_gpt_overfits_synthetic_batch() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layers=2, d_model=64, n_heads=4, vocab_size=64, seq_len=32)
    model = GPT(cfg)
    x, y = SyntheticTokens(64, cfg.seq_len, cfg.vocab_size, seed=0).get_batch(range(8))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(50):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(64.0)).item(), abs=0.3)
    assert losses[-1] < 0.5 * losses[0]
