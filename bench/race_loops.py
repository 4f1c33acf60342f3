"""hpctrain's rivals in bench/race.py (and the reference of bench/mfu.py): the same training written by hand
in plain torch DDP, and with Lightning Fabric 2.x. Nothing of hpctrain is imported here.

Each loop trains race_model.GPT on race_model.MarkovTokens exactly as hpctrain trains them given the same
numbers (``Race``): same seed before the model is built, same sample order, AdamW with decay on matrices only,
linear warmup + cosine schedule, global-norm clipping, gradient accumulation with DDP's ``no_sync``, the
logged loss the mean over ranks of each rank's mean over its micro-batches. ``run_raw`` / ``run_fabric``
start ``nproc`` processes and return the seconds per step of every ``window`` steps and the logged losses.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from race_model import GPT, MarkovTokens
from torch import nn
from torch.utils.data import DataLoader


@dataclass(frozen=True)
class Race:
    """Every number of the race; the optimizer's are hpctrain's defaults (hpctrain/config/schema.py)."""

    steps: int = 200
    window: int = 10
    nproc: int = 2
    global_batch: int = 32
    micro_batch: int = 8
    seed: int = 1234  # hpctrain's trainer.seed
    model: dict[str, int] = field(
        default_factory=lambda: {
            "vocab_size": 512,
            "seq_len": 128,
            "n_layers": 4,
            "d_model": 256,
            "n_heads": 8,
        }
    )
    data: dict[str, int] = field(default_factory=lambda: {"n_samples": 4096, "branches": 4, "seed": 0})
    lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    device: str = "cpu"  # cpu | cuda (one GPU per process)
    threads: int = 1  # torch threads per process (hpctrain's launcher: cores // processes)
    # The raw loop only (bench/gpu.py's reference): torch.compile the whole model (nanoGPT's way), torch's
    # fused AdamW, TF32 for the float32 matmuls that remain under bf16 autocast.
    compile: bool = False
    fused: bool = False
    tf32: bool = False

    def data_args(self) -> dict[str, int]:
        seq_len, vocab = self.model["seq_len"], self.model["vocab_size"]
        return {**self.data, "seq_len": seq_len, "vocab_size": vocab}

    @property
    def micro_steps(self) -> int:
        return self.global_batch // self.nproc // self.micro_batch


@dataclass
class LoopResult:
    window_times: list[float]  # seconds per step of each window of `window` steps, in order (first: warm-up)
    losses: dict[int, float]  # step → loss logged there (every `window` steps and the last)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lr_factor(race: Race, step: int) -> float:
    """Multiplier of the peak lr before optimizer step ``step`` (0-based): linear warmup, then cosine decay to
    ``min_lr_ratio`` (GPT-3, Brown et al. 2020, section 2.3 / appendix B)."""
    if step < race.warmup_steps:
        return (step + 1) / race.warmup_steps
    progress = min(1.0, (step - race.warmup_steps) / max(1, race.steps - race.warmup_steps))
    return race.min_lr_ratio + (1 - race.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, race: Race) -> list[dict[str, Any]]:
    """Weight decay on matrices only (nanoGPT): biases, norms' gains stay undecayed."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": race.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def rank_batches(race: Race, n: int, rank: int) -> Iterator[list[int]]:
    """This rank's micro-batches of sample indices, step after step, in hpctrain's documented order (docs/,
    its sampler's docstring): the concatenation of per-epoch permutations ``default_rng((seed, epoch))``; step
    k takes stream positions [k·G, (k+1)·G), rank r its contiguous r-th share, cut into micro-batches."""
    per_rank = race.global_batch // race.nproc
    perms: dict[int, np.ndarray] = {}
    for step in range(race.steps):
        start = step * race.global_batch + rank * per_rank
        epochs, offsets = np.divmod(np.arange(start, start + per_rank), n)
        for e in set(epochs.tolist()):
            if e not in perms:
                perms[e] = np.random.default_rng((race.seed, e)).permutation(n)
        indices = [int(perms[e][o]) for e, o in zip(epochs, offsets, strict=True)]
        for i in range(0, per_rank, race.micro_batch):
            yield indices[i : i + race.micro_batch]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())


