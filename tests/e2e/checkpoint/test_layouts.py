"""Every layout's checkpoint round-trips bitwise through the new reader, and reshards.

One group of 4 processes (gloo on loopback) builds the real trainer's run (``build_run``: model,
parallelisation, optimizer, checkpoint manager) under ddp, fsdp, tp, pp and 3d, trains one step, saves (the
synchronous writer, or the writer process with ``trainer.async_checkpoint=true``), then builds the run again
in the same run directory, which resumes from that checkpoint: every rank's state (local shards, optimizer
moments, counters, RNG) equals what was saved, bit for bit. The 3d checkpoint (pp 2 × tp 2) is then loaded
into a 2d run (fsdp 2 × tp 2): every full tensor equals the checkpoint's, read whole in one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hpctrain.verify.local_group import run_local_group

WORLD = 4
MODEL = ["model=gpt", "model.n_layers=4", "model.d_model=64", "model.n_heads=4", "model.seq_len=32"]
COMMON = [
    "data=synthetic",
    "data.num_samples=256",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2",
    "trainer.max_steps=4",
    "trainer.eval_batches=1",
    "trainer.watchdog_factor=0",
    f"cluster.nproc={WORLD}",
]
# name, overrides, written by the writer process (else synchronously, in the training process). One layout
# of sharded tensors through the writer is enough for its path (3d: DTensors of FSDP and TP, pipeline
# stages); every writer is a process that imports torch (~3 CPU-s a rank), half this test's CPU with two.
LAYOUTS = [
    ("ddp", ["parallel=ddp"], False),
    ("fsdp", ["parallel=fsdp"], False),
    ("tp", ["parallel=tp"], False),
    ("pp", ["parallel=pp", "parallel.microbatches=4"], False),
    ("3d", ["parallel=3d", "parallel.microbatches=2"], True),
]
RESHARD = ("2d", ["parallel=2d"])


def _flat(resumable: dict[str, Any], full: bool = False) -> dict[str, Any]:
    """Every entry of the run's state as DCP flattens it: tensors copied (a DTensor's local shard, or with
    ``full`` the whole tensor: collective), other values as they are."""
    from torch.distributed.tensor import DTensor

    from hpctrain.checkpoint.staging import flat_state

    flat, _ = flat_state(resumable)
    out: dict[str, Any] = {}
    for name, value in flat.items():
        if isinstance(value, DTensor):
            value = value.full_tensor() if full else value.to_local()
        out[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
    return out


def _configs(work: Path) -> dict[tuple[str, str], Any]:
    """Every run's (composed, typed) config by (layout, phase), composed once here rather than by each of the
    ranks for each build (~0.35 CPU-s a composition)."""
    from hpctrain.config.compose import compose, to_typed

    runs = {}
    for name, overrides, background in LAYOUTS:
        runs[(name, "save")] = [*overrides, f"trainer.async_checkpoint={str(background).lower()}"]
        # Resumes from step_00000001; it saves nothing, so it starts no writer processes.
        runs[(name, "resume")] = [*overrides, "trainer.async_checkpoint=false"]
    name, overrides = RESHARD
    runs[(name, "reshard")] = [*overrides, f"trainer.resume={work / '3d' / 'checkpoints' / 'step_00000001'}"]
    out = {}
    for key, overrides in runs.items():
        composed = compose([*MODEL, *COMMON, *overrides])
        out[key] = (composed, to_typed(composed))
    return out


def _run(env: Any, device: torch.device, work: str, name: str, configs: Any) -> Any:
    import torch.distributed as dist

    from hpctrain.config.io import write_run_config
    from hpctrain.config.shape import run_shape
    from hpctrain.train.trainer import build_run

    composed, cfg = configs
    run_dir = Path(work) / name
    if env.rank == 0 and not (run_dir / "config.yaml").exists():
        write_run_config(run_dir, composed)
    dist.barrier()
    return build_run(cfg, run_shape(cfg), env, device, run_dir)


def _layouts(env: Any, device: torch.device, work: str, configs: dict[tuple[str, str], Any]) -> None:
    import torch.distributed as dist

    from hpctrain.checkpoint.tiers import read_checkpoint
    from hpctrain.train.trainer import train_step

    for name, _, background in LAYOUTS:
        run = _run(env, device, work, name, configs[(name, "save")])
        assert run.state.step == 0
        passes = run.batches.next_step()
        train_step(run.par, run.optimizer, run.scaler, passes, device, "fp32", 1.0, run.objective)
        run.scheduler.step()
        run.state.step = 1
        saved = _flat(run.resumable)
        run.checkpoints.save(1, blocking=not background)
        run.checkpoints.close()
        run.batches.close()

        again = _run(env, device, work, name, configs[(name, "resume")])
        assert again.state.step == 1, name
        loaded = _flat(again.resumable)
        assert loaded.keys() == saved.keys(), name
        for key, value in saved.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == loaded[key].dtype and torch.equal(value, loaded[key]), f"{name}: {key}"
            else:
                assert value == loaded[key], f"{name}: {key}"
        again.checkpoints.close()
        again.batches.close()
        dist.barrier()

    source = Path(work) / "3d" / "checkpoints" / "step_00000001"
    whole = _flat({k: v for k, v in read_checkpoint(source).items()})  # one process, the same reader
    run = _run(env, device, work, RESHARD[0], configs[(RESHARD[0], "reshard")])
    assert run.state.step == 1
    resharded = _flat(run.resumable, full=True)
    model_optim = [k for k in whole if k.startswith("model_optim.")]
    assert model_optim and all(k in resharded for k in model_optim)
    for key in model_optim:
        assert (
            torch.equal(whole[key], resharded[key])
            if isinstance(whole[key], torch.Tensor)
            else (whole[key] == resharded[key])
        ), f"3d → 2d: {key}"
    run.checkpoints.close()
    run.batches.close()


def test_every_layout_round_trips_bitwise_and_reshards(tmp_path: Path) -> None:
    run_local_group(_layouts, WORLD, str(tmp_path), _configs(tmp_path))
