"""Weights in and out of hpctrain: read a model's weights from what a user has, write them where others read.

Reading (``model.init_from``, ``hpctrain export``, ``hpctrain generate``), never unpickling anything but
tensors:

- an hpctrain checkpoint (``checkpoints/step_N``) or a run directory (its latest committed checkpoint): the
  model's tensors of the DCP checkpoint, consolidated in this process through the verifying reader
  (:mod:`hpctrain.checkpoint.reader`, :mod:`hpctrain.checkpoint.safe`), whatever layout saved it;
- a safetensors file, or a folder of them (transformers' ``save_pretrained`` shards with their index);
- a torch state dict (``.pt`` / ``.bin``), loaded with ``weights_only=True``; a dict holding it under
  ``state_dict`` or ``model`` is unwrapped.

Keys are matched to the model's by name; common wrappers' prefixes (``module.`` of DDP, ``_orig_mod.`` of
``torch.compile``, transformers' ``model.``) are mapped when that makes more of them match.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import ModelConfig
from hpctrain.errors import ConfigError
from hpctrain.rundir import checkpoints as layout

log = logging.getLogger(__name__)
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
# Where a checkpoint holds the model (hpctrain.train.trainer's "model_optim" Stateful, its "model" part).
CHECKPOINT_MODEL = "model_optim.model."
SAFETENSORS_INDEX = "model.safetensors.index.json"


def read_weights(path: Path, key: str = "model.init_from") -> dict[str, torch.Tensor]:
    """Every tensor of the weights at ``path`` by name (see the module docstring), or a one-line
    ConfigError for ``key`` naming why they cannot be read."""
    path = Path(path)
    with _readable(path, key):
        if path.is_dir():
            return _read_dir(path, key)
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return _torch_state_dict(path, key)


@contextlib.contextmanager
def _readable(path: Path, key: str) -> Iterator[None]:
    """Reading the weights at ``path``: a missing path, or a damaged or foreign file (its reader's own words),
    is one line for ``key``."""
    if not path.exists():
        raise ConfigError(key, str(path), "no such file or directory")
    try:
        yield
    except ConfigError:
        raise
    except Exception as err:
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ConfigError(key, str(path), f"cannot be read as weights: {text}") from None


def _read_dir(path: Path, key: str) -> dict[str, torch.Tensor]:
    if layout.is_checkpoint(path):
        return read_checkpoint_model(path, key)
    committed = layout.checkpoints_of(path)
    if committed is not None:
        if not committed:
            raise ConfigError(key, str(path), "holds no committed checkpoint")
        return read_checkpoint_model(committed[0], key)
    shards = sorted(path.glob("*.safetensors"))
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        shards = [path / name for name in files]
    if shards:
        from safetensors.torch import load_file

        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_file(str(shard)))
        return weights
    for name in ("pytorch_model.bin", "model.pt", "weights.pt"):
        if (path / name).is_file():
            return _torch_state_dict(path / name, key)
    raise ConfigError(
        key,
        str(path),
        "holds no weights",
        valid="a checkpoint, a run directory, *.safetensors or a .pt/.bin file",
    )


def _torch_state_dict(path: Path, key: str, mmap: bool = False) -> dict[str, torch.Tensor]:
    try:  # mmap: the tensors' bytes stay on disk (only their shapes are wanted)
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except RuntimeError:
        if not mmap:
            raise
        loaded = torch.load(path, map_location="cpu", weights_only=True)  # the legacy format cannot mmap
    for wrapper in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(wrapper), dict):
            loaded = loaded[wrapper]
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ConfigError(key, str(path), "is not a state dict (a mapping of names to tensors)")
    return dict(loaded)


def read_checkpoint_model(directory: Path, key: str = "model.init_from") -> dict[str, torch.Tensor]:
    """The model's tensors of a committed hpctrain checkpoint, whole (however many ranks saved them), read in
    this process with the safe reader: nothing but tensors is unpickled."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from hpctrain.checkpoint.safe import SafeLoadPlanner
    from hpctrain.checkpoint.tiers import reader_for  # a folder, or a store's prefix (checkpoint.path)

    # Sizes here; the reader verifies each file's checksum as it reads it, before its bytes are used.
    problem = layout.problem_with(directory, checksums=False)
    if problem:
        raise ConfigError(key, str(directory), problem)
    metadata = reader_for(directory).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for name, meta in metadata.state_dict_metadata.items():
        if name.startswith(CHECKPOINT_MODEL) and isinstance(meta, TensorStorageMetadata):
            model[name.removeprefix(CHECKPOINT_MODEL)] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not model:
        raise ConfigError(key, str(directory), "holds no model tensors")
    state = {"model_optim": {"model": model}}
    with warnings.catch_warnings():  # one process by design: DCP's note that no process group is up
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(state, storage_reader=reader_for(directory), planner=SafeLoadPlanner(), no_dist=True)
        except BaseException as err:  # DCP's CheckpointException: one line naming the file
            from hpctrain.checkpoint.writer import describe

            raise ConfigError(key, str(directory), f"not loadable: {describe(err)}") from None
    return model


def init_from(
    model: nn.Module, model_cfg: ModelConfig, continued: str | Path | None, rank: int, always: bool = False
) -> None:
    """Start from ``model.init_from``'s weights, unless this run continues a checkpoint (``continued``,
    :func:`hpctrain.rundir.checkpoints.continued`: its own, as a requeued or resumed job keeps the same
    command, or the one ``trainer.resume`` names: torchtitan's rule). Every rank fills its whole model before
    the layout splits it. ``always``: read them whether or not a checkpoint follows (adapters: the
    checkpoints hold only the adapters, the base is these weights)."""
    path = model_cfg.init_from
    if not always and continued is not None:
        if rank == 0:
            log.info("model.init_from=%s ignored: continuing the checkpoint %s", path, continued)
        return
    problems = load_into(model, Path(str(path)), model_cfg.init_strict)
    if rank == 0:
        log.info("Initialised the model from %s%s", path, f" ({'; '.join(problems)})" if problems else "")


def wanted_names(model: nn.Module) -> list[str]:
    """The names a model's weights are saved under: its state dict's, each tied parameter once (its first
    name: GPT's ``tok_emb.weight``, not the LM head's alias)."""
    from hpctrain.parallel.shared import tied_parameters

    aliases = {name for names in tied_parameters(model) for name in names[1:]}
    return [name for name in model.state_dict() if name not in aliases]


def weight_shapes(path: Path, key: str = "model.init_from") -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor at ``path`` (any form :func:`read_weights` reads), from headers
    and metadata only: no tensor data is read, so the pre-flight check costs nothing for large weights."""
    path = Path(path)
    with _readable(path, key):
        return _shapes(path, key)


def _shapes(path: Path, key: str) -> dict[str, tuple[int, ...]]:
    if path.is_dir():
        if layout.is_checkpoint(path) or layout.checkpoints_of(path) is not None:
            directory = path
            if not layout.is_checkpoint(path):
                committed = layout.checkpoints_of(path) or []
                if not committed:
                    raise ConfigError(key, str(path), "holds no committed checkpoint")
                directory = committed[0]
            return _checkpoint_shapes(directory, key)
        files = _weight_files(path)
        if not files:
            raise ConfigError(
                key,
                str(path),
                "holds no weights",
                valid="a checkpoint, a run directory, *.safetensors or a .pt/.bin file",
            )
        shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            shapes.update(_shapes(file, key))
        return shapes
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    loaded = _torch_state_dict(path, key, mmap=True)
    return {name: tuple(t.shape) for name, t in loaded.items()}


def _weight_files(path: Path) -> list[Path]:
    """The weight files of a folder: safetensors shards (by transformers' index when there is one), else
    the first torch state dict of the usual names."""
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return shards
    return [
        path / name for name in ("pytorch_model.bin", "model.pt", "weights.pt") if (path / name).is_file()
    ][:1]


def _checkpoint_shapes(directory: Path, key: str) -> dict[str, tuple[int, ...]]:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from hpctrain.checkpoint.safe import SafeFileSystemReader

    problem = layout.problem_with(directory)
    if problem:
        raise ConfigError(key, str(directory), problem)
    metadata = SafeFileSystemReader(directory).read_metadata()
    return {
        name.removeprefix(CHECKPOINT_MODEL): tuple(meta.size)
        for name, meta in metadata.state_dict_metadata.items()
        if name.startswith(CHECKPOINT_MODEL) and isinstance(meta, TensorStorageMetadata)
    }


def fit_problems(
    wanted: list[str], own: dict[str, tuple[int, ...]], given: dict[str, tuple[int, ...]]
) -> list[str]:
    """What keeps weights of shapes ``given`` (renamed to the model's) from filling a model whose state has
    shapes ``own``, of which ``wanted`` are saved: missing, unexpected and reshaped names, each a phrase."""
    missing = [name for name in wanted if name not in given]
    unexpected = [name for name in given if name not in own]
    wrong = [
        f"{name} {tuple(given[name])} ≠ {tuple(own[name])}"
        for name in wanted
        if name in given and tuple(given[name]) != tuple(own[name])
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({_few(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected ({_few(unexpected)})")
    if wrong:
        problems.append(f"{len(wrong)} of another shape ({_few(wrong)})")
    return problems


def check_weights_fit(
    model: nn.Module, path: Path, strict: bool = True, key: str = "model.init_from"
) -> None:
    """Before anything starts: the weights at ``path`` fit ``model`` (built on the meta device), by names
    and shapes read from headers; a one-line ConfigError otherwise (when ``strict``)."""
    if not strict:
        return
    wanted = wanted_names(model)
    given = match_names(wanted, weight_shapes(path, key))
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    problems = fit_problems(wanted, own, given)
    if problems:
        raise ConfigError(
            key,
            str(path),
            "does not fit the model: " + "; ".join(problems),
            valid="weights of this model, or model.init_strict=false to load what fits",
        )


def match_names(wanted: list[str], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` renamed to the model's names where a wrapper prefix differs: the mapping (strip or add one of
    :data:`WRAPPER_PREFIXES`) under which the most names match; names nothing maps stay as they are."""
    want = set(wanted)

    def renamed(rename: Any) -> dict[str, torch.Tensor]:
        return {rename(k): v for k, v in given.items()}

    candidates = [renamed(lambda k: k)]
    for prefix in WRAPPER_PREFIXES:
        candidates.append(renamed(lambda k, p=prefix: k.removeprefix(p)))
        candidates.append(renamed(lambda k, p=prefix: p + k))
    return max(candidates, key=lambda c: len(want & set(c)))


def load_into(model: nn.Module, path: Path, strict: bool = True, key: str = "model.init_from") -> list[str]:
    """Fill ``model``'s weights from ``path``. Missing or unexpected names, or a shape that differs, are one
    ConfigError line when ``strict``; otherwise what matches is loaded and the rest returned as warnings."""
    return fill(model, read_weights(path, key), str(path), strict, key)


def fill(
    model: nn.Module,
    tensors: dict[str, torch.Tensor],
    where: str,
    strict: bool = True,
    key: str = "model.init_from",
) -> list[str]:
    """:func:`load_into` of tensors already read (``where``: what the one-line ConfigError names)."""
    wanted = wanted_names(model)
    weights = match_names(wanted, tensors)
    own = model.state_dict()
    shapes = {name: tuple(t.shape) for name, t in weights.items()}
    problems = fit_problems(wanted, {name: tuple(t.shape) for name, t in own.items()}, shapes)
    if problems and strict:
        raise ConfigError(
            key,
            where,
            "does not fit the model: " + "; ".join(problems),
            valid="weights of this model, or model.init_strict=false to load what fits",
        )
    usable = {n: t for n, t in weights.items() if n in own and t.shape == own[n].shape}
    # Integers (or booleans) where the model holds floating point are no weights of it: a cast would load
    # counts or ids as if they had been trained (a float ↔ float cast, fp32 ↔ bf16, is a precision's).
    cast = [
        f"{n} {t.dtype} → {own[n].dtype}"
        for n, t in usable.items()
        if own[n].is_floating_point() and not t.is_floating_point()
    ]
    if cast:
        raise ConfigError(
            key,
            where,
            f"holds {len(cast)} integer tensor(s) where the model's are floating point ({_few(cast)})",
            valid="floating-point weights of this model",
        )
    for name, tensor in usable.items():  # weights full of NaN would train to the end with a NaN loss
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ConfigError(
                key,
                where,
                f"holds non-finite values (NaN or inf) in {name}",
                valid="weights of a run that did not diverge",
            )
    with torch.no_grad():
        for name, tensor in usable.items():
            own[name].copy_(tensor.to(own[name].dtype))
    return problems


def _few(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f", … {len(names) - shown} more" if len(names) > shown else "")
