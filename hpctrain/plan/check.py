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
from hpctrain.config.validate import validate
from hpctrain.data.catalog import check_builtin_data, check_feeds, dataset_gives, default_for
from hpctrain.models.builtin import model_spec
from hpctrain.models.spec import ModelSpec


def check_run(cfg: Config, run_dir: str | Path | None = None) -> RunShape:
    """The run's shape, once the config and its model's declared rules all pass (else a ConfigError)."""
    shape = validate(cfg, run_dir)
    spec = model_spec(cfg.model)
    check_model(cfg, spec, shape)
    return shape


def check_model(cfg: Config, spec: ModelSpec, shape: RunShape) -> None:
    if cfg.data.target is None:
        check_builtin_data(cfg.data)
        check_feeds(cfg.data, spec)
    spec.check_layout(shape.degrees, cfg.parallel, shape.n_stages)


def data_for_model(cfg: Config, overrides: list[str]) -> str | None:
    """The ``data=OPTION`` override that feeds this model, when the user chose no data and the default cannot
    (a ViT takes images, not the default text): the first built-in dataset that can (see
    :func:`hpctrain.data.catalog.default_for`). None when nothing is to change."""
    if any(o.split("=", 1)[0].lstrip("+~") == "data" for o in overrides) or cfg.data.target is not None:
        return None
    spec = model_spec(cfg.model)
    if spec.input_kind is None or cfg.data.name is None or spec.accepts(dataset_gives(cfg.data.name)):
        return None  # the default is of the kind the model takes: its other rules are the user's to meet
    chosen = default_for(spec)
    return f"data={chosen}" if chosen is not None else None
