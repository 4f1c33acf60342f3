"""The resolved run config as a file: written once into the run directory, read back by every worker."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hpctrain.config.redact import declare_secret, env_references, redact_config
from hpctrain.config.schema import GROUP_SCHEMAS, Config
from hpctrain.config.typed import to_config
from hpctrain.rundir import RunDir


def run_config_text(cfg: DictConfig) -> str:
    """``cfg`` as config.yaml holds it: resolved, without Hydra's own node, secret ``cluster.env`` values as
    ``***``."""
    keys = [k for k in cfg if k != "hydra"]
    declare_secret(env_references(OmegaConf.select(cfg, "cluster.env")))  # taken from the environment
    plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys), resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(redact_config(plain)))


def write_run_config(run_dir: Path, cfg: DictConfig) -> Path:
    """Write ``cfg`` (:func:`run_config_text`) to ``run_dir/config.yaml``."""
    return RunDir(run_dir).write_config_text(run_config_text(cfg))


def load_run_config(path: Path) -> Config:
    """Read a config written by :func:`write_run_config` back into typed dataclasses."""
    raw = OmegaConf.load(path)
    typed_raw = {key: raw[key] for key in raw}
    for group, schemas in GROUP_SCHEMAS.items():
        # A group the file lacks (written before the group existed, e.g. task) takes the schema's defaults.
        given = raw.get(group, {})
        typed_raw[group] = OmegaConf.merge(OmegaConf.structured(next(iter(schemas.values()))), given)
    return to_config(typed_raw)
