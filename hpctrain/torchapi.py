"""Every private torch API hpctrain uses, in one place: small named functions and values for the rest of
the package, which uses torch's public API only (``tests/unit/test_torch_api.py`` walks every module and
fails on a private torch name anywhere else).

A private name (``torch._dynamo``, ``torch.distributed.checkpoint._nested_dict``, ``Tensor._local_tensor``)
may change or go in any torch release. Held here, a new torch is checked against one file, and the torch
range this file was tried with is enforced once: importing it raises
:class:`~hpctrain.version.UnsupportedEnvironment` (one line naming the installed torch and the supported
range, ``hpctrain.version.TORCH_SUPPORTED``) for a torch outside it. The CLI and the worker refuse such a
torch earlier, from its package metadata, before anything starts
(:func:`hpctrain.version.environment_problem`); this check covers a process reached another way.

Imports torch and no other torch module at import: each private module is imported by the function that
needs it, so a module of the submit path (say :mod:`hpctrain.submit.probe`) that reaches this one inside a
function costs no more than before, and heavy modules (dynamo, inductor) load only where they are used.

What is here, by who uses it:

- checkpoint/: DCP's flattening of a state (``_nested_dict``, ``_stateful_to_state_dict``), its in-place load
  without a process group (``_load_state_dict``), its empty-state load planner, its per-entry storage record
  (``_StorageInfo``) and metadata path, the names its metadata pickles (``serialization._get_layout``), its
  narrowing of a stored piece (``_shard._utils``), ``get_state_dict``'s steps taken apart
  (``state_dict._verify_options`` ...), a shared-memory storage (``UntypedStorage._new_shared``) and its
  pinning (``cuda._pin_memory_utils``).
- parallel/ and models/: DDP's first bucket size, ``_foreach_mul_``, the autograd all-to-all
  (``_functional_collectives``), the activation-checkpoint wrapper (``algorithms._checkpoint``), the private
  ops that selective recomputation saves, ``DeviceMesh._flatten``, compile's caches (``_inductor`` and
  ``_functorch`` config, dynamo's counters), whether autograd's engine is running a backward
  (``_C._current_graph_task_id``), a module's own parameters and children (``_parameters``, ``_modules``).
- train/: an LR scheduler's last rates (``_last_lr``), set on a resume that changes the schedule.
- data/: a DataLoader iterator's ``_shutdown_workers``.
- forkserver/ and verify/: the lazily imported modules preloaded before forking (``_dynamo``, ...); the
  measurement of plan_measure (``_python_dispatch``, ``_pytree``, storage handles, ``aten._to_copy``).
- submit/probe.py: the pytree logger that a user's libraries make talk.
- task/: the fake process group of a rehearsal (``testing._internal.distributed.fake_pg``).
- task/ and observe/: the CUDA allocator's history and snapshot (``trainer.memory_history``), the NCCL flight
  recorder's dump (``_dump_nccl_trace``) beside a hang's stacks.

Not here: parallel/tp.py's ``ParallelStyle`` subclasses define ``_apply`` and call the styles'
``_prepare_input_fn``/``_prepare_output_fn``, the hooks torch asks a custom style to implement.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from hpctrain.version import UnsupportedEnvironment, torch_problem

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.checkpoint.default_planner import (
        _EmptyStateDictLoadPlanner as EmptyStateDictLoadPlanner,
    )
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils._python_dispatch import TorchDispatchMode

# Everything the package takes from torch's private API, packed (a table, read by name).
__all__ = [
    "DYNAMO_MODULE", "LAZY_MODULES", "METADATA_PICKLE_NAMES", "EmptyStateDictLoadPlanner",
    "TorchDispatchMode", "all_to_all_autograd", "attention_ops", "checkpoint_wrapper",
    "clear_inductor_caches", "ddp_first_bucket_bytes", "dtensor_local", "dynamo_counters",
    "enable_compile_caches", "flatten_mesh", "flatten_state_dict", "foreach_mul_", "import_compile_config",
    "in_backward", "load_state_dict_here", "memory_snapshot", "metadata_path", "model_and_optim_state_dicts",
    "narrow_tensor_by_index", "nccl_flight_record", "new_shared_storage", "own_children", "own_parameters",
    "pin_host_memory", "preload_lazy_modules", "quiet_pytree_log", "record_memory_history",
    "reduce_scatter_op", "set_element", "set_last_lr",
    "shutdown_loader_workers", "state_dict_info", "stateful_to_state_dict", "storage_info", "storage_key",
    "to_copy_op", "tree_leaves", "weak_storage_nbytes",
]  # fmt: skip

# Once, at import: every private name below was tried with the torches of this range only.
_PROBLEM = torch_problem(torch.__version__)
if _PROBLEM is not None:
    raise UnsupportedEnvironment(_PROBLEM)

# Classes a caller subclasses at its own import, resolved on first use (module __getattr__, PEP 562): the
# modules holding them are imported then, not by everyone who imports this one.
_LAZY_CLASSES = {
    "EmptyStateDictLoadPlanner": (
        "torch.distributed.checkpoint.default_planner",
        "_EmptyStateDictLoadPlanner",
    ),
    "TorchDispatchMode": ("torch.utils._python_dispatch", "TorchDispatchMode"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_CLASSES:
        module, attribute = _LAZY_CLASSES[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------- checkpoint


def stateful_to_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """DCP's save-side view of ``state``: each Stateful replaced by its ``state_dict()``."""
    from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict

    return _stateful_to_state_dict(state)