def _autocast(race: Race) -> contextlib.AbstractContextManager[Any]:
    if race.precision == "bf16":
        return torch.autocast(race.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _Clock:
    """Seconds per step of each window, stamped after the logged loss is read (a host sync, as hpctrain)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.start = time.perf_counter()

    def lap(self, steps: int) -> None:
        now = time.perf_counter()
        self.times.append((now - self.start) / steps)
        self.start = now


def raw_worker(rank: int, race: Race, port: int, out: str) -> None:
    """The loop a researcher writes by hand: DistributedDataParallel, a DataLoader, AdamW, LambdaLR."""
    torch.set_num_threads(race.threads)
    cuda = race.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=race.nproc
    )
    torch.manual_seed(race.seed)
    if race.tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    net: nn.Module = GPT(**race.model).to(device)
    if race.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    model = nn.parallel.DistributedDataParallel(net, device_ids=[rank] if cuda else None)
    optimizer = torch.optim.AdamW(
        param_groups(model, race),
        lr=race.lr,
        betas=(race.beta1, race.beta2),
        eps=race.eps,
        fused=True if race.fused else None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(race, step))
    data = MarkovTokens("train", **race.data_args())
    loader = DataLoader(data, batch_sampler=rank_batches(race, len(data), rank), pin_memory=cuda)
    batches = iter(loader)
    clock, losses = _Clock(), {}
    for step in range(1, race.steps + 1):
        total = torch.zeros((), device=device)
        for i in range(race.micro_steps):
            x, y = (t.to(device, non_blocking=True) for t in next(batches))
            last = i == race.micro_steps - 1
            with contextlib.nullcontext() if last else model.no_sync(), _autocast(race):
                loss = loss_of(model, x, y)
                (loss / race.micro_steps).backward()
            total += loss.detach()
        nn.utils.clip_grad_norm_(model.parameters(), race.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if step % race.window == 0 or step == race.steps:
            mean = total / race.micro_steps
            dist.all_reduce(mean)
            losses[step] = float(mean / race.nproc)
        if step % race.window == 0:
            clock.lap(race.window)
    if rank == 0:
        torch.save(asdict(LoopResult(clock.times, losses)), out)
    _end()


def fabric_worker(rank: int, race: Race, port: int, out: str) -> None:
    """The same loop in Lightning Fabric's idioms: setup, setup_dataloaders, no_backward_sync, backward,
    clip_gradients, all_reduce. The processes are started here (Fabric sees them through
    LightningEnvironment's variables), so each rival starts the same way.

    ``clip_gradients`` takes the parameters in the optimizer's order (its param groups: matrices, then
    vectors), hpctrain and the raw loop in the model's; the total norm then sums the same squares in another
    order and can round differently in the last bit, so Fabric's losses may differ from theirs by an ulp
    (seen: 4.8e-7 at loss 5.8, steps 5 and 12 of 16; clipped in the model's order, all bitwise equal)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        NODE_RANK="0",
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(race.nproc),
    )
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.environments import LightningEnvironment

    for name in ("lightning.fabric", "lightning.pytorch"):  # its banner (rank_zero_info) is not the race's
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(race.threads)
    fabric = Fabric(
        accelerator=race.device,
        devices=race.nproc,
        strategy="ddp",
        precision="bf16-mixed" if race.precision == "bf16" else "32-true",
        plugins=[LightningEnvironment()],  # not Slurm's, even when the bench runs inside an allocation
    )
    fabric.launch()
    fabric.seed_everything(race.seed, verbose=False)
    model = GPT(**race.model)
    optimizer = torch.optim.AdamW(
        param_groups(model, race), lr=race.lr, betas=(race.beta1, race.beta2), eps=race.eps
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(race, step))
    model, optimizer = fabric.setup(model, optimizer)
    data = MarkovTokens("train", **race.data_args())
    loader = fabric.setup_dataloaders(
        DataLoader(data, batch_sampler=rank_batches(race, len(data), rank)), use_distributed_sampler=False
    )
    batches = iter(loader)
    clock, losses = _Clock(), {}
    for step in range(1, race.steps + 1):
        total = torch.zeros((), device=fabric.device)
        for i in range(race.micro_steps):
            x, y = next(batches)
            with fabric.no_backward_sync(model, enabled=i < race.micro_steps - 1):
                loss = loss_of(model, x, y)
                fabric.backward(loss / race.micro_steps)
            total += loss.detach()
        fabric.clip_gradients(model, optimizer, max_norm=race.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if step % race.window == 0 or step == race.steps:
            losses[step] = float(fabric.all_reduce(total / race.micro_steps, reduce_op="mean"))
        if step % race.window == 0:
            clock.lap(race.window)
    if fabric.global_rank == 0:
        torch.save(asdict(LoopResult(clock.times, losses)), out)
    _end()


def _end() -> None:
    """End a worker without Python's teardown: the race with Fabric hung for minutes after both workers'
    last step, one of them deadlocked freeing its gloo process group (as bench/reference_ddp.py did; a
    torch teardown race). Its result is saved; a barrier first, so neither leaves a collective half-done."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def _spawn(worker: Callable[[int, Race, int, str], None], race: Race) -> LoopResult:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.pt")
        mp.spawn(worker, args=(race, free_port(), out), nprocs=race.nproc)
        return LoopResult(**torch.load(out))


def run_raw(race: Race) -> LoopResult:
    return _spawn(raw_worker, race)


def run_fabric(race: Race) -> LoopResult:
    return _spawn(fabric_worker, race)
