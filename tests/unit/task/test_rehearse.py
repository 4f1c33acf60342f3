"""Which ranks a rehearsal runs (hpctrain.task.rehearse.roles): one per pipeline, tensor, context and expert
coordinate, at the first and last FSDP shard of the first replica, named by their coordinates."""

from __future__ import annotations

from hpctrain.config.shape import run_shape
from hpctrain.task.rehearse import roles
from tests.support.configs import typed

# The 1,024-rank plan: a GPT of Llama-3-8B's depth, width, heads, vocabulary and context, one key
# per line as a user types them.
LLAMA_8B_SHAPED = (
    "model=gpt", "model.n_layers=32", "model.d_model=4096", "model.n_heads=32", "model.vocab_size=128256",
    "model.seq_len=8192", "model.tie_embeddings=false",
)  # fmt: skip


def test_the_headline_is_rehearsed_by_a_rank_per_stage_and_tp_rank_at_both_ends_of_fsdp() -> None:
    chosen = roles(
        run_shape(typed("model=vit", "parallel=3d", "cluster=a100x32"))
    )  # pp 2 × dp_shard 8 × tp 2
    assert [r.rank for r in chosen] == [0, 1, 14, 15, 16, 17, 30, 31]
    assert str(chosen[3]) == "pp 0 · dp_shard 7 · tp 1"
    assert {(r.coordinate("pp"), r.coordinate("tp"), r.coordinate("dp_shard")) for r in chosen} == {
        (pp, tp, shard) for pp in (0, 1) for tp in (0, 1) for shard in (0, 7)
    }


def test_a_1024_rank_plan_is_64_roles() -> None:
    shape = run_shape(
        typed(
            *LLAMA_8B_SHAPED,
            "cluster=h100x64",
            "cluster.nodes=128",
            "parallel=3d",
            "parallel.pp=4",
            "parallel.tp=8",
        )
    )
    assert shape.world_size == 1024
    chosen = roles(shape)
    assert len(chosen) == 4 * 8 * 2
    assert {r.coordinate("dp_shard") for r in chosen} == {0, 31}


def test_replicas_are_not_rehearsed_twice() -> None:
    assert [r.rank for r in roles(run_shape(typed("parallel=ddp", "cluster.nproc=2")))] == [0]
    assert str(roles(run_shape(typed("parallel=ddp", "cluster.nproc=2")))[0]) == "dp_replicate 0"
    hsdp = roles(run_shape(typed("parallel=hsdp", "parallel.dp_shard=2", "cluster.nproc=4")))
    assert [r.rank for r in hsdp] == [0, 1]
    assert str(roles(run_shape(typed("parallel=none", "cluster.nproc=1")))[0]) == "the only rank"
