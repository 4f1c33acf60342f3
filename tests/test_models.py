from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hpctrain.config.schema import ModelConfig
from hpctrain.data.datasets import Digits
from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.flops import flops_per_token, param_count, tokens_per_sample
from hpctrain.models.gpt import GPT
from hpctrain.models.synthetic import SyntheticTokens
from hpctrain.models.vit import ViT

TINY_GPT = GPTConfig(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
TINY_VIT = ViTConfig(n_layers=2, d_model=32, n_heads=4, image_size=8, patch_size=2, num_classes=10)


def test_build_model_dispatch() -> None:
    assert isinstance(build_model(TINY_GPT), GPT)
    assert isinstance(build_model(TINY_VIT), ViT)
    with pytest.raises(Exception, match="nosuch"):
        build_model(ModelConfig(target="hpctrain.models.nosuch.ResNet"))


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


def test_vit_is_not_causal_and_shapes() -> None:
    torch.manual_seed(0)
    model = ViT(TINY_VIT).eval()
    x = torch.randn(3, 1, 8, 8)
    logits = model(x)
    assert logits.shape == (3, 10)
    # The last patch (bottom-right) must reach the class token.
    y = x.clone()
    y[:, :, -2:, -2:] += 1.0
    assert not torch.allclose(model(y), logits)
    with pytest.raises(ValueError, match=r"\[B, 1, 8, 8\]"):
        model(torch.randn(1, 1, 16, 16))


def test_vit_rejects_indivisible_patches() -> None:
    with pytest.raises(ValueError, match=r"patch_size=3.*image_size=10"):
        ViT(replace(TINY_VIT, image_size=10, patch_size=3))


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


def _real_count(model: torch.nn.Module, include_embeddings: bool) -> int:
    embedding_names = ("tok_emb.weight", "pos_emb.weight", "pos_emb", "cls_token")
    total = 0
    for name, p in model.named_parameters():  # de-duplicates tied parameters (named by first owner)
        if name in embedding_names and not include_embeddings:
            continue
        total += p.numel()
    if not include_embeddings and isinstance(model, GPT) and model.cfg.tie_embeddings:
        total += model.head.weight.numel()  # the tied head's matmul counts as non-embedding compute
    return total


@pytest.mark.parametrize(
    "cfg",
    [
        TINY_GPT,
        replace(TINY_GPT, tie_embeddings=False),
        replace(TINY_GPT, mlp_ratio=2, n_layers=3),
        TINY_VIT,
        replace(TINY_VIT, in_channels=3, image_size=12, patch_size=4, num_classes=7),
    ],
)
def test_param_count_matches_model(cfg: GPTConfig | ViTConfig) -> None:
    model = build_model(cfg)
    for include in (True, False):
        assert param_count(cfg, include_embeddings=include) == _real_count(model, include)


def test_param_count_gpt2_small() -> None:
    # GPT-2 small with the padded 50304 vocabulary: nanoGPT reports ~124M.
    cfg = GPTConfig(n_layers=12, d_model=768, n_heads=12, seq_len=1024, vocab_size=50304)
    assert param_count(cfg) == 124_475_904


def test_flops_per_token_hand_computed() -> None:
    cfg = GPTConfig(n_layers=2, d_model=64, n_heads=4, mlp_ratio=4, vocab_size=256, seq_len=64)
    # Per block: 2 LayerNorms 4·64 + q/k/v/o 4·(64² + 64) + MLP (64·256 + 256) + (256·64 + 64) = 49984.
    # N = 2·49984 + final norm 128 + head 64·256 = 116480; attention: 12·2·4·16·64 = 98304.
    assert param_count(cfg, include_embeddings=False) == 116_480
    assert tokens_per_sample(cfg) == 64
    assert flops_per_token(cfg) == 6 * 116_480 + 98_304
    assert tokens_per_sample(TINY_VIT) == 17


def test_flops_and_catalog_do_not_import_torch() -> None:
    code = (
        "import sys, hpctrain.models.flops, hpctrain.data.catalog, hpctrain.data.sampler; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def one_thread() -> Iterator[None]:
    # Tiny models gain nothing from intra-op threads, and on a shared 2-core machine their spin-waits make
    # these steps several times slower under load.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.mark.usefixtures("one_thread")
def test_vit_overfits_digits_batch() -> None:
    torch.manual_seed(0)
    model = ViT(ViTConfig())  # the conf/model/vit.yaml size: d_model=64, 2x2 patches of 8x8 digits
    x, y = Digits().get_batch(range(32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(50):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
