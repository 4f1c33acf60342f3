"""Issue 29, item 4 (wrong accepts): weights full of NaN are refused when loaded (``model.init_from``), in
one line naming the tensor, rather than trained to the end with a NaN loss; a shape mismatch is found from
the files' headers, before any tensor is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hpctrain.errors import ConfigError
from hpctrain.models.gpt import GPT
from hpctrain.weights.load import check_weights_fit, load_into


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone().contiguous() for k, v in model.state_dict().items() if k != "head.weight"}


def test_weights_full_of_nan_are_refused_naming_the_tensor(tmp_path: Path):
    model = GPT(n_layers=1, d_model=32, n_heads=2)
    weights = _weights(model)
    weights["layers.0.attn.q.weight"] = torch.full_like(weights["layers.0.attn.q.weight"], float("nan"))
    save_file(weights, str(tmp_path / "w.safetensors"))
    with pytest.raises(ConfigError, match=r"non-finite values \(NaN or inf\) in layers\.0\.attn\.q\.weight"):
        load_into(GPT(n_layers=1, d_model=32, n_heads=2), tmp_path / "w.safetensors")


def test_a_shape_mismatch_is_found_from_the_headers(tmp_path: Path):
    save_file(_weights(GPT(n_layers=1, d_model=32, n_heads=2)), str(tmp_path / "w.safetensors"))
    with torch.device("meta"):
        wider = GPT(n_layers=1, d_model=64, n_heads=2)
    with pytest.raises(ConfigError, match="of another shape"):
        check_weights_fit(wider, tmp_path / "w.safetensors")
    check_weights_fit(wider, tmp_path / "w.safetensors", strict=False)  # init_strict=false: what fits loads


def test_integer_tensors_are_refused_not_cast_to_float(tmp_path: Path):
    """Issue 41 (b): an init_from file of int64 tensors was cast to float and trained from, without a word."""
    weights = {
        k: v.round().to(torch.int64) for k, v in _weights(GPT(n_layers=1, d_model=32, n_heads=2)).items()
    }
    save_file(weights, str(tmp_path / "w.safetensors"))
    model = GPT(n_layers=1, d_model=32, n_heads=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        ConfigError, match=r"holds \d+ integer tensor\(s\) where the model's are floating point"
    ):
        load_into(model, tmp_path / "w.safetensors")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "nothing was loaded"
