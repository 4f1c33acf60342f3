"""Everything a run is checked against before anything starts, config and model together. Torch-free.

:func:`hpctrain.config.validate.validate` checks each group on its own; here the model's spec
(:mod:`hpctrain.models.spec`) adds its own rules: its arguments, whether the built-in dataset feeds it, and
whether it can be split as the layout asks. A model that declares nothing (a user's ``_target_``) is
checked on the meta device by :mod:`hpctrain.train.probe` instead, where the caller can afford torch.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.config.validate import data_facts, validate
from hpctrain.models.spec import ModelSpec, model_spec


def check_run(cfg: Config, run_dir: str | Path | None = None) -> RunShape:
    """The run's shape, once the config and its model's declared rules all pass (else a ConfigError)."""
    shape = validate(cfg, run_dir)
    spec = model_spec(cfg.model)
    check_model(cfg, spec, shape)
    return shape


def check_model(cfg: Config, spec: ModelSpec, shape: RunShape) -> None:
    if cfg.data.target is None:
        spec.check_data(cfg.data.name or "", *data_facts(cfg.data))
    spec.check_layout(shape.degrees, cfg.parallel, shape.n_stages)
