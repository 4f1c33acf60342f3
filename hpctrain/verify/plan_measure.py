"""Is the plan right? ``python -m hpctrain.verify.plan_measure`` prints the estimate next to the measurement.

Each case builds a tiny GPT or ViT, lays it out with the real ``hpctrain.parallel.apply.parallelize`` on a
group of gloo processes (CPU), builds the real optimizer (``hpctrain.train.optim.build_optimizer``) and runs
three real training steps (forward, backward, optimizer step; the first ones set up what DDP, FSDP and
the pipeline create lazily), measuring the last. On every rank it compares with
:mod:`hpctrain.plan.estimate` for that rank's pipeline and data-parallel coordinates:

- **parameters, gradients, optimizer state**: the bytes of this rank's local tensors (DTensor
  ``to_local()``: the TP and FSDP shards), parameters counted once when tied, each ``.grad`` after the
  backward, every tensor in the optimizer's state after its step; and autocast's 16-bit copies of the
  weights (the estimate's "autocast weight copies"). These must match exactly, on every rank.
- **activations**: the distinct storages the forward leaves for the backward. Two views of it: the
  storages autograd packs through ``torch.autograd.graph.saved_tensors_hooks`` ("saved"), and every
  storage an op of the forward created that is still alive at the end of it ("held": also what selective
  checkpointing caches outside autograd's hooks, and the outputs a pipeline schedule keeps). Parameters,
  their views and autocast's 16-bit copies of them are not activations (the estimate counts the copies
  under buffers); nor is what existed before the step (the pipeline's receive buffers, also buffers).
  Under a pipeline schedule "held" is sampled after every stage forward and loss, and the peak is kept.
  The estimate must be within :data:`ACTIVATION_TOLERANCE` of "held".

The table shows the largest rank of each case (by measured bytes). The buffers the estimate adds (DDP
buckets, FSDP's gathered blocks, receive buffers, the CUDA reserve) are not measured here: CPU tensors
have no allocator statistics to compare with. On a GPU, ``torch.cuda.max_memory_allocated`` would give
the whole peak; that path is in :func:`cuda_peak_bytes` but has not been run (no GPU on the machine this
was written on): NOT VERIFIED.

One module over 400 lines: the cases, the probe that runs in each rank and the comparison are one check, read
top to bottom, and nothing else uses the probe.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.verify.local_group import run_local_group
from hpctrain.verify.plan_compare import CASES, Case, compare, format_table, overrides

if TYPE_CHECKING:
    import torch

    from hpctrain.rendezvous.env import DistEnv

ACTIVATION_TOLERANCE = 0.15
# Steps per case, the last measured. The ones before set up what is created lazily: DDP rebuilds its
# gradient buckets in the second forward, FSDP initialises on the first, the pipeline its buffers.
STEPS = 3

_COMMON = ["data=synthetic", "trainer.max_steps=2", "logger.progress_bar=false", "optim.warmup_steps=1"]


# ------------------------------------------------------------------------------------------ in a rank
def _storage_tensors(t: Any) -> list[Any]:
    """The plain tensors whose storages hold ``t`` (a DTensor's local shard, a wrapper subclass's inner
    tensors)."""
    import torch
    from torch.distributed.tensor import DTensor

    from hpctrain import torchapi

    if isinstance(t, DTensor):
        return _storage_tensors(torchapi.dtensor_local(t))
    if type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter):
        return [t]
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return [t]
    names, _ = flatten()
    return [inner for name in names for inner in _storage_tensors(getattr(t, name))]


def _storages(t: Any) -> list[Any]:
    out = []
    for inner in _storage_tensors(t):
        with contextlib.suppress(RuntimeError, NotImplementedError):
            storage = inner.untyped_storage()
            if storage.nbytes():
                out.append(storage)
    return out


class Probe:
    """Records the storages a forward creates and the ones autograd saves; ``sample()`` sums those alive.

    A TorchDispatchMode sees every op of the forward (not those of the backward: autograd's engine runs
    them with a graph task id), and ``saved_tensors_hooks`` every tensor autograd saves. Storages are
    tracked by weak reference, so tracking keeps nothing alive.
    """

    def __init__(self, modules: list[Any]) -> None:
        from hpctrain.torchapi import TorchDispatchMode

        self.modules = modules
        self.created: dict[int, Any] = {}  # storage id → weak reference
        self.copies: set[int] = set()  # autocast's (or anyone's) dtype copies of parameters
        self.saved: set[int] = set()
        self._params: set[int] = set()  # storages of the parameters when the forward started
        self.peak_held = 0
        self.peak_saved = 0
        self.peak_copies = 0
        self.active = False
        probe = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                probe._record(func, args, out)
                return out

        self.mode = Mode()

    def _param_keys(self) -> set[int]:
        from hpctrain import torchapi

        keys = set()
        for module in self.modules:
            for p in module.parameters():
                keys.update(torchapi.storage_key(s) for s in _storages(p))
                if p.grad is not None:
                    keys.update(torchapi.storage_key(s) for s in _storages(p.grad))
        return keys

    def _record(self, func: Any, args: Any, out: Any) -> None:
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        from hpctrain import torchapi

        if torchapi.in_backward():  # an op of the backward (or its recomputation)
            return
        outputs = [t for t in torchapi.tree_leaves(out) if isinstance(t, torch.Tensor)]
        copy_of_param = func is torchapi.to_copy_op() and any(
            torchapi.storage_key(s) in self._params for s in _storages(args[0])
        )
        for t in outputs:
            for storage in _storages(t):
                key = torchapi.storage_key(storage)
                if key not in self.created:
                    self.created[key] = StorageWeakRef(storage)
                if copy_of_param:
                    self.copies.add(key)

    def _pack(self, t: Any) -> Any:
        from hpctrain import torchapi

        for storage in _storages(t):
            self.saved.add(torchapi.storage_key(storage))
        return t

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        import torch

        self._params = self._param_keys()
        self.active = True
        try:
            with self.mode, torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield
        finally:
            self.active = False

    def sample(self) -> None:
        """Add up the tracked storages alive now (at their current size: FSDP frees by resizing to 0)."""
        import gc

        from hpctrain import torchapi

        # Unreachable reference cycles (frames of checkpointed blocks) would hold storages until the next
        # collection, at a moment that depends on the allocation history, not on what backward needs.
        gc.collect()
        params = self._param_keys()
        held = saved = copies = 0
        for key, ref in list(self.created.items()):
            if ref.expired():
                del self.created[key]
                continue
            if key in params:
                continue
            size = torchapi.weak_storage_nbytes(ref.cdata)
            if key in self.copies:
                copies += size
                continue
            held += size
            if key in self.saved:
                saved += size
        self.peak_held = max(self.peak_held, held)
        self.peak_saved = max(self.peak_saved, saved)
        self.peak_copies = max(self.peak_copies, copies)


def _local_bytes(t: Any) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def _batch(cfg: Any, samples: int) -> tuple[Any, Any]:
    import torch

    from hpctrain.plan.layout import planned_model

    generator = torch.Generator().manual_seed(cfg.trainer.seed)
    return planned_model(cfg).example_batch(samples, generator, torch)


def measure_case(cfg: Any, device: Any) -> dict[str, Any]:
    """This rank's measured bytes for one config (:data:`STEPS` training steps, the last measured)."""
    import torch

    from hpctrain.config.shape import run_shape
    from hpctrain.models import build_model
    from hpctrain.models.adapters import add_lora
    from hpctrain.parallel.apply import parallelize
    from hpctrain.precision.amp import autocast_dtype
    from hpctrain.train.optim import build_optimizer
    from hpctrain.train.trainer import loss_of

    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg.model)
    if cfg.model.adapters == "lora":
        add_lora(model, cfg.model.lora)
    par = parallelize(model, cfg, device)
    optimizer = build_optimizer(par.model, cfg.optim)
    inputs, targets = _batch(cfg, run_shape(cfg).rank_samples_per_pass)
    targets = par.local_targets(targets)  # context parallelism: this rank's positions
    dtype = autocast_dtype(cfg.trainer.precision, par.regime)
    modules = [par.model, *par.parts]
    probe = Probe(modules)
    pipeline = par.pipeline

    def autocast() -> contextlib.AbstractContextManager[None]:
        return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def loss_fn(logits: Any, target: Any) -> tuple[Any, Any]:
        loss = loss_of(logits, target)
        if probe.active:
            probe.sample()
        return loss, loss / pipeline.n_microbatches  # type: ignore[union-attr]

    def after_stage(*_: Any) -> None:
        if probe.active:
            probe.sample()

    hooks = [part.register_forward_hook(after_stage) for part in par.parts] if pipeline else []
    grads = 0
    for step in range(STEPS):
        measured = step == STEPS - 1
        with autocast():  # the trainer's autocast also covers the backward
            if pipeline is not None:
                with probe.forward() if measured else contextlib.nullcontext():
                    x = inputs.clone() if pipeline.has_first else inputs
                    y = targets.clone() if pipeline.has_last else targets
                    pipeline.step(x, y, loss_fn)
                    del x, y
            else:
                with probe.forward() if measured else contextlib.nullcontext():
                    # Cloned inside: the batch the model keeps is counted like the trainer's.
                    loss = loss_of(par.model(inputs.clone()), targets.clone())
                    if measured:
                        probe.sample()  # the end of the forward: the logits are gone, the loss is left
                loss.backward()
                del loss
        if measured:
            grads = sum(_local_bytes(p.grad) for p in par.model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for hook in hooks:
        hook.remove()
    unique = {id(p): p for p in par.model.parameters()}
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "pp_rank": par.dims.pp_rank,
        # FSDP's chunk: this rank's index in dp_shard × ep × cp (as the flattened mesh).
        "shard_rank": par.dims.degrees.fsdp_index(
            par.dims.coordinate("dp_shard"), par.dims.coordinate("ep"), par.dims.coordinate("cp")
        ),
        "params": sum(_local_bytes(p) for p in unique.values()),
        "grads": grads,
        "optimizer": sum(_local_bytes(v) for v in state),
        "held": probe.peak_held,
        "saved": probe.peak_saved,
        "copies": probe.peak_copies,
        "cuda_peak": cuda_peak_bytes(device),
    }


