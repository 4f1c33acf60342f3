"""Everything resumable, each as a ``Stateful`` that DCP saves and loads in one checkpoint."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from hpctrain import torchapi
from hpctrain.checkpoint.safe import UnsafeCheckpoint, decode, encode

# Optimizer state flattened to one entry per parameter ("state.<name>.exp_avg", "param_groups.<name>.lr"):
# pipeline stages hold different parameters, so a nested "param_groups" list would differ between ranks and
# only one rank's would be saved; per-parameter entries merge, and load under any other layout.
STATE_DICT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
# Loading the trainable parameters alone (the frozen ones came from model.init_from).
PARTIAL_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)


def _clean(name: str) -> str:
    """A parameter's name without the wrappers' parts (DDP's leading ``module.``, compile's ``_orig_mod.``,
    activation checkpointing's ``_checkpoint_wrapped_module.``), as the state dict names it."""
    atoms = name.split(".")
    if atoms[0] == "module":
        atoms = atoms[1:]
    return ".".join(a for a in atoms if a not in ("_orig_mod", "_checkpoint_wrapped_module"))


class ModelOptimizerState:
    """Model and optimizer through torch's distributed state-dict API: keys are parameter names (no DDP
    ``module.`` prefix, no FSDP or activation-checkpointing wrapper names), so a checkpoint reshards onto
    another layout or world size.

    ``saved_names`` ({name here: name in the checkpoint}) holds each weight once: a tied parameter's second
    name (GPT's ``head.weight``, which torch's model state dict lists too) and a pipeline stage's copy of a
    weight another stage holds (the last stage's LM head under tied embeddings: Megatron's embedding group)
    are saved under the whole model's name (``tok_emb.weight``) and filled from it on load. Ranks that save
    the same name and piece write it once (DCP de-duplicates), and the copies are equal.

    ``trainable_only``: the model part holds the parameters that train, nothing frozen (adapters over base
    weights read from ``model.init_from`` at every start: what changed is what a checkpoint holds)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        saved_names: dict[str, str] | None = None,
        trainable_only: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.saved_names = dict(saved_names or {})
        self.trainable_only = trainable_only
        self._local_keys: dict[str, list[str]] = {}
        self._info: Any = None  # torch's structural look at model and optimizer (see _get_state_dict)

    def _model_state(self, model_sd: dict[str, Any]) -> dict[str, Any]:
        if not self.trainable_only:
            return model_sd
        # Wrappers' names (DDP's module., compile's, checkpointing's) are not in the state dict's keys.
        trainable = {_clean(n) for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in model_sd.items() if k in trainable}

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every model tensor's global shape by parameter name (the names and shapes a checkpoint holds)."""
        model_sd = self._model_state(get_model_state_dict(self.model, options=STATE_DICT_OPTIONS))
        shapes = {name: tuple(t.shape) for name, t in model_sd.items() if isinstance(t, torch.Tensor)}
        return {self.saved_names.get(name, name): shape for name, shape in shapes.items()}

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = self._get_state_dict()
        model_sd = self._model_state(model_sd)
        self._local_keys = {"model": list(model_sd), "optim": list(optim_sd)}
        return {"model": self._to_saved(model_sd, ("",)), "optim": self._to_saved(optim_sd, OPTIM_PREFIXES)}

    def _get_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """torch's ``get_state_dict``, with its look at the model's structure (every parameter's names, the
        shared ones, FSDP modules: ``_verify_options``) made once: it took 10-20 ms of every save of GPT-2
        small, a third of an asynchronous save's stall. The structure does not change between steps (the
        parameters are the same objects, FSDP2's sharded ones included); torch without these functions
        gets the public call."""
        try:
            if self._info is None:
                self._info = torchapi.state_dict_info(self.model, (self.optimizer,), STATE_DICT_OPTIONS)
            model_sd, optim_sd = torchapi.model_and_optim_state_dicts(
                self.model, (self.optimizer,), self._info
            )
        except AttributeError:  # another torch: the public function, structure looked at every time
            return get_state_dict(self.model, self.optimizer, options=STATE_DICT_OPTIONS)
        return model_sd, optim_sd

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._local_keys:
            self.state_dict()
        prefixes = {"model": ("",), "optim": OPTIM_PREFIXES}
        local: dict[str, dict[str, Any]] = {"model": {}, "optim": {}}
        for part, keys in self._local_keys.items():
            used: set[str] = set()
            for key in keys:
                saved = self._saved_key(key, prefixes[part])
                value = state[part][saved]
                # Two copies here (both stages on this rank): the optimizer would keep the very tensor it is
                # given as each copy's state, and update one buffer twice a step. Each gets its own.
                if saved in used and isinstance(value, torch.Tensor):
                    value = value.clone()
                used.add(saved)
                local[part][key] = value
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=local["model"],
            optim_state_dict=local["optim"],
            options=PARTIAL_OPTIONS if self.trainable_only else STATE_DICT_OPTIONS,
        )

    def _to_saved(self, state: dict[str, Any], prefixes: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in state.items():
            saved = self._saved_key(key, prefixes)
            if saved != key and saved in state:
                continue  # the weight is here under its saved name too: an equal copy
            out[saved] = value
        return out

    def _saved_key(self, key: str, prefixes: tuple[str, ...]) -> str:
        """``key`` of the model (prefix "") or flattened optimizer state dict, under the saved names."""
        for prefix in prefixes:
            if not prefix:
                return self.saved_names.get(key, key)
            if key.startswith(prefix):
                name, _, rest = key[len(prefix) :].rpartition(".")
                return f"{prefix}{self.saved_names.get(name, name)}.{rest}" if name else key
        return key


# The flattened optimizer state's keys: "state.<parameter name>.<state>", "param_groups.<name>.<option>".
OPTIM_PREFIXES = ("state.", "param_groups.")


@dataclass
class TrainState:
    """Counters of the run itself."""

    step: int = 0
    wandb_run_id: str | None = None
    requeues: int = 0  # how often the Slurm job had been requeued when this was saved (SLURM_RESTART_COUNT)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.wandb_run_id = state["wandb_run_id"]
        self.requeues = int(state.get("requeues", 0))


class RNGState:
    """This rank's generators (python, numpy, torch CPU, CUDA), saved under a per-rank key.

    Stored as bytes that the weights-only unpickler reads (:func:`hpctrain.checkpoint.safe.encode`): DCP would
    otherwise split the numpy state tuple, and a pickle would let a crafted checkpoint run code.

    ``seed`` (default: torch's current initial seed, i.e. this rank's seed when made right after
    ``seed_everything``) is what :meth:`fresh_stream` derives a stream from when a checkpoint has no state
    for this rank (it was written by fewer ranks)."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = torch.initial_seed() if seed is None else int(seed)

    def fresh_stream(self, rank: int, step: int) -> int:
        """Seed every generator from (seed, rank, step), deterministically; return the seed used."""
        fresh = int(np.random.SeedSequence([self.seed, rank, step]).generate_state(1)[0])
        seed_everything(fresh)
        return fresh

    def state_dict(self) -> dict[str, Any]:
        return {"encoded": encode(self._capture())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "encoded" not in state:  # hpctrain before safe loading pickled it: never unpickled here
            raise UnsafeCheckpoint("the RNG state was written by an older hpctrain as a pickle: not loaded")
        self._restore(decode(state["encoded"]))

    @staticmethod
    def _capture() -> dict[str, Any]:
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def _restore(state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def allocate_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    """Give an optimizer that has not stepped its state tensors (uninitialised: a load fills them), the ones
    its first step would create, without that step; True when it did.

    Why: to load an optimizer, torch's state-dict API needs its state to exist, and creates it with a step at
    lr 0 on zero gradients (``_init_optim_state``): for a 40M GPT and AdamW that step, its zeroed gradients
    and moments took 6.3 of a resume's 8.4 s here, more than reading the checkpoint. Which tensors a step
    creates (names, shapes, dtypes, on the parameter's device or the CPU) is learned from the same optimizer
    class stepping copies of the parameters on the ``meta`` device (no memory, no arithmetic). Where that is
    not possible (a DTensor parameter: its state is a DTensor of the same placement; an optimizer that reads
    values in its step or takes other constructor arguments; a parameter with a gradient already) nothing is
    done, and torch's own step creates the state as before. The caller clears the state again if nothing is
    loaded into it (``optimizer.state.clear()``: a fresh optimizer)."""
    if optimizer.state:
        return False
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params or any(isinstance(p, DTensor) or p.grad is not None for p in params):
        return False
    # One meta copy per kind of parameter of a group (shape, dtype, device, whether it trains): the state a
    # step creates depends on nothing else, and a meta step still costs ~4 ms a parameter in Python.
    proxies: list[nn.Parameter] = []
    groups = []
    for group in optimizer.param_groups:
        kinds: dict[tuple[Any, ...], nn.Parameter] = {}
        for p in group["params"]:
            kind = (tuple(p.shape), p.dtype, p.device, p.requires_grad)
            if kind not in kinds:
                meta = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
                if p.requires_grad:  # as torch's step: state only for the parameters that train
                    meta.grad = torch.zeros_like(meta)
                kinds[kind] = meta
            proxies.append(kinds[kind])
        options = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        if "lr" in options:
            options["lr"] = 0.0
        groups.append({**options, "params": list(kinds.values())})
    try:
        proxy = type(optimizer)(groups)  # every group carries all its options
        proxy.step()
    except Exception:  # any failure: torch's own step creates the state
        return False
    for real, meta in zip(params, proxies, strict=True):
        created = proxy.state.get(meta)
        if created:
            optimizer.state[real] = {k: _allocated(v, real) for k, v in created.items()}
    return bool(optimizer.state)


def _allocated(value: Any, param: torch.Tensor) -> Any:
    """A real, uninitialised tensor for a state tensor the meta step created (on the parameter's device where
    it was on the parameter's, ``meta``; a step count stays where the optimizer put it)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type != "meta":
        return torch.empty(value.shape, dtype=value.dtype, device=value.device)
    if value.shape == param.shape:
        return torch.empty_like(param, dtype=value.dtype)
    return torch.empty(value.shape, dtype=value.dtype, device=param.device)
