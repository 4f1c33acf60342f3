"""hpctrain's 2-rank DDP ends with the same weights as a minimal hand-written torch DDP loop.

The reference (bench/reference_ddp.py) is what a researcher would write by hand. Both runs make the same
floating-point operations in the same order (2 ranks: the gradient all-reduce is one commutative addition
per element), so the weights must be bitwise equal.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from reference_ddp import reference_worker  # bench/, on sys.path by tests/conftest.py

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch.local import free_port
from hpctrain.verify.local_group import start_ranks
from hpctrain.weights.load import read_checkpoint_model
from tests.support import FAST, hpctrain

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


def test_ddp_matches_a_hand_written_torch_loop_bitwise(tmp_path: Path):
    run = tmp_path / "run"
    result = hpctrain(*OVERRIDES, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr

    reference_file = tmp_path / "reference.pt"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start_ranks(reference_worker, 2, 2, free_port("127.0.0.1"), OVERRIDES, str(reference_file), 1)
    reference = torch.load(reference_file)["weights"]

    ours = read_checkpoint_model(run / "checkpoints" / f"step_{STEPS:08d}")
    # The checkpoint holds the tied LM head once, as tok_emb.weight (the reference's state dict lists both).
    assert set(reference) - set(ours) == {"head.weight"} and set(ours) <= set(reference)
    assert torch.equal(reference.pop("head.weight"), reference["tok_emb.weight"])
    assert ours.keys() == reference.keys()
    differing = {
        k: (ours[k] - reference[k]).abs().max().item() for k in ours if not torch.equal(ours[k], reference[k])
    }
    assert not differing, f"weights differ from the hand-written loop: {differing}"
    # And training did something: the weights moved away from their initial values.
    torch.manual_seed(to_typed(compose(OVERRIDES)).trainer.seed)
    from hpctrain.models import build_model

    initial = build_model(to_typed(compose(OVERRIDES)).model).state_dict()
    assert not torch.equal(initial["layers.0.attn.q.weight"], ours["layers.0.attn.q.weight"])
