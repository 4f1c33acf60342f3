"""The planner's estimator (hpctrain.plan.estimate; its layout, memory and time, each from its own module):
parameters, gradients, optimizer state and activations per rank of every layout, step time, cost and the
verdict, each against numbers worked out by hand."""

from __future__ import annotations

import pytest

from hpctrain.models.builtin import model_spec
from hpctrain.models.flops import flops_per_token, param_count
from hpctrain.models.spec import ParamSpec
from hpctrain.plan import estimate as plan
from hpctrain.plan.activations import block_activation_bytes, in_flight
from hpctrain.plan.layout import layout_of, local_numel, rank_stages
from hpctrain.plan.memory import model_state_numel
from hpctrain.plan.time import pipeline_bubble
from tests.support.configs import GIB, SEVEN_B, typed


def test_gpt2_124m_parameter_count_and_model_state_bytes():
    cfg = typed("model=gpt2_124m", "parallel=none", "cluster.nproc=1")
    est = plan.estimate(cfg)
    assert est.n_params == param_count(cfg.model) == 124_475_904  # GPT-2 small, vocabulary padded to 50304
    mem = est.largest
    # 12 blocks of 16 tensors, token and position embeddings, final norm; the head is tied (no tensor).
    assert mem.param_tensors == 12 * 16 + 2 + 2
    assert mem.params == mem.grads == 4 * 124_475_904 == 497_903_616
    assert mem.optimizer == 2 * 4 * 124_475_904 + 4 * mem.param_tensors  # AdamW: 2 fp32 states + step
    sgd = plan.estimate(typed("model=gpt2_124m", "parallel=none", "cluster.nproc=1", "optim=sgd")).largest
    assert sgd.optimizer == 4 * 124_475_904  # one momentum buffer
    untied = typed("model=gpt2_124m", "parallel=none", "cluster.nproc=1", "model.tie_embeddings=false")
    assert plan.estimate(untied).n_params == 124_475_904 + 50304 * 768


def test_block_activations_follow_the_saved_tensors():
    # GPT-2 small, micro-batch 16 × 1024 tokens, fp32, no checkpointing: (8 + 2·4)·N·d elements saved per
    # block (Korthikanti et al.'s 34·s·b·h bytes at 16 bits, less dropout masks and attention scores), plus
    # 4 LayerNorm statistics of N and the attention's log-sum-exp of N·H, all fp32.
    cfg = typed("model=gpt2_124m", "parallel=none", "cluster.nproc=1")
    lay = layout_of(cfg)
    n, d, heads = 16 * 1024, 768, 12
    assert block_activation_bytes(model_spec(cfg.model), lay) == 4 * (16 * n * d + 4 * n + n * heads)
    assert block_activation_bytes(model_spec(cfg.model), lay, "full") == 4 * n * d
    selective = block_activation_bytes(model_spec(cfg.model), lay, "selective")
    assert selective == 4 * (11 * n * d + n * heads)  # input, q, k, v, attention, o, fc_in (4), fc_out
    # bf16 autocast: fp32 residual stream, 16-bit matmul outputs, a 16-bit copy of each linear's input.
    bf16 = layout_of(typed("model=gpt2_124m", "parallel=none", "cluster.nproc=1", "trainer.precision=bf16"))
    assert bf16.regime == "autocast"
    assert block_activation_bytes(model_spec(cfg.model), bf16) == 4 * 2 * n * d + 2 * 16 * n * d + 4 * (
        4 * n + n * heads
    )


def test_tensor_parallel_and_fsdp_shards():
    # TP splits q/k/v/fc_in by rows and o/fc_out by columns; LayerNorms and row-wise biases stay whole.
    cfg = typed("model=gpt2_124m", "parallel=tp", "cluster.nproc=4")
    state = model_state_numel(cfg, layout_of(cfg), 0)
    d, t = 768, 4
    block = 4 * d + 3 * (d * d + d) // t + d * d // t + d + (4 * d * d + 4 * d) // t + 4 * d * d // t + d
    assert state.param_numel == 50304 * d // t + 1024 * d + 12 * block + 2 * d
    # FSDP: torch.chunk rows of each tensor, ⌈n / 8⌉ each: rank 0 holds the most, and the shards add up.
    fsdp = typed("model=gpt2_124m", "parallel=fsdp", "cluster.nproc=8")
    lay = layout_of(fsdp)
    shards = [model_state_numel(fsdp, lay, 0, k).param_numel for k in range(8)]
    assert sum(shards) == 124_475_904 and max(shards) == shards[0]
    cls_token = ParamSpec("cls_token", (1, 1, 384))
    assert [local_numel(cls_token, 1, 2, k) for k in range(2)] == [384, 0]


def test_pipeline_schedules_in_flight_and_bubble():
    from hpctrain.parallel.pipeline import stage_ids

    assert in_flight("1f1b", 4, 0, 8, 1) == 4  # pp micro-batches on the first stage
    assert in_flight("1f1b", 4, 3, 8, 1) == 1
    assert in_flight("gpipe", 4, 3, 8, 1) == 8  # every micro-batch
    assert pipeline_bubble("1f1b", 4, 12, 1) == pytest.approx(3 / 15)
    assert pipeline_bubble("interleaved_1f1b", 4, 12, 2) == pytest.approx(1.5 / 13.5)
    for schedule, per_rank in (("1f1b", 1), ("interleaved_1f1b", 3), ("zbv_zero_bubble", 2)):
        for rank in range(4):
            assert rank_stages(schedule, rank, 4, per_rank) == stage_ids(schedule, rank, 4, per_rank)


