"""The resolved run config as a file: written once into the run directory, read back by every worker."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hpctrain.config.schema import GROUP_SCHEMAS, MODEL_SCHEMAS, Config

RUN_CONFIG = "config.yaml"


def write_run_config(run_dir: Path, cfg: DictConfig) -> Path:
    """Write ``cfg`` (resolved, without Hydra's own node) to ``run_dir/config.yaml``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    keys = [k for k in cfg if k != "hydra"]
    text = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, keys), resolve=True)
    path = run_dir / RUN_CONFIG
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def load_run_config(path: Path) -> Config:
    """Read a config written by :func:`write_run_config` back into typed dataclasses."""
    raw = OmegaConf.load(path)
    typed_raw = {key: raw[key] for key in raw}
    for group, schemas in GROUP_SCHEMAS.items():
        schema = MODEL_SCHEMAS[raw.model.arch] if group == "model" else next(iter(schemas.values()))
        typed_raw[group] = OmegaConf.merge(OmegaConf.structured(schema), raw[group])
    typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), typed_raw))
    assert isinstance(typed, Config)
    return typed
