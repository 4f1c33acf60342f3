"""Gradient compression for DDP: communication hooks that shrink what the gradient all-reduce sends.

- ``fp16`` / ``bf16``: cast each bucket to 16 bits, all-reduce, cast back (half the bytes).
- ``powersgd``: torch's PowerSGD hook — rank-r approximations M ≈ P Qᵀ of each gradient matrix, one power
  iteration per step, with error feedback and warm start (Vogels et al. 2019, "PowerSGD: Practical Low-Rank
  Gradient Compression for Distributed Optimization").
- ``topk``: each rank sends the k largest-magnitude entries of every bucket and keeps what it did not send
  for later steps (error feedback: Stich et al. 2018, "Sparsified SGD with Memory"; Lin et al. 2018, "Deep
  Gradient Compression").

The hooks with memory (powersgd, topk) keep it in a :class:`CompressionState`, which the trainer checkpoints
per rank. The module is on purpose without ``from __future__ import annotations``: DDP checks a hook's
annotations by identity (``torch.futures.Future[torch.Tensor]``), and string annotations fail that check.

Over 400 lines: the hooks (16-bit, PowerSGD, top-k), their resumable states and the bucket-layout helpers
they share (parameter names per bucket, remapping a state to a new layout, the gloo and bucket-size checks)
are one unit that ``register_compression`` installs together; split, each part would import the others.
"""

import io
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from hpctrain import torchapi

__all__ = [
    "COMPRESSIONS",
    "CompressionState",
    "PowerSGDCompressionState",
    "TopKCompressionState",
    "register_compression",
    "single_bucket_cap_mb",
]

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk")

_MIB = 1024 * 1024

# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name now warns on every call);
# the torch versions this package supports (≥ 2.6) have at least the old name.
_all_gather_single: Callable[..., Any] = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


class CompressionState:
    """Per-rank state of a DDP gradient-compression hook that must survive a checkpoint.

    A ``torch.distributed.checkpoint`` Stateful: :meth:`state_dict` / :meth:`load_state_dict`; the trainer
    saves it under a per-rank key. Hooks without memory (none, fp16, bf16) use this class as is: their
    state dict is ``{}``. Load a checkpoint into it after DDP's buckets are settled (after
    ``prime_ddp_buckets``): every backward, a throwaway one too, goes through the hook and advances its state.
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(
                f"this gradient compression keeps no state, but the checkpoint holds {sorted(state)}: "
                "was it written with another parallel.compression?"
            )


class _ParamNames:
    """Names of a DDP model's parameters, to address a bucket's contents independently of its layout.

    DDP lays out its buckets once in parameter order for the first iteration, then rebuilds them in the
    order gradients became ready (a fresh DDP after a resume goes through the same two layouts), so a
    bucket index does not always name the same parameters at the same offsets.
    """

    def __init__(self, ddp_model: DistributedDataParallel) -> None:
        # bucket.parameters() hands back the very Parameter objects of the module, so id() identifies them.
        self.by_id = {id(p): name for name, p in ddp_model.module.named_parameters() if p.requires_grad}
        self.numel = {name: p.numel() for name, p in ddp_model.module.named_parameters() if p.requires_grad}

    def of(self, bucket: dist.GradBucket) -> tuple[str, ...]:
        """The bucket's parameters by name, in the order their gradients lie in ``bucket.buffer()``."""
        return tuple(self.by_id[id(p)] for p in bucket.parameters())


def _remap(flat: torch.Tensor, old: Sequence[str], new: Sequence[str], numel: dict[str, int]) -> torch.Tensor:
    """``flat`` laid out as the parameters ``old``, re-laid out as ``new`` (a parameter missing from ``old``
    starts at zero)."""
    pieces = dict(zip(old, flat.split([numel[name] for name in old]), strict=True))
    return torch.cat([pieces[name] if name in pieces else flat.new_zeros(numel[name]) for name in new])


def _uses_gloo(group: dist.ProcessGroup, device: torch.device) -> bool:
    """Whether collectives on ``device``'s tensors run on gloo in ``group``."""
    backend = str(dist.get_backend(group))
    if ":" not in backend:  # one backend for every device, e.g. "gloo"
        return backend == "gloo"
    # Several backends, e.g. "cpu:gloo,cuda:nccl": the device type picks one.
    per_device = dict(item.split(":", 1) for item in backend.split(","))
    return per_device.get(device.type) == "gloo"