def flatten_state_dict(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DCP's flattening of a nested state: ({dotted name: value}, the mapping back)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict as flatten

    return flatten(state)


def set_element(root: dict[str, Any], path: Any, value: Any) -> None:
    """DCP's setter of a value at a flattened path (a mapping's entry) in a nested state."""
    from torch.distributed.checkpoint._nested_dict import set_element as set_at

    set_at(root, path, value)


def load_state_dict_here(state: dict[str, Any], storage_reader: Any, planner: Any) -> None:
    """DCP's load into ``state`` itself in this one process (no process group): what torch's own
    ``dcp_to_torch_save`` calls; the public ``dcp.load`` would fill a copy."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _load_state_dict(state, storage_reader=storage_reader, planner=planner, no_dist=True)


def storage_info(relative_path: str, offset: int, length: int, **fields: Any) -> Any:
    """DCP's record of where one written item lies (FileSystemWriter's ``_StorageInfo``)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return _StorageInfo(relative_path, offset, length, **fields)


def metadata_path(reader: Any, rank: int | None) -> Any:
    """The ``.metadata`` path a FileSystemReader reads for ``rank``."""
    return reader._get_metadata_path(rank)


# The private callables of torch that DCP's pickled metadata names (tensor layouts), for an allow-list.
METADATA_PICKLE_NAMES: dict[tuple[str, str], Any] = {
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
}


def narrow_tensor_by_index(
    tensor: torch.Tensor, offsets: Sequence[int], sizes: Sequence[int]
) -> torch.Tensor:
    """The part of a stored piece a read item asks for (DCP's own narrowing)."""
    from torch.distributed._shard._utils import narrow_tensor_by_index as narrow

    return narrow(tensor, offsets, sizes)


def state_dict_info(model: nn.Module, optimizers: tuple[Any, ...], options: Any) -> Any:
    """``get_state_dict``'s look at the model's structure (``_verify_options``), to be made once. Raises
    AttributeError where this torch lacks it (the caller falls back to the public function)."""
    from torch.distributed.checkpoint import state_dict as internals

    return internals._verify_options(model, optimizers, optim_only=False, options=options)


def model_and_optim_state_dicts(
    model: nn.Module, optimizers: tuple[Any, ...], info: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``get_state_dict``'s own steps with the structure ``info`` already looked at. AttributeError as
    :func:`state_dict_info`."""
    from torch.distributed.checkpoint import state_dict as internals

    with internals._gc_context():
        model_sd = internals._get_model_state_dict(model, info)
        optim_sd = internals._get_optim_state_dict(model, optimizers, info)
        internals._verify_state_dict(model_sd, optim_sd, info)
    return model_sd, optim_sd


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """An untyped storage of ``nbytes`` in shared memory (another process can map it)."""
    return torch.UntypedStorage._new_shared(nbytes)


def pin_host_memory(data_ptr: int, size: int) -> None:
    """Pin existing host memory for fast copies from a GPU (``cudaHostRegister``)."""
    import torch.cuda._pin_memory_utils as pinning

    pinning.pin_memory(data_ptr, size)


# --------------------------------------------------------------------------------------- parallel, models


def ddp_first_bucket_bytes() -> int:
    """The size at which DDP closes its first bucket when no bucket cap is given."""
    return int(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def foreach_mul_(tensors: list[torch.Tensor], scalar: torch.Tensor) -> None:
    """Multiply every tensor of ``tensors`` in place by ``scalar`` (one fused kernel per device and dtype)."""
    torch._foreach_mul_(tensors, scalar)


def all_to_all_autograd(
    tensor: torch.Tensor, output_splits: list[int] | None, input_splits: list[int] | None, group: Any
) -> torch.Tensor:
    """All-to-all of ``tensor``'s rows over ``group``, waited for; its backward runs the reverse exchange."""
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_to_all_single_autograd(tensor, output_splits, input_splits, group))


