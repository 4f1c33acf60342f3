"""Alternatives (hpctrain.plan.search): layouts that fit, ranked by step time, printed as overrides that
validate."""

from __future__ import annotations

from hpctrain.config.shape import world_size
from hpctrain.plan import estimate as plan
from hpctrain.plan.search import alternatives
from tests.support.configs import SEVEN_B, typed


def test_alternatives_fit_are_ranked_and_are_valid_overrides(monkeypatch):
    alts, tried = _counted(monkeypatch, typed(*SEVEN_B, "parallel=ddp"))
    # A dense model of short sequences: expert and context parallelism cost the search no estimate.
    assert tried and all(ep <= 1 and cp <= 1 for ep, cp in tried)
    assert len(alts) == 3
    steps = [a.estimate.time.step_s for a in alts if a.estimate.time is not None]
    assert steps == sorted(steps)
    for alt in alts:
        # The printed overrides, applied to the original command, give a config that validates and fits.
        again = typed(*SEVEN_B, "parallel=ddp", *alt.overrides)
        assert plan.estimate(again).verdict.fits, alt.overrides
        assert world_size(again) == 32


# Two runs as typed, packed as a command line reads (tables of overrides).
LONG = ["model=gpt", "model.n_layers=24", "model.d_model=2048", "model.n_heads=16", "model.seq_len=65536",
        "cluster=a100x32", "cluster.nodes=1", "parallel=fsdp", "trainer.global_batch_size=8",
        "trainer.micro_batch_size=1"]  # fmt: skip
# The mixture of experts, the same way.
MOE = ["model=gpt_moe", "model.n_layers=4", "model.d_model=256", "model.n_heads=4", "model.moe.experts=8",
       "model.moe.top_k=2", "cluster=a100x32", "cluster.nodes=1", "parallel=fsdp",
       "trainer.global_batch_size=16", "trainer.micro_batch_size=2"]  # fmt: skip


def _counted(monkeypatch, cfg) -> tuple[list, list[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    """The alternatives of ``cfg``, and the (ep, cp) of every config the search estimated."""
    from hpctrain.plan import search

    tried: list[tuple[int, int]] = []

    def counting(candidate, measured=None):  # type: ignore[no-untyped-def]
        tried.append((candidate.parallel.ep, candidate.parallel.cp))
        return plan.estimate(candidate, measured)

    monkeypatch.setattr(search, "estimate", counting)
    return alternatives(cfg, limit=3), tried


def test_a_long_sequence_whose_one_sample_does_not_fit_is_offered_context_parallelism(monkeypatch, cli):
    cfg = typed(*LONG)
    own = plan.estimate(cfg)  # one sample per micro-batch: the activations are what does not fit
    assert not own.verdict.fits and own.largest.activations > own.verdict.need - own.verdict.usable
    alts, tried = _counted(monkeypatch, cfg)
    with_cp = [a for a in alts if any(o.startswith("parallel.cp=") for o in a.overrides)]
    assert with_cp, [a.overrides for a in alts]
    for alt in with_cp:
        again = typed(*LONG, *alt.overrides)
        assert again.parallel.cp > 1 and plan.estimate(again).verdict.fits, alt.overrides
    # Tried only where one sample did not fit: fewer estimates than the search without it makes.
    assert 0 < sum(1 for _, cp in tried if cp > 1) < sum(1 for _, cp in tried if cp <= 1)
    shown = cli("plan", *LONG)  # what hpctrain plan prints: the same layout among those that fit
    assert shown.returncode == 1 and " ".join(with_cp[0].overrides) in shown.stdout, shown.stdout  # 1: no fit


def test_a_mixture_of_experts_is_offered_expert_parallelism(monkeypatch):
    alts, tried = _counted(monkeypatch, typed(*MOE))
    with_ep = [a for a in alts if any(o.startswith("parallel.ep=") for o in a.overrides)]
    assert with_ep, [a.overrides for a in alts]
    for alt in with_ep:
        again = typed(*MOE, *alt.overrides)
        assert again.parallel.ep > 1 and plan.estimate(again).verdict.fits, alt.overrides
    # One expert-parallel degree per sharded layout: at most as many estimates again.
    assert 0 < sum(1 for ep, _ in tried if ep > 1) <= sum(1 for ep, _ in tried if ep <= 1)
