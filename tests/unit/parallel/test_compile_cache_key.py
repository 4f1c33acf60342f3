"""The compile cache's key: a restarted job of the same config gets the same folder, a config that compiles
other graphs never does; where the folder lives (parallel.compile_cache)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.shape import run_shape
from hpctrain.parallel.compile import cache_key, cache_root, key_inputs
from hpctrain.version import __version__

BASE = ["parallel.compile=true", "model.d_model=64"]


def _key(*overrides: str, device: str = "cpu:x86_64", torch_version: str = "2.13.0+cpu") -> str:
    cfg = to_typed(compose([*BASE, *overrides]))
    return cache_key(key_inputs(cfg, run_shape(cfg), device, torch_version))


def test_what_leaves_the_graphs_alone_keeps_the_key() -> None:
    key = _key()
    assert key.startswith("torch2.13.0-cpu-") and _key() == key
    for same in (
        "optim.lr=3e-4",
        "trainer.max_steps=7",
        "trainer.seed=5",
        "logger=jsonl",
        "parallel.compile_cache=/shared/cache",
        "trainer.ckpt_every=3",
        "data.max_bytes=1000",
    ):
        assert _key(same) == key, same


def test_what_changes_the_graphs_changes_the_key() -> None:
    keys = {
        _key(),
        _key("trainer.micro_batch_size=8"),
        _key("trainer.precision=bf16"),
        _key("model.d_model=128"),
        _key("model.seq_len=128"),
        _key("parallel.activation_checkpointing=full"),
        _key("parallel=fsdp"),
        _key("cluster.nproc=4"),
        _key("data=synthetic"),
        _key(device="cuda:NVIDIA H100 80GB HBM3:sm90"),
        _key(torch_version="2.11.0+cu130"),
    }
    assert len(keys) == 11


def test_the_cache_lives_in_the_run_directory_a_shared_path_or_torchs_default(tmp_path: Path) -> None:
    cfg = to_typed(compose(BASE))
    assert cache_root(cfg, tmp_path) == tmp_path / "compile_cache"
    cfg.parallel.compile_cache = "/shared/hpctrain-cache"
    assert cache_root(cfg, tmp_path) == Path("/shared/hpctrain-cache")
    cfg.parallel.compile_cache = "off"
    assert cache_root(cfg, tmp_path) is None


def test_another_hpctrain_version_never_shares_a_cache() -> None:
    cfg = to_typed(compose([]))
    inputs = key_inputs(cfg, run_shape(cfg), "cpu", "2.13.0")
    assert inputs["hpctrain"] == __version__
    assert cache_key({**inputs, "hpctrain": __version__ + ".post1"}) != cache_key(inputs)
