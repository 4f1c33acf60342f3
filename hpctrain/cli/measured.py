"""``hpctrain plan`` and the pre-submit check on a model that declares no shapes (a user's ``_target_``):
its facts measured once per process (:mod:`hpctrain.train.footprint`, which imports torch: only for such a
model), and the lines that say how."""

from __future__ import annotations

from hpctrain.config.schema import Config
from hpctrain.models.facts import MeasuredModel
from hpctrain.models.spec import model_spec
from hpctrain.plan.estimate import MIB, Estimate, human_count


def measured_model_line(est: Estimate) -> str:
    """The model row of the plan of a measured model."""
    m = est.measured
    assert m is not None
    kind = f", {m.tokens_per_sample} tokens per sample" if m.input_kind == "tokens" else ""
    kind = kind or (f", takes {m.input_kind}" if m.input_kind else "")
    blocks = f"{m.blocks} blocks" if m.blocks else "no blocks found"
    return (
        f"{human_count(est.n_params)}-parameter {est.model} ({m.target}: {est.n_params:,} parameters "
        f"read on the meta device, {blocks}{kind})"
    )


def human_bytes(n: float) -> str:
    return f"{n / MIB:.2f} MiB" if n >= MIB else f"{n / 2**10:.1f} KiB"


def activation_line(est: Estimate) -> str | None:
    """How the activations of a model without declared shapes were found (None for the built-ins)."""
    m = est.measured
    if m is None:
        return None
    if m.note:
        return f"activations  cannot be derived from the parameters and were {m.note}"
    lay = est.layout
    acts = m.activations_in(lay.regime)
    assert acts is not None
    regime = {"fp32": "fp32", "autocast": "bf16 autocast", "fsdp_mixed": "bf16 parameters"}[acts.regime]
    sizes = " and ".join(str(n) for n in m.samples)
    line = acts.saved
    text = (
        f"activations  measured (not derivable from parameters), a forward + backward of {sizes} samples on "
        f"CPU, {regime}: {human_bytes(line.per_sample)} per sample + {human_bytes(line.fixed)} fixed"
    )
    if lay.ac == "full" and m.blocks:
        kept = human_bytes(acts.checkpointed.per_sample)
        text += f"; checkpointed blocks keep their inputs: {kept} per sample"
    elif lay.ac != "none":
        why = "no blocks found to checkpoint" if not m.blocks else "selective checkpointing not measured"
        text += f"; an upper bound ({why})"
    if lay.degrees.tp > 1 or lay.degrees.pp > 1:
        text += "; split over tp/pp approximately (blocks by their share and tp; no TP/PP buffers counted)"
    return text


_MEASURED: dict[str, MeasuredModel] = {}


def measured_for(cfg: Config) -> MeasuredModel | None:
    """The measured facts of ``cfg``'s model when it declares no shapes (a user's ``_target_``), once per
    distinct model, data, loss and precision of the process; None for a built-in (torch stays unimported).
    A model that cannot be built is a ConfigError (with the user's traceback, see hpctrain.train.probe)."""
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
        from hpctrain.train.footprint import measure_model

        _MEASURED[key] = measure_model(cfg)
    return _MEASURED[key]