def checkpoint_wrapper(module: nn.Module, **options: Any) -> nn.Module:
    """``module`` wrapped for activation checkpointing (non-reentrant); the state dict drops its prefix."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as wrap

    return wrap(module, **options)


# The fused attention kernels' ops: what selective recomputation keeps (each where this torch has it).
_ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_cudnn_attention",
)


def attention_ops() -> set[object]:
    """The fused scaled-dot-product-attention ops this torch has (aten's private overloads)."""
    aten = torch.ops.aten
    return {getattr(aten, name).default for name in _ATTENTION_OPS if hasattr(aten, name)}


def reduce_scatter_op() -> object:
    """The functional reduce-scatter op (a tensor-parallel block's, under DTensor)."""
    return torch.ops._c10d_functional.reduce_scatter_tensor.default


def flatten_mesh(mesh: DeviceMesh, name: str) -> DeviceMesh:
    """One 1-D mesh named ``name`` over the ranks of ``mesh``'s dimensions."""
    return mesh._flatten(name)


def import_compile_config() -> None:
    """Import inductor's and AOTAutograd's config (dynamo with them: ~2-3 s on a CPU), as compile's module
    does at its own import: torch makes its default cache folder then, before a run points it elsewhere."""
    import torch._functorch.config
    import torch._inductor.config
    import torch._inductor.utils  # noqa: F401


def clear_inductor_caches() -> None:
    """Forget what inductor derived from its cache directory and memoised (torch's own
    ``temporary_cache_dir`` does this on a change of directory); nothing where this torch lacks it."""
    import torch._inductor.utils

    clear = getattr(torch._inductor.utils, "clear_caches", None)
    if clear is not None:
        clear()


def enable_compile_caches() -> None:
    """Turn on inductor's FX graph cache and the AOTAutograd cache."""
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True


def dynamo_counters() -> Any:
    """Dynamo's counters of this process: {group: {name: count}}."""
    from torch._dynamo.utils import counters

    return counters


def in_backward() -> bool:
    """Whether autograd's engine is running a backward now (its ops, or a recomputed forward inside it)."""
    return bool(torch._C._current_graph_task_id() != -1)


def own_parameters(module: nn.Module) -> dict[str, Any]:
    """The parameters registered on ``module`` itself (the live dict, None entries included)."""
    return module._parameters


def own_children(module: nn.Module) -> dict[str, Any]:
    """The submodules registered on ``module`` itself (the live dict)."""
    return module._modules


def set_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """What an LR scheduler's ``get_last_lr()`` reports until its next step."""
    scheduler._last_lr = lrs


# ------------------------------------------------------------------------------------------------ data


def shutdown_loader_workers(iterator: Any) -> None:
    """Stop a DataLoader iterator's worker processes now; nothing for one without workers."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


# ------------------------------------------------------------------------------- forkserver, verify, probe

DYNAMO_MODULE = "torch._dynamo"  # the optimizer's first step imports it (~2 s here)
# What torch imports lazily on a worker's way to its first step; private names, so each is tried: another
# torch may not have it.
LAZY_MODULES = (DYNAMO_MODULE, "torch.utils._device", "torch.profiler", "torch.utils.serialization",
                "torch._dynamo.aot_compile", "torch._dynamo.bytecode_debugger",
                "torch._dynamo.functional_export", "torch._dynamo.polyfills.loader",
                "torch.profiler._cupti_monitor")  # fmt: skip


def preload_lazy_modules() -> None:
    """Import :data:`LAZY_MODULES` now (those this torch has)."""
    for name in LAZY_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def quiet_pytree_log() -> None:
    """Hide the pytree module's deprecation lines (libraries registering nodes the old way: one line each)."""
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of a pytree (outputs of an op), in torch's flattening order."""
    from torch.utils._pytree import tree_flatten

    return tree_flatten(tree)[0]


def to_copy_op() -> object:
    """aten's dtype/device copy op (what autocast's casts and ``.to`` run)."""
    return torch.ops.aten._to_copy.default


def storage_key(storage: Any) -> int:
    """A storage's identity while it lives (its C handle)."""
    return int(storage._cdata)


def weak_storage_nbytes(cdata: int) -> int:
    """The current size of the storage a weak reference's handle names."""
    return int(torch.UntypedStorage._new_with_weak_ptr(cdata).nbytes())


def dtensor_local(tensor: Any) -> torch.Tensor:
    """A DTensor's local shard itself (not through autograd, as ``to_local`` is)."""
    return tensor._local_tensor


# --------------------------------------------------------------------------------------- memory, NCCL


def record_memory_history(max_entries: int) -> None:
    """The CUDA caching allocator's history of allocations and frees, each with its Python stack, kept in a
    ring of ``max_entries`` (``torch.cuda.memory._record_memory_history``)."""
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=max_entries
    )


def memory_snapshot() -> dict[str, Any]:
    """The allocator's segments and blocks now, with the history's stacks (``torch.cuda.memory._snapshot``):
    a dict of plain data (hpctrain.observe.memory reads it)."""
    return torch.cuda.memory._snapshot()


def nccl_flight_record() -> bytes | None:
    """The NCCL flight recorder's record of this process's last collectives, pickled plain data
    (``torch._C._distributed_c10d._dump_nccl_trace``); None where torch has no NCCL."""
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    return bytes(dump()) if dump is not None else None


# ------------------------------------------------------------------------------------------- rehearsal


def init_fake_process_group(rank: int, world_size: int) -> None:
    """A process group of ``world_size`` ranks in which this process is ``rank`` and no collective moves
    data: torch's ``fake`` backend, registered by importing ``torch.testing._internal.distributed.fake_pg``
    (torchtitan's ``COMM_MODE=fake_backend`` rehearses a large job's configuration the same way)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
