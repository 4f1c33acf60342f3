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

from hpctrain.checkpoint.safe import UnsafeCheckpoint, decode, encode

# Optimizer state flattened to one entry per parameter ("state.<name>.exp_avg", "param_groups.<name>.lr"):
# pipeline stages hold different parameters, so a nested "param_groups" list would differ between ranks and
# only one rank's would be saved; per-parameter entries merge, and load under any other layout.
STATE_DICT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class ModelOptimizerState:
    """Model and optimizer through torch's distributed state-dict API: keys are parameter names (no DDP
    ``module.`` prefix, no FSDP or activation-checkpointing wrapper names), so a checkpoint reshards onto
    another layout or world size."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every model tensor's global shape by parameter name (the names and shapes a checkpoint holds)."""
        model_sd = get_model_state_dict(self.model, options=STATE_DICT_OPTIONS)
        return {name: tuple(t.shape) for name, t in model_sd.items() if isinstance(t, torch.Tensor)}

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=STATE_DICT_OPTIONS)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=STATE_DICT_OPTIONS,
        )


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
