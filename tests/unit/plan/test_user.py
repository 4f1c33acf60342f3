"""The planner on a measured model (hpctrain.plan.user, from hpctrain.models.facts): a fact sheet written by
hand gives the memory and PowerSGD share worked out by hand, and its measured activations scale linearly."""

from __future__ import annotations

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.validate import validate
from hpctrain.models.facts import Activations, Linear, MeasuredModel, ParamFact
from hpctrain.plan.layout import layout_of
from hpctrain.plan.user import applied_ac, powersgd_share, user_rank_memory

# Two blocks (FSDP units 0 and 1) of a 4 × 6 matrix and a bias of 4, and a root embedding of 10 × 4.
FACTS = MeasuredModel(
    target="mine.Net",
    params=(
        ParamFact("embed.weight", (10, 4), 4),
        ParamFact("blocks.0.w", (4, 6), 4, unit=0),
        ParamFact("blocks.0.b", (4,), 4, unit=0),
        ParamFact("blocks.1.w", (4, 6), 4, unit=1),
        ParamFact("blocks.1.b", (4,), 4, unit=1),
    ),
    buffer_bytes=12,
    blocks=2,
    input_kind="tokens",
    tokens_per_sample=8,
    samples=(2, 4),
    activations=(
        Activations(
            "fp32",
            saved=Linear.through({2: 300, 4: 500}),
            checkpointed=Linear(20.0, 10.0),
            recompute=Linear(0.0, 5.0),
        ),
    ),
)


def cfg(*overrides: str):  # type: ignore[no-untyped-def]
    c = to_typed(compose(["model=gpt", *overrides]))
    validate(c)
    return c


def test_the_fact_sheet_adds_up() -> None:
    assert FACTS.n_params == 40 + 2 * 28 and FACTS.param_bytes == 4 * 96
    assert (FACTS.unit_numel(-1), FACTS.unit_numel(0), FACTS.unit_numel(1)) == (40, 28, 28)
    assert FACTS.training_flops_per_sample() == 6.0 * 96 * 8  # 6·N per token, not measured
    line = FACTS.activations_in("autocast")  # not measured in that regime: the one that was
    assert line is not None and line.saved == Linear(100.0, 100.0) and line.saved.at(8) == 900
    assert Linear.through({2: 300, 4: 200}) == Linear(300.0, 0.0)  # neither part negative


def test_one_process_holds_the_whole_model_and_its_measured_activations() -> None:
    c = cfg("parallel=none", "cluster.nproc=1", "trainer.micro_batch_size=4")
    mem = user_rank_memory(c, layout_of(c), FACTS)
    assert (mem.param_numel, mem.params, mem.grads) == (96, 4 * 96, 4 * 96)
    assert mem.optimizer == 2 * 4 * 96 + 4 * 5  # AdamW: two fp32 states per element, a step per tensor
    assert mem.activations == FACTS.activations[0].saved.at(4) == 500
    assert mem.parts["model buffers"] == 12 and mem.blocks == 2


def test_powersgd_sends_r_times_rows_plus_columns_of_each_matrix() -> None:
    c = cfg("parallel=ddp", "cluster.nproc=2", "parallel.compression=powersgd", "parallel.powersgd_rank=1")
    # Matrices send r(a + b): 10 × 4 → 14, each 4 × 6 → 10; biases whole (4 each): (14 + 2·10 + 2·4) / 96.
    assert powersgd_share(c, FACTS) == pytest.approx(42 / 96)
    assert applied_ac(layout_of(cfg("parallel.activation_checkpointing=full")), FACTS) == "full"
    no_blocks = MeasuredModel("mine.Flat", FACTS.params, 0, 0, "tokens", 8)
    assert applied_ac(layout_of(cfg("parallel.activation_checkpointing=full")), no_blocks) == "none"
