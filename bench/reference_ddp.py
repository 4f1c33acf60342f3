"""The minimal hand-written torch DDP loop hpctrain is measured against (test_parity.py, overhead.py).

What a researcher would write by hand: same model class, seed, data order, AdamW param groups, warmup +
cosine schedule, clipping and gradient accumulation with ``no_sync`` as hpctrain, in plain torch. The config
only supplies the numbers.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def reference_worker(
    rank: int, world_size: int, port: int, overrides: list[str], out: str, window: int
) -> None:
    """Train; rank 0 saves ``{"weights": state_dict, "window_times": [seconds per step, per window]}``."""
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.config.shape import global_batch_size
    from hpctrain.data import GlobalBatchSampler, build_datasets
    from hpctrain.models import build_model
    from hpctrain.models.builtin import model_spec

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
    train_set, _ = build_datasets(cfg.data, model_spec(cfg.model), t.seed)
    sampler = GlobalBatchSampler(len(train_set), global_batch_size(cfg), t.seed)
    per_rank = global_batch_size(cfg) // world_size
    micro_steps = per_rank // t.micro_batch_size
    window_times = []
    window_start = time.perf_counter()
    for step in range(1, t.max_steps + 1):
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
        if step % window == 0:
            now = time.perf_counter()
            window_times.append((now - window_start) / window)
            window_start = now
    if rank == 0:
        weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
        torch.save({"weights": weights, "window_times": window_times}, out)
    dist.barrier()  # both ranks are done with every collective
    # And the process ends here, without Python's teardown: freeing DDP's Reducer drops the last reference to
    # its ProcessGroupGloo, whose destructor joins its work thread while holding the GIL, and that thread,
    # freeing the last all-reduce's work, waits for the GIL (seen in CI, torch 2.13: gdb showed
    # ~ProcessGroupGloo in pthread_join under pybind11_object_dealloc, pt_gloo_runloop in take_gil).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
