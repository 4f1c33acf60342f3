"""The run's config file (hpctrain.config.io): written and read back as the same typed config, in the text
OmegaConf.to_yaml would write."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import load_run_config, run_config_text, write_run_config
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


def test_the_text_is_omegaconfs() -> None:
    """Written without building a config again, the text is OmegaConf.to_yaml's of the resolved run keys: a
    string that reads as another type stays quoted, an interpolation is resolved, a secret is ***."""
    composed = compose(
        [
            "cluster=slurm_test",
            "run=x",
            "+cluster.env.WANDB_API_KEY=k3y",
            "cluster.job_name='1e-3'",
            "trainer.max_steps=${trainer.eval_batches}",
            "cluster.account='null'",
        ]
    )
    keys = [k for k in composed if k != "hydra"]
    expected = OmegaConf.to_container(OmegaConf.masked_copy(composed, keys), resolve=True)
    expected["cluster"]["env"]["WANDB_API_KEY"] = "***"
    expected["cluster"]["secret_env"] = ["WANDB_API_KEY"]
    text = run_config_text(composed)
    assert text == OmegaConf.to_yaml(OmegaConf.create(expected))
    assert "job_name: '1e-3'" in text and "k3y" not in text
