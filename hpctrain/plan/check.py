"""Everything a run is checked against before anything starts, config and model together. Torch-free.

:func:`hpctrain.config.validate.validate` checks each group on its own; here the model's spec
(:mod:`hpctrain.models.spec`) adds its own rules: its arguments, whether the built-in dataset feeds it, and
whether it can be split as the layout asks. A model that declares nothing (a user's ``_target_``) is
checked on the meta device by :mod:`hpctrain.submit.probe` instead, where the caller can afford torch.
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


def data_for_model(cfg: Config, overrides: list[str]) -> str | None:
    """The ``data=OPTION`` override that feeds this model, when the user chose no data and the default is of
    another kind than the model takes (a ViT takes images, not the default text): the first built-in dataset
    of the kind the model declares it takes that fits it, then one shaped by the model (synthetic). None
    when nothing is to change."""
    from hpctrain.config.catalog import DATASET_KINDS
    from hpctrain.config.schema import DataConfig
    from hpctrain.errors import ConfigError

    if any(o.split("=", 1)[0].lstrip("+~") == "data" for o in overrides) or cfg.data.target is not None:
        return None
    spec = model_spec(cfg.model)
    if spec.input_kind is None or DATASET_KINDS.get(cfg.data.name or "") in ("any", spec.input_kind):
        return None  # the default is of the kind the model takes: its other rules are the user's to meet
    kinds = [n for n, k in DATASET_KINDS.items() if k == spec.input_kind] + [
        n for n, k in DATASET_KINDS.items() if k == "any"
    ]
    for name in kinds:
        if name == "tokens":  # needs a file of the user's
            continue
        try:
            spec.check_data(name, *data_facts(DataConfig(name=name)))
        except ConfigError:
            continue
        return f"data={name}"
    return None