def cuda_peak_bytes(device: Any) -> int | None:
    """The CUDA caching allocator's peak on a GPU (everything: state, activations, buffers), else None.
    NOT VERIFIED: no GPU was available where this was written."""
    import torch

    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def _worker(env: DistEnv, device: torch.device, jobs: list[tuple[str, list[str]]], out: str) -> None:
    import torch.distributed as dist

    from hpctrain.config.compose import compose, to_typed
    from hpctrain.plan.check import check_run

    results: dict[str, list[dict[str, Any]]] = {}
    for name, args in jobs:
        cfg = to_typed(compose(args))
        check_run(cfg)
        mine = measure_case(cfg, device)
        gathered: list[Any] = [None] * env.world_size
        dist.all_gather_object(gathered, mine)
        results[name] = gathered
    if env.rank == 0:
        Path(out).write_text(json.dumps(results))


def run_cases(cases: list[Case], work_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Measure every case, one group of processes per world size; each case's per-rank results."""
    by_world: dict[int, list[tuple[str, list[str]]]] = {}
    for case in cases:
        by_world.setdefault(case.ranks, []).append((f"{case.model}: {case.name}", overrides(case)))
    results: dict[str, list[dict[str, Any]]] = {}
    for world, jobs in sorted(by_world.items()):
        out = work_dir / f"world{world}.json"
        run_local_group(_worker, world, jobs, str(out))
        results.update(json.loads(out.read_text()))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpctrain.verify.plan_measure", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", nargs="*", help="run only the cases whose name contains one of these")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(word in c.name for word in args.only)]
    with tempfile.TemporaryDirectory(prefix="hpctrain-plan-measure-") as tmp:
        rows = compare(run_cases(cases, Path(tmp)), cases)
    print(format_table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
