"""The planner's fact sheet (:class:`hpctrain.models.facts.ModelFacts`) of a model that declares no shapes
(a user's ``_target_``): parameters read on the meta device, activations measured on the CPU. Imports torch;
only such models come here (:func:`hpctrain.submit.measure.measured_for`), the built-ins declare their sheet
(:meth:`hpctrain.models.spec.TransformerSpec.facts`).

1. The model is built on the meta device (:func:`hpctrain.submit.probe.build_model`: no memory, no weights;
   the user's exceptions keep their traceback) and each parameter's name, shape and dtype read, with the
   FSDP unit (block, :mod:`hpctrain.parallel.blocks`) holding it, and under the run's layout the dimension
   its tensor-parallel role splits (:mod:`hpctrain.parallel.tp`) and the pipeline stages holding it
   (:mod:`hpctrain.parallel.stages`).
2. Activations are not a function of the parameters. The model is built again on the CPU, for real, and
   the first 2 and 4 samples of the training set (:func:`hpctrain.submit.probe.first_batches`) go through
   it and the run's loss, the bytes autograd saves for the backward counted by
   ``torch.autograd.graph.saved_tensors_hooks``: each storage once, parameters and buffers left out (they
   are model state), the batch counted. Tensors first saved inside a block are that block's: under full
   activation checkpointing a block keeps only its input, and the one recomputed in the backward holds its
   own again. The two batch sizes give a line, fixed + per sample, scaled to ``trainer.micro_batch_size``.
   Precision follows the layout's regime: fp32; ``autocast`` (16-bit matmuls: CPU autocast in bfloat16,
   whose op lists differ slightly from CUDA's); ``fsdp_mixed`` (the model and the float inputs cast to
   bfloat16, as FSDP's mixed-precision policy does). One backward, the first, counts the FLOPs
   (``torch.utils.flop_counter``).
3. A model whose parameters and buffers exceed :data:`MEASURE_LIMIT` is not built for real here (a login
   node's memory): the activations are then unknown, and the plan says so.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import Config
from hpctrain.config.shape import run_shape
from hpctrain.models.builtin import model_spec
from hpctrain.models.facts import Activations, Linear, Measured, ModelFacts, ParamFact
from hpctrain.parallel.blocks import find_blocks
from hpctrain.precision import amp, regimes_of
from hpctrain.submit.probe import build_model, first_batches
from hpctrain.train.loss import build_objective, inputs_of, logits_of

SAMPLES = (2, 4)
MEASURE_LIMIT = 2 * 2**30  # bytes of parameters and buffers built on the CPU to measure the activations


def measure_model(cfg: Config) -> ModelFacts:
    """The fact sheet of ``cfg``'s model; a ConfigError (UserCodeError: with the user's traceback) when it
    cannot be built, a note in its measurement when its activations cannot be measured."""
    start = time.perf_counter()
    meta = build_model(cfg, "meta")
    if cfg.model.adapters == "lora":  # as the trainer adapts it: the base frozen, the adapters beside
        from hpctrain.models.adapters import add_lora

        add_lora(meta, cfg.model.lora)
    unit_of = {}
    blocks = find_blocks(meta, cfg.parallel.block_classes)
    for k, block in enumerate(blocks):
        for name, _ in block.module.named_parameters():
            unit_of[f"{block.name}.{name}"] = k
    tp_dims, stages = _splits(cfg, meta)
    params = tuple(
        ParamFact(
            name,
            tuple(p.shape),
            p.element_size(),
            unit=unit_of.get(name, -1),
            tp_dim=tp_dims.get(name),
            stages=stages(name),
            trainable=p.requires_grad,  # frozen: LoRA's base, or a PEFT model's
        )
        for name, p in meta.named_parameters()
    )
    buffer_bytes = sum(b.numel() * b.element_size() for b in meta.buffers())
    batches = first_batches(cfg, list(SAMPLES))
    main = inputs_of(batches[0])
    # What the batch is: token ids [B, T] (their positions per sample known), images [B, C, H, W], or else.
    input_kind, tokens = None, None
    if isinstance(main, torch.Tensor) and main.dim() == 2 and not main.is_floating_point():
        input_kind, tokens = "tokens", int(main.shape[1])
    elif isinstance(main, torch.Tensor) and main.dim() == 4 and main.is_floating_point():
        input_kind = "images"
    facts = ModelFacts(
        target=cfg.model.target,
        params=params,
        buffer_bytes=buffer_bytes,
        blocks=len(blocks),
        tokens_per_sample=tokens,
        activations=Measured(input_kind=input_kind),
        throughput_unit=model_spec(cfg.model).throughput_unit,
    )
    state = facts.param_bytes + buffer_bytes
    del meta
    if state > MEASURE_LIMIT:
        note = (
            f"not measured: its {state / 2**30:.1f} GiB of parameters and buffers are more than this check "
            f"builds on the CPU ({MEASURE_LIMIT / 2**30:.0f} GiB); the memory below counts none"
        )
        return _with(facts, Measured(note=note, input_kind=input_kind, seconds=time.perf_counter() - start))
    try:
        acts, flops = _measure_all(cfg, batches)
    except Exception as err:  # a model that runs on GPUs only, say: the plan goes on without activations
        text = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        note = f"not measured: a forward of it on the CPU raised {type(err).__name__}: {text}"
        return _with(facts, Measured(note=note, input_kind=input_kind, seconds=time.perf_counter() - start))
    measured = Measured(SAMPLES, acts, input_kind=input_kind, seconds=time.perf_counter() - start)
    return _with(facts, measured, flops_per_sample=flops)


# The dimension of a module's weight and bias each tensor-parallel role splits (hpctrain.parallel.tp:
# nn.Linear weights are [out, in], embeddings [vocab, width]; transformers' Conv1D weights are [in, out]).
TP_DIMS = {
    "colwise": (0, 0),
    "vocab_head": (0, 0),
    "rowwise": (1, None),
    "vocab_embedding": (0, None),
}


def _splits(cfg: Config, meta: nn.Module) -> tuple[dict[str, int], Any]:
    """Under the run's layout: {parameter: the dimension its tensor-parallel role splits}, and a function
    of a parameter's name giving the pipeline stages that hold it (None: every stage, or no pipeline)."""
    from hpctrain.config.shape import run_shape

    shape = run_shape(cfg)
    tp_dims: dict[str, int] = {}
    if shape.degrees.tp > 1:
        from hpctrain.models.adapters import is_transposed_linear
        from hpctrain.parallel.tp import pattern_modules, tp_plan_of

        found = tp_plan_of(meta, dict(cfg.parallel.tp_plan))
        names = {id(m): n for n, m in meta.named_modules()}
        for pattern, role in (found[0] if found else {}).items():
            dims = TP_DIMS.get(role)
            for module in pattern_modules(meta, pattern) if dims else []:
                weight_dim = dims[0]
                if role in ("colwise", "rowwise") and is_transposed_linear(module):
                    weight_dim = 1 - dims[0]
                for which, dim in zip(("weight", "bias"), (weight_dim, dims[1]), strict=True):
                    tensor = getattr(module, which, None)
                    if dim is not None and isinstance(tensor, nn.Parameter) and tensor.dim() > dim:
                        tp_dims[f"{names[id(module)]}.{which}".lstrip(".")] = dim
                # LoRA's adapters split as the Linear (hpctrain.parallel.tp): B's rows under a
                # column-wise split, A's columns under a row-wise one.
                adapter = {"colwise": ("lora_B", 0), "rowwise": ("lora_A", 1)}.get(role)
                if adapter and isinstance(getattr(module, adapter[0], None), nn.Module):
                    tp_dims[f"{names[id(module)]}.{adapter[0]}.weight".lstrip(".")] = adapter[1]
    if shape.degrees.pp <= 1:
        return tp_dims, lambda name: None
    from hpctrain.parallel.stages import pipeline_split, sequential_dropped

    found_split = pipeline_split(meta, dict(cfg.parallel.pp_split))
    if found_split is None:  # the model splits itself: where its parameters go is its own
        return tp_dims, lambda name: None
    n = shape.n_stages
    dropped = [tuple(sequential_dropped(meta, found_split[0], s, n)) for s in range(n)]

    def stages(name: str) -> tuple[int, ...]:
        return tuple(
            s for s in range(n) if not any(name == d or name.startswith(d + ".") for d in dropped[s])
        )

    return tp_dims, stages