def _grad_params(model: nn.Module) -> list[torch.Tensor]:
    module = model.module if isinstance(model, DistributedDataParallel) else model
    return [p for p in module.parameters() if p.requires_grad]


def single_bucket_cap_mb(model: nn.Module) -> float:
    """A DDP ``bucket_cap_mb`` that puts every gradient of ``model`` (a plain module or a DDP) in one bucket.

    DDP closes a bucket once its size reaches the cap, so a cap above the total gradient size never closes
    one early; a whole number of MiB above the total keeps ``int(cap * 2**20)`` exact. DDP never mixes
    dtypes or devices in a bucket: a model with several has no single-bucket layout.
    """
    params = _grad_params(model)
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            f"DDP puts each (dtype, device) in its own buckets and this model has {len(kinds)}: "
            f"{sorted(str(kind) for kind in kinds)}; no bucket cap gives it a single bucket"
        )
    total_bytes = sum(p.numel() * p.element_size() for p in params)
    return float(total_bytes // _MIB + 1)


def _first_bucket_cap_bytes(ddp_model: DistributedDataParallel) -> int:
    """The size at which DDP closes the first bucket of its rebuilt layout (the smallest cap it applies)."""
    caps = [int(cap) for cap in getattr(ddp_model, "bucket_bytes_cap_list", [])]
    cap = int(ddp_model.bucket_bytes_cap)
    # Without an explicit bucket_cap_mb, DDP lets its first bucket close at 1 MiB
    # (torchapi.ddp_first_bucket_bytes) to start the all-reduce sooner.
    if getattr(ddp_model, "bucket_bytes_cap_default", False):
        cap = min(cap, torchapi.ddp_first_bucket_bytes())
    return min([cap, *caps])


# ----------------------------------------------------------------------------------------------- bf16


def _bf16_allreduce_hook(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket in bfloat16 and write the mean back in the bucket's own dtype.

    torch's ``default_hooks.bf16_compress_hook`` does the same, but DDP refuses any hook of that name unless
    CUDA and NCCL ≥ 2.10 are present; gloo reduces bf16 tensors fine. Named otherwise on purpose.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    # Divide before the sum, as torch's hook does: the sum of world-size terms then cannot overflow.
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        # Back into the bucket's buffer, in place: no second full-precision copy of the bucket.
        buffer.copy_(fut.value()[0])
        return buffer

    return fut.then(decompress)


# ------------------------------------------------------------------------------------------- powersgd


class PowerSGDCompressionState(CompressionState):
    """torch's ``PowerSGDState`` (error feedback, warm-started P/Q matrices, iteration count, the RNG that
    seeds Q) plus the bucket layouts its per-bucket tensors were made in.

    Saved as ``{"saved": bytes}`` (torch.save, read back weights-only; numpy's RNG state as a tensor): the
    per-bucket tensors exist only after the first compressed step and their sizes depend on the model, so a
    fresh state could not give DCP a template of fixed tensors to load into; the bytes carry whatever there
    is."""

    def __init__(
        self,
        ddp_model: DistributedDataParallel,
        process_group: dist.ProcessGroup,
        *,
        rank: int,
        start_step: int,
        gloo: bool,
    ) -> None:
        self.torch_state = powerSGD_hook.PowerSGDState(
            process_group,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start_step,
            use_error_feedback=True,
            warm_start=True,
            # torch's default 0 turns an all-zero gradient matrix into NaN (0/0 when orthogonalising P);
            # its docs suggest 1e-8 where that can happen, a shift far below fp32 gradient norms.
            orthogonalization_epsilon=1e-8,
        )
        self.gloo = gloo
        self.device = _grad_params(ddp_model)[0].device
        self.names = _ParamNames(ddp_model)
        self.layouts: dict[int, tuple[str, ...]] = {}  # bucket index → its parameters, as last seen
        self._loaded_layouts: dict[int, tuple[str, ...]] = {}  # layouts of a loaded state, until checked

    # The internal fields of PowerSGDState; its hyperparameters come from the run's config instead.
    _FIELDS = (
        "rng",
        "error_dict",
        "p_memory_dict",
        "q_memory_dict",
        "iter",
        "total_numel_before_compression",
        "total_numel_after_compression",
        "next_stats_report",
    )

    def state_dict(self) -> dict[str, Any]:
        # Not PowerSGDState.__getstate__: it logs a warning per call, pickles the hyperparameters too, and its
        # __setstate__ swaps in the default process group.
        s = self.torch_state
        blob = {field: getattr(s, field) for field in self._FIELDS}
        for field in ("error_dict", "p_memory_dict", "q_memory_dict"):
            blob[field] = {index: t.detach().cpu() for index, t in blob[field].items()}
        blob["matrix_approximation_rank"] = s.matrix_approximation_rank
        blob["layouts"] = dict(self.layouts)
        name, keys, pos, has_gauss, cached = s.rng.get_state()
        blob["rng"] = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
        out = io.BytesIO()
        torch.save(blob, out)  # tensors, numbers and tuples of names: the weights-only unpickler reads it
        return {"saved": out.getvalue()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "saved" not in state:  # hpctrain before safe loading pickled it: never unpickled here
            raise ValueError("the PowerSGD state was written by an older hpctrain as a pickle: not loaded")
        blob = torch.load(io.BytesIO(state["saved"]), weights_only=True)
        name, keys, pos, has_gauss, cached = blob["rng"]
        rng = np.random.RandomState()
        rng.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        blob["rng"] = rng
        s = self.torch_state
        for field in self._FIELDS:
            setattr(s, field, blob[field])
        for field in ("error_dict", "p_memory_dict", "q_memory_dict"):
            setattr(s, field, {index: t.to(self.device) for index, t in blob[field].items()})
        if blob["matrix_approximation_rank"] != s.matrix_approximation_rank:
            # P and Q are sized by the rank; with another rank, warm start begins again from random Q.
            s.p_memory_dict.clear()
            s.q_memory_dict.clear()
        self._loaded_layouts = dict(blob["layouts"])
        self.layouts = dict(blob["layouts"])

    def adopt_layout(self, bucket: dist.GradBucket) -> None:
        """Make the loaded per-bucket tensors fit this bucket's layout, if it differs from the saved one.

        The error of each gradient entry moves with its parameter. P and Q are laid out by the compressed
        matrices' order in the bucket: they are dropped, and warm start begins again from a random Q."""
        index = bucket.index()
        names = self.names.of(bucket)
        old = self._loaded_layouts.pop(index, None)
        self.layouts[index] = names
        if old is None or old == names:
            return
        s = self.torch_state
        if index in s.error_dict:
            s.error_dict[index] = _remap(s.error_dict[index], old, names, self.names.numel)
        s.p_memory_dict.pop(index, None)
        s.q_memory_dict.pop(index, None)


def _powersgd_hook(
    state: PowerSGDCompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook``, refusing a second bucket on gloo and keeping loaded state aligned."""
    if state.gloo and bucket.index() > 0:
        # torch's hook issues its P and Q all-reduces and waits on them inside future callbacks, which gloo
        # runs on its own worker threads: with two buckets in flight, the ranks can issue collectives in
        # different orders or block the thread a collective needs. Seen: intermittent deadlocks. Fail instead.
        raise RuntimeError(
            f"PowerSGD on gloo needs one DDP bucket, got bucket {bucket.index()}: build DDP with "
            "bucket_cap_mb=single_bucket_cap_mb(model)"
        )
    state.adopt_layout(bucket)
    return powerSGD_hook.powerSGD_hook(state.torch_state, bucket)


# ----------------------------------------------------------------------------------------------- topk


class TopKCompressionState(CompressionState):
    """Top-K sparsification with error feedback: what a rank did not send is added to its next gradient.

    The residual is kept per parameter, by name, so it survives DDP's bucket rebuild after the first
    iteration (same bucket sizes, other parameter order: a per-bucket buffer would be added at the wrong
    offsets) and a resume into another bucket layout. While a bucket's layout stays the same, its
    parameters' residuals are views into one flat tensor that the hook updates in place.

    ``state_dict()`` is ``{"residual": {parameter name: tensor}}``, a copy (the hook updates the live
    tensors in place), with every parameter present from the start (zeros): a fresh state is the template
    DCP loads into.
    """

    def __init__(
        self, ddp_model: DistributedDataParallel, process_group: dist.ProcessGroup, ratio: float
    ) -> None:
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"topk_ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio
        self.group = process_group
        self.names = _ParamNames(ddp_model)
        self.residual: dict[str, torch.Tensor] = {
            name: torch.zeros_like(p, memory_format=torch.contiguous_format)
            for name, p in ddp_model.module.named_parameters()
            if p.requires_grad
        }
        self._flat: dict[int, tuple[tuple[str, ...], torch.Tensor]] = {}  # bucket index → (layout, residual)

    @property
    def layouts(self) -> dict[int, tuple[str, ...]]:
        """Bucket index → its parameters in buffer order, for the buckets of the current layout."""
        return {index: names for index, (names, _) in self._flat.items()}

    def k(self, numel: int) -> int:
        """Entries sent per bucket: ⌈ratio · numel⌉, at least one."""
        return min(numel, max(1, math.ceil(self.ratio * numel)))

    def bucket_residual(self, bucket: dist.GradBucket) -> torch.Tensor:
        """The flat residual laid out like ``bucket.buffer()``; updating it in place updates the state."""
        index = bucket.index()
        names = self.names.of(bucket)
        cached = self._flat.get(index)
        if cached is not None and cached[0] == names:
            return cached[1]
        # A new layout for this index (first call, DDP's rebuild, or a loaded state): gather each parameter's
        # residual wherever it lives now and make the parameters views into the new flat tensor.
        flat = torch.cat([self.residual[name].reshape(-1) for name in names])
        for name, piece in zip(names, flat.split([self.names.numel[n] for n in names]), strict=True):
            self.residual[name] = piece.view(self.residual[name].shape)
        # A cached bucket sharing a parameter with this one belongs to the old layout: its flat tensor no
        # longer holds that parameter's residual, so it must not be taken for current again.
        moved = set(names)
        self._flat = {i: c for i, c in self._flat.items() if i != index and moved.isdisjoint(c[0])}
        self._flat[index] = (names, flat)
        return flat

    def state_dict(self) -> dict[str, Any]:
        return {"residual": {name: t.detach().clone() for name, t in self.residual.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        loaded = state["residual"]
        if set(loaded) != set(self.residual):
            missing, unexpected = set(self.residual) - set(loaded), set(loaded) - set(self.residual)
            raise ValueError(
                f"Top-K residuals are for other parameters: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
        for name, tensor in loaded.items():
            if tensor.shape != self.residual[name].shape:
                raise ValueError(
                    f"Top-K residual of {name} has shape {tuple(tensor.shape)}, "
                    f"the parameter {tuple(self.residual[name].shape)}"
                )
            # In place: the flat per-bucket tensors the hook works on stay valid.
            self.residual[name].copy_(tensor)


def _topk_hook(state: TopKCompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Send each rank's k largest-|g + residual| entries of the bucket; the bucket becomes their mean.

    Per bucket (Stich et al. 2018, Alg. 1; Lin et al. 2018, §3.1): acc = g + e; send the top-k of |acc|;
    e ← acc with those k entries zeroed. Every rank gathers every rank's (index, value) pairs and sums them
    into a dense zero buffer in rank order, divided by the world size; all ranks get the same bits, so the
    replicas stay identical.
    """
    group = state.group
    world_size = dist.get_world_size(group)
    buffer = bucket.buffer()
    residual = state.bucket_residual(bucket)
    residual.add_(buffer)  # acc = g + e, in the residual's memory
    k = state.k(residual.numel())
    indices = torch.topk(residual.abs(), k, sorted=False).indices
    values = residual[indices]
    residual[indices] = 0  # e ← acc minus what is sent
    # Every rank sends exactly k entries of this bucket (same numel, same ratio), so fixed-size gathers fit.
    all_indices = indices.new_empty(world_size * k)
    all_values = values.new_empty(world_size * k)
    # Both collectives are issued here, in DDP's bucket order, on every rank; only local work is left for the
    # callback (a collective issued from a callback runs in a thread-dependent order: see _powersgd_hook).
    futures = [
        _all_gather_single(all_indices, indices, group=group, async_op=True).get_future(),
        _all_gather_single(all_values, values, group=group, async_op=True).get_future(),
    ]

    def decompress(_: torch.futures.Future[list[torch.futures.Future[Any]]]) -> torch.Tensor:
        buffer.zero_()
        # Rank by rank: one rank's indices are distinct, so each index_add_ adds at most once per entry and
        # the float sum has the same order on every rank and device (no atomics racing).
        for rank_indices, rank_values in zip(all_indices.split(k), all_values.split(k), strict=True):
            buffer.index_add_(0, rank_indices, rank_values)
        return buffer.div_(world_size)

    return torch.futures.collect_all(futures).then(decompress)


# ------------------------------------------------------------------------------------------- register


def register_compression(
    ddp_model: DistributedDataParallel,
    compression: str,
    *,
    topk_ratio: float,
    powersgd_rank: int,
    powersgd_start_step: int,
    process_group: dist.ProcessGroup | None = None,
) -> CompressionState:
    """Register the comm hook named by ``compression`` on ``ddp_model`` ("none": nothing registered).

    ``process_group``: the group DDP reduces over (default: the DDP model's own). Returns the hook's state,
    to checkpoint per rank. PowerSGD on gloo needs every gradient in one bucket (torch's hook can deadlock
    there with several): build the DDP with ``bucket_cap_mb=single_bucket_cap_mb(model)``; a model whose
    gradients do not fit the cap is refused here.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown gradient compression {compression!r}; expected one of {COMPRESSIONS}")
    group = process_group if process_group is not None else ddp_model.process_group
    if compression == "none":
        return CompressionState()
    if compression == "fp16":
        ddp_model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        return CompressionState()
    if compression == "bf16":
        ddp_model.register_comm_hook(group, _bf16_allreduce_hook)
        return CompressionState()
    if compression == "topk":
        topk = TopKCompressionState(ddp_model, group, topk_ratio)
        ddp_model.register_comm_hook(topk, _topk_hook)
        return topk
    # powersgd
    if powersgd_rank < 1:
        raise ValueError(f"powersgd_rank must be at least 1, got {powersgd_rank}")
    if powersgd_start_step < 2:
        # torch's own rule with error feedback or warm start: DDP rebuilds its buckets after the first
        # iteration, and per-bucket tensors memorised before that would not fit the new layout.
        raise ValueError(f"powersgd_start_step must be at least 2, got {powersgd_start_step}")
    params = _grad_params(ddp_model)
    gloo = _uses_gloo(group, params[0].device)
    if gloo:
        _check_single_bucket(ddp_model, params)
    powersgd = PowerSGDCompressionState(
        ddp_model, group, rank=powersgd_rank, start_step=powersgd_start_step, gloo=gloo
    )
    ddp_model.register_comm_hook(powersgd, _powersgd_hook)
    return powersgd


def _check_single_bucket(ddp_model: DistributedDataParallel, params: Iterable[torch.Tensor]) -> None:
    """Refuse a DDP whose rebuilt layout may have more than one bucket (PowerSGD on gloo).

    Counting the DDP's current buckets would not do: before its first iteration DDP holds every gradient in
    one bucket whatever the cap, and splits them by the cap only when it rebuilds."""
    params = list(params)
    kinds = {(p.dtype, p.device) for p in params}
    total_bytes = sum(p.numel() * p.element_size() for p in params)
    cap = _first_bucket_cap_bytes(ddp_model)
    if len(kinds) > 1 or total_bytes >= cap:
        raise ValueError(
            "PowerSGD on gloo needs all gradients in one DDP bucket (torch's hook can deadlock with more): "
            f"the model has {total_bytes} bytes of gradients ({total_bytes / _MIB:.3f} MiB) in "
            f"{len(kinds)} dtype/device group(s), the DDP closes its first bucket at {cap} bytes "
            f"({cap / _MIB:.3f} MiB); build the DDP with bucket_cap_mb=single_bucket_cap_mb(model)"
        )
