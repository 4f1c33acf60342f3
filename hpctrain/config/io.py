"""The resolved run config as a file: written once into the run directory, read back by every worker."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from hpctrain.config.redact import declare_secret, env_references, redact_config
from hpctrain.config.schema import GROUP_SCHEMAS, Config
from hpctrain.config.typed import to_config
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import load_yaml


def run_config_text(cfg: DictConfig) -> str:
    """``cfg`` as config.yaml holds it: resolved, without Hydra's own node, secret ``cluster.env`` values as
    ``***``."""
    import yaml
    from omegaconf import Container
    from omegaconf._utils import get_omega_conf_dumper

    declare_secret(env_references(OmegaConf.select(cfg, "cluster.env")))  # taken from the environment
    plain = {
        key: OmegaConf.to_container(node, resolve=True) if isinstance(node, Container) else cfg[key]
        for key in cfg
        if key != "hydra" and (node := cfg._get_node(key)) is not None
    }
    # What OmegaConf.to_yaml writes (its dumper quotes a string OmegaConf would read back as another type,
    # such as "1e-3"), from the plain values: building a config of them again first cost a submission
    # 40-60 ms (tests/unit/config/test_io.py holds the two texts equal).
    dumper = get_omega_conf_dumper()
    return yaml.dump(
        redact_config(plain), Dumper=dumper, default_flow_style=False, allow_unicode=True, sort_keys=False
    )


def write_run_config(run_dir: Path, cfg: DictConfig) -> Path:
    """Write ``cfg`` (:func:`run_config_text`) to ``run_dir/config.yaml``."""
    return RunDir(run_dir).write_config_text(run_config_text(cfg))


def load_run_config(path: Path, overrides: list[str] | None = None) -> Config:
    """Read a config written by :func:`write_run_config` back into typed dataclasses, with ``overrides``
    (``key=value``, e.g. ``trainer.eval_batches=8``: ``hpctrain eval``'s) merged in; ConfigError for one that
    names no key or has the wrong type."""
    raw = load_yaml(path)
    if overrides:
        raw = _with_overrides(raw, overrides)
    typed_raw = {key: raw[key] for key in raw}
    for group, schemas in GROUP_SCHEMAS.items():
        # A group the file lacks (written before the group existed, e.g. task) takes the schema's defaults.
        given = raw.get(group, {})
        try:
            typed_raw[group] = OmegaConf.merge(OmegaConf.structured(next(iter(schemas.values()))), given)
        except ValidationError as err:  # an override of the wrong type (a file as written always fits)
            from hpctrain.errors import ConfigError

            key = f"{group}.{err.key}" if getattr(err, "key", None) else group
            raise ConfigError(key, getattr(err, "value", None), str(err).splitlines()[0]) from None
    return to_config(typed_raw)


_ABSENT = object()


def _with_overrides(raw: DictConfig, overrides: list[str]) -> DictConfig:
    from omegaconf.errors import OmegaConfBaseException

    from hpctrain.errors import ConfigError

    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep or not key or OmegaConf.select(raw, key, default=_ABSENT) is _ABSENT:
            raise ConfigError(
                key or text,
                value if sep else None,
                "not a key=value of the run's config",
                valid="e.g. trainer.eval_batches=8",
            )
        try:  # the value as YAML reads it (8 → int), as on the training command line
            OmegaConf.update(raw, key, OmegaConf.create({"v": value})["v"], merge=True)
        except (OmegaConfBaseException, ValueError) as err:
            raise ConfigError(key, value, str(err).splitlines()[0]) from None
    return raw