def _with(facts: ModelFacts, measured: Measured, **changes: Any) -> ModelFacts:
    import dataclasses

    return dataclasses.replace(facts, activations=measured, **changes)


def regimes(cfg: Config) -> list[str]:
    """The precision regimes the run and the layouts the planner may propose would train in."""
    return regimes_of(cfg.trainer.precision, can_shard=run_shape(cfg).world_size > 1)


def _measure_all(cfg: Config, batches: list[Any]) -> tuple[tuple[Activations, ...], float]:
    objective = build_objective(cfg.loss, cfg.data)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.trainer.seed)
        model = build_model(cfg, "cpu")
    model.train()
    blocks = [b.module for b in find_blocks(model, cfg.parallel.block_classes)]
    found: list[Activations] = []
    flops = 0.0
    for regime in regimes(cfg):
        if regime == "fsdp_mixed":
            model.to(torch.bfloat16)
        keys = ("saved", "checkpointed", "recompute", "output", "outside")
        points: dict[str, dict[int, int]] = {k: {} for k in keys}
        for n, batch in zip(SAMPLES, batches, strict=True):
            if regime == "fsdp_mixed":
                batch = _cast_floats(batch, torch.bfloat16)
            counted = not flops
            sizes, step_flops = _saved_bytes(model, blocks, objective, batch, regime, backward=counted)
            if counted:
                flops = step_flops / n
            for key, value in sizes.items():
                points[key][n] = value
        found.append(Activations(regime, **{k: Linear.through(points[k]) for k in points}))
    return tuple(found), flops


