"""hpctrain's 2-rank DDP ends with the same weights as a minimal hand-written torch DDP loop.

The reference below is what a researcher would write by hand: same model class, seed, data order, AdamW
param groups, warmup + cosine schedule, clipping and gradient accumulation with ``no_sync``. Both runs
make the same floating-point operations in the same order (2 ranks: the gradient all-reduce is one
commutative addition per element), so the weights must be bitwise equal.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import FAST, hpctrain
from torch.nn.parallel import DistributedDataParallel

from hpctrain.checkpoint.manager import read_checkpoint
from hpctrain.config.compose import compose, to_typed
from hpctrain.launch.local import free_port

STEPS = 12
OVERRIDES = [
    *FAST,
    f"trainer.max_steps={STEPS}",
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=4",  # 2 micro-batches per rank: exercises no_sync accumulation
    "optim.warmup_steps=3",
    "optim.grad_clip=0.5",
    "cluster.nproc=2",
]


def reference_worker(rank: int, world_size: int, port: int, overrides: list[str], out: str) -> None:
    # The config only supplies the numbers; everything below is plain torch.
    from hpctrain.data import GlobalBatchSampler, build_datasets
    from hpctrain.models import build_model

    cfg = to_typed(compose(overrides))
    t, o = cfg.trainer, cfg.optim
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.manual_seed(t.seed)
    model = DistributedDataParallel(build_model(cfg.model))
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": o.weight_decay}, {"params": vectors, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
    )

    def schedule(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        progress = min(1.0, (step - o.warmup_steps) / max(1, t.max_steps - o.warmup_steps))
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    train_set, _ = build_datasets(cfg.data, cfg.model, t.seed)
    sampler = GlobalBatchSampler(len(train_set), t.global_batch_size, t.seed)
    per_rank = t.global_batch_size // world_size
    micro_steps = per_rank // t.micro_batch_size
    for _ in range(t.max_steps):
        mine = sampler.next_global_batch()[rank * per_rank : (rank + 1) * per_rank]
        for i in range(micro_steps):
            x, y = train_set.get_batch(mine[i * t.micro_batch_size : (i + 1) * t.micro_batch_size])
            if i < micro_steps - 1:
                with model.no_sync():
                    loss = F.cross_entropy(model(x).flatten(0, -2), y.flatten())
                    (loss / micro_steps).backward()
            else:
                loss = F.cross_entropy(model(x).flatten(0, -2), y.flatten())
                (loss / micro_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, out)
    dist.destroy_process_group()


def test_ddp_matches_a_hand_written_torch_loop_bitwise(tmp_path: Path):
    run = tmp_path / "run"
    result = hpctrain(*OVERRIDES, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr

    reference_file = tmp_path / "reference.pt"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(reference_worker, args=(2, free_port("127.0.0.1"), OVERRIDES, str(reference_file)), nprocs=2)
    reference = torch.load(reference_file)

    ours = read_checkpoint(run / "checkpoints" / f"step_{STEPS:08d}")["model_optim"]["model"]
    assert ours.keys() == reference.keys()
    differing = {k: (ours[k] - reference[k]).abs().max().item() for k in ours if not torch.equal(ours[k], reference[k])}
    assert not differing, f"weights differ from the hand-written loop: {differing}"
    # And training did something: the weights moved away from their initial values.
    torch.manual_seed(to_typed(compose(OVERRIDES)).trainer.seed)
    from hpctrain.models import build_model

    initial = build_model(to_typed(compose(OVERRIDES)).model).state_dict()
    assert not torch.equal(initial["layers.0.attn.q.weight"], ours["layers.0.attn.q.weight"])
