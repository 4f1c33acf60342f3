"""The measured facts of a model that declares no shapes (a user's ``_target_``), once per process:
:mod:`hpctrain.submit.footprint` builds it and runs it (imports torch, only for such a model)."""

from __future__ import annotations

from hpctrain.config.schema import Config
from hpctrain.models.builtin import model_spec
from hpctrain.models.facts import MeasuredModel

_MEASURED: dict[str, MeasuredModel] = {}


def measured_for(cfg: Config) -> MeasuredModel | None:
    """The measured facts of ``cfg``'s model when it declares no shapes (a user's ``_target_``), once per
    distinct model, data, loss and precision of the process; None for a built-in (torch stays unimported).
    A model that cannot be built is a ConfigError (with the user's traceback, see hpctrain.submit.probe)."""
    if model_spec(cfg.model).transformer:
        return None
    key = repr(
        (
            cfg.model,
            cfg.data,
            cfg.loss,
            cfg.trainer.precision,
            cfg.trainer.seed,
            cfg.parallel,  # the blocks, the tensor-parallel plan and the pipeline split
            cfg.cluster.kind,
            cfg.cluster.nproc,
            cfg.cluster.nodes,
            cfg.cluster.tasks_per_node,
        )
    )
    if key not in _MEASURED:
        from hpctrain.submit.footprint import measure_model

        _MEASURED[key] = measure_model(cfg)
    return _MEASURED[key]