def _saved_bytes(
    model: nn.Module, blocks: list[nn.Module], objective: Any, batch: Any, regime: str, backward: bool
) -> tuple[dict[str, int], float]:
    """Bytes saved for the backward of one forward and loss (see the module docstring), and the FLOPs of
    the forward and backward when ``backward``."""
    from torch.utils.flop_counter import FlopCounterMode

    state = {_storage(t)[0] for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, tuple[int, int]] = {}  # storage → (bytes, block index or -1)
    inputs: dict[int, int] = {}  # storages of the blocks' inputs → bytes
    current = [-1]

    def note(t: torch.Tensor, owner: int) -> None:
        ptr, size = _storage(t)
        if ptr and ptr not in state and ptr not in seen:
            seen[ptr] = (size, owner)

    def pack(t: torch.Tensor) -> torch.Tensor:
        note(t, current[0])
        return t

    def enter(k: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            first = next((a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)), None)
            if first is not None:
                ptr, size = _storage(first)
                inputs.setdefault(ptr, size)
            current[0] = k

        return hook

    def leave(*_: Any) -> None:
        current[0] = -1

    for t in _tensors(batch):
        note(t, -1)
    handles = [b.register_forward_pre_hook(enter(k), with_kwargs=True) for k, b in enumerate(blocks)]
    handles += [b.register_forward_hook(leave) for b in blocks]
    # On the CPU in bf16 whatever the run's 16-bit dtype: the bytes saved are the same, and CPU fp16 is slow.
    autocast = amp.autocast(torch.device("cpu"), "bf16", regime)
    counter = FlopCounterMode(display=False) if backward else nullcontext()
    try:
        with counter:
            with autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                outputs, loss = objective(model, batch)
            if backward:
                loss.float().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    outside = {p: s for p, (s, owner) in seen.items() if owner < 0}
    own = [sum(s for s, owner in seen.values() if owner == k) for k in range(len(blocks))]
    checkpointed = {**outside, **{p: s for p, s in inputs.items() if p not in state}}
    sizes = {
        "saved": sum(s for s, _ in seen.values()),
        "checkpointed": sum(checkpointed.values()) if blocks else sum(s for s, _ in seen.values()),
        "recompute": max(own, default=0),
        "output": _logit_bytes(outputs),
        "outside": sum(outside.values()),
    }
    flops = float(counter.get_total_flops()) if isinstance(counter, FlopCounterMode) else 0.0
    return sizes, flops


def _logit_bytes(outputs: Any) -> int:
    try:
        logits = logits_of(outputs)
    except TypeError:  # a model computing its own loss may return no logits
        return 0
    return logits.numel() * logits.element_size()


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the storage behind ``t``; (0, 0) for a tensor without one."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return 0, 0


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _tensors(v)]
    return []


def _cast_floats(batch: Any, dtype: torch.dtype) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast_floats(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_cast_floats(v, dtype) for v in batch)
    return batch