def test_precision_offload_and_buffers():
    fsdp = plan.estimate(typed("model=gpt2_350m", "parallel=fsdp", "cluster.nproc=8")).largest
    mixed = plan.estimate(
        typed("model=gpt2_350m", "parallel=fsdp", "cluster.nproc=8", "trainer.precision=bf16")
    )
    # FSDP mixed precision: fp32 master shards and fp32 gradients, bf16 gathered blocks and activations.
    assert mixed.largest.params == fsdp.params and mixed.largest.grads == fsdp.grads
    assert mixed.largest.parts["FSDP gathered parameters"] * 2 == fsdp.parts["FSDP gathered parameters"]
    assert mixed.largest.activations < fsdp.activations
    # Autocast keeps the fp32 parameters and caches a bf16 copy of every linear's weight for the step.
    ddp = plan.estimate(typed("model=gpt2_124m", "cluster.nproc=2", "trainer.precision=bf16")).largest
    assert ddp.params == 4 * 124_475_904
    matmul = 124_475_904 - 1024 * 768 - 12 * 4 * 768 - 2 * 768  # all but positions and LayerNorms
    assert ddp.parts["autocast weight copies"] == 2 * matmul
    assert ddp.parts["DDP buckets"] == 2 * 25 * 2**20
    offload = plan.estimate(
        typed("model=gpt2_350m", "parallel=fsdp", "cluster.nproc=8", "parallel.cpu_offload=true")
    )
    assert offload.largest.params == offload.largest.grads == offload.largest.optimizer == 0
    assert offload.largest.host == fsdp.params + fsdp.grads + fsdp.optimizer


def test_step_time_and_cost():
    cfg = typed(*SEVEN_B, "parallel=3d", "model.tie_embeddings=false")
    est = plan.estimate(cfg)
    t = est.time
    assert t is not None
    tokens = 16 * 8 * 4 * 64  # micro-batch × dp × pipeline micro-batches × sequence
    assert t.flops_per_step == flops_per_token(cfg.model) * tokens
    # An fp32 run's matmuls are priced at the A100's fp32 peak (19.5 TFLOP/s), not its bf16 one.
    assert t.compute_s == pytest.approx(t.flops_per_step / 32 / (19.5e12 * 0.45))
    assert t.bubble == pytest.approx(1 / 5)  # (pp − 1)/(m + pp − 1), pp = 2, m = 4
    assert t.gpu_hours == pytest.approx(t.step_s * 300 * 32 / 3600)
    assert t.cost == pytest.approx(2.0 * t.gpu_hours)
    full = plan.estimate(
        typed(*SEVEN_B, "parallel=3d", "model.tie_embeddings=false", "parallel.activation_checkpointing=full")
    )
    assert full.time is not None and full.time.compute_s == pytest.approx(4 / 3 * t.compute_s)
    # DDP: a ring all-reduce sends 2(n − 1)/n of the gradients per rank.
    ddp = plan.estimate(typed(*SEVEN_B, "parallel=ddp"))
    assert ddp.time is not None
    (all_reduce,) = ddp.time.comms
    assert all_reduce.bytes == pytest.approx(2 * 31 / 32 * ddp.largest.grads)
    assert all_reduce.link == "InfiniBand"


def test_verdict_keeps_a_reserve_and_cpu_profiles_have_no_gpu_verdict():
    est = plan.estimate(typed(*SEVEN_B, "parallel=ddp"))
    assert est.verdict.kind == "gpu" and not est.verdict.fits
    assert est.verdict.reserve == int((2.0 + 0.05 * 80) * GIB)
    assert est.verdict.margin == 74 * GIB - est.largest.total
    assert plan.estimate(typed("cluster=slurm_test")).verdict.kind == "none"
    assert plan.estimate(typed("cluster=slurm_test", "cluster.mem=4G")).verdict.kind == "host"
    assert plan.slurm_mem_bytes("480G") == 480 * GIB and plan.slurm_mem_bytes("0") is None


def test_tied_pipeline_config_is_accepted_and_planned_with_a_copy_on_the_last_stage():
    """No refusal any more, and the planner counts the V × d weight on the first and on the last stage (each
    holds a copy): per pipeline rank as much as untied; without a pipeline, once."""
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.config.validate import validate
    from hpctrain.plan.estimate import Estimate, estimate

    def planned(*overrides: str) -> Estimate:
        cfg = to_typed(compose(["model=gpt2_124m", *overrides]))
        validate(cfg)
        return estimate(cfg)

    tied = planned("parallel=pp", "cluster.nproc=2")
    untied = planned("parallel=pp", "cluster.nproc=2", "model.tie_embeddings=false")
    assert [(r.params, r.param_tensors) for r in tied.ranks] == [
        (r.params, r.param_tensors) for r in untied.ranks
    ]
    one = planned("parallel=none", "cluster.nproc=1")
    assert one.largest.params == 4 * 124_475_904  # the tied weight once
    assert tied.n_params == one.n_params == untied.n_params - 50304 * 768  # the copy is no new parameter
