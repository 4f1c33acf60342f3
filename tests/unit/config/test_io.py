"""The run's config file (hpctrain.config.io): written and read back as the same typed config."""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import load_run_config, write_run_config
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.builtin import model_spec


def test_run_config_round_trip(tmp_path: Path):
    for overrides, spec in ((["model=vit", "data=digits"], ViTConfig), (["model=gpt2_124m"], GPTConfig)):
        composed = compose(overrides)
        write_run_config(tmp_path, composed)
        loaded = load_run_config(tmp_path / "config.yaml")
        assert isinstance(model_spec(loaded.model), spec)
        assert loaded == to_typed(composed)
