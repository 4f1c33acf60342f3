"""One estimator fed by one fact sheet (hpctrain.models.facts.ModelFacts): a declared model's parameters
counted tensor by tensor give its per-block arithmetic, a measured sheet goes through the same code, and the
planner asks the sheet, never which kind of model it plans. In-process and torch-free."""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.schema import Config
from hpctrain.config.validate import validate
from hpctrain.models.builtin import model_spec
from hpctrain.models.facts import Activations, Linear, Measured
from hpctrain.models.spec import ParamSpec
from hpctrain.plan import estimate as plan
from hpctrain.plan.layout import declared_facts, layout_of, local_numel, rank_stages
from hpctrain.plan.memory import rank_memory

PLAN = Path(plan.__file__).resolve().parent
# The estimator's modules; check.py (config × model checks: which dataset feeds a model) is not part of it.
ESTIMATOR = [p for p in sorted(PLAN.glob("*.py")) if p.name != "check.py"]


def typed(*overrides: str) -> Config:
    cfg = to_typed(compose(list(overrides)))
    validate(cfg)
    return cfg


def per_block_state(cfg: Config, pp_rank: int, shard_rank: int) -> tuple[int, int, int]:
    """(parameter elements, gradient elements, tensors) of a rank as the per-block arithmetic counts them:
    the root's tensors plus the rank's blocks × one block's, the embedding's gradient whole under TP
    without FSDP (unless tied on one stage)."""
    spec = model_spec(cfg.model)
    lay = layout_of(cfg)
    d = lay.degrees
    stages = rank_stages(cfg.parallel.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    root: list[ParamSpec] = []
    if 0 in stages:
        root += spec.input_params()
    if lay.n_stages - 1 in stages:
        root += spec.output_params()
        if lay.n_stages > 1:
            root += spec.output_copies()
    block = spec.block_param_specs()
    n_blocks = len(stages) * (spec.n_layers // lay.n_stages)
    shards = d.dp_shard if lay.sharded else 1

    def numel(specs: list[ParamSpec] | tuple[ParamSpec, ...]) -> int:
        return sum(local_numel(s, d.tp, shards, shard_rank) for s in specs)

    params = numel(root) + n_blocks * numel(block)
    grads = params
    lookup = [s for s in root if s.vocab_lookup]
    if d.tp > 1 and not lay.sharded and lookup and not (spec.tied_embeddings and lay.n_stages == 1):
        grads += math.prod(lookup[0].shape) - local_numel(lookup[0], d.tp, 1, 0)
    return params, grads, len(root) + n_blocks * len(block)


LAYOUTS = [
    ["parallel=none", "cluster.nproc=1"],
    ["parallel=ddp", "cluster.nproc=4"],
    ["parallel=fsdp", "cluster.nproc=8"],
    ["parallel=tp", "cluster.nproc=4"],
    ["parallel=2d", "cluster.nproc=8"],
    ["parallel=pp", "cluster.nproc=4", "parallel.schedule=interleaved_1f1b", "parallel.microbatches=8"],
    ["parallel=pp", "cluster.nproc=2", "parallel.schedule=zbv_zero_bubble"],
    ["parallel=3d", "cluster.nproc=8"],
]
MODELS = [
    ["model=gpt2_124m"],
    ["model=gpt2_124m", "model.tie_embeddings=false"],
    ["model=vit_b16"],
]


@pytest.mark.parametrize("model", MODELS, ids=["gpt2-tied", "gpt2-untied", "vit-b16"])
def test_the_declared_sheet_counts_what_the_per_block_arithmetic_counts(model: list[str]):
    for layout in LAYOUTS:
        cfg = typed(*model, *layout)
        lay = layout_of(cfg)
        for r in range(lay.degrees.pp):
            for k in range(lay.degrees.dp_shard if lay.sharded else 1):
                state = plan.model_state_numel(cfg, lay, r, k)
                assert (state.param_numel, state.grad_numel, state.tensors) == per_block_state(cfg, r, k)
            mem = rank_memory(cfg, lay, r)
            params, grads, _ = per_block_state(cfg, r, 0)
            assert (mem.params, mem.grads) == (4 * params, 4 * grads)  # fp32, FSDP's first shard
            assert mem.blocks == len(mem.stages) * (model_spec(cfg.model).n_layers // lay.n_stages)


def as_measured(facts, line: Linear, regime: str = "fp32"):
    """The same parameters with a measured activation source instead of the declared shapes."""
    lines = (Activations(regime, saved=line, checkpointed=line, recompute=line, output=Linear(0.0, 64.0)),)
    return replace(facts, activations=Measured((2, 4), lines), flops_per_token=None, matrix_width=None)


@pytest.mark.parametrize(
    "layout",
    [
        ["parallel=ddp", "cluster.nproc=4", "parallel.gradient_as_bucket_view=false"],
        ["parallel=ddp", "cluster.nproc=4", "parallel.compression=powersgd"],
        ["parallel=fsdp", "cluster.nproc=8"],
        ["parallel=fsdp", "cluster.nproc=8", "parallel.reshard_after_forward=false"],
        ["parallel=fsdp", "cluster.nproc=4", "parallel.cpu_offload=true"],
        ["parallel=hsdp", "cluster.nproc=8", "optim=sgd"],
    ],
    ids=["ddp-buckets", "ddp-powersgd", "zero3", "zero2", "offload", "hsdp-sgd"],
)
def test_a_measured_sheet_goes_through_the_same_estimator(layout: list[str]):
    """Model state and the strategies' buffers come from the parameters alone: a declared sheet and the same
    parameters with measured activations give the same bytes; only the activations' parts differ."""
    cfg = typed("model=gpt2_124m", "cluster=a100x32", *layout)
    cfg = replace(cfg, cluster=replace(cfg.cluster, nodes=1, tasks_per_node=cfg.cluster.nproc))
    declared = plan.estimate(cfg)
    line = Linear(1000.0, 10.0)
    measured = plan.estimate(cfg, as_measured(declared.facts, line))
    a, b = declared.largest, measured.largest
    for key in ("param_numel", "param_tensors", "params", "grads", "optimizer", "host", "blocks"):
        assert getattr(a, key) == getattr(b, key), key
    shared = ("DDP buckets", "compression error feedback", "FSDP gathered parameters", "FSDP reduce-scatter")
    assert {k: a.parts[k] for k in shared if k in a.parts} == {k: b.parts[k] for k in shared if k in b.parts}
    assert b.parts["saved for backward"] == line.at(cfg.trainer.micro_batch_size)
    assert "blocks" in a.parts and "blocks" not in b.parts
    assert measured.n_params == declared.n_params
    assert declared.time is not None and measured.time is not None
    # The same data-parallel traffic, except PowerSGD's share, counted per tensor when measured.
    comms = {c.name: c.bytes for c in declared.time.comms}
    for c in measured.time.comms:
        if c.name != "DDP all-reduce" or "powersgd" not in layout[-1]:
            assert c.bytes == comms[c.name], c.name


def test_the_built_in_estimate_uses_the_declared_sheet():
    cfg = typed("model=gpt2_350m", "parallel=3d", "cluster=a100x32")
    est = plan.estimate(cfg)
    assert est.facts is declared_facts(cfg) and est.measured is None
    assert est.n_params == model_spec(cfg.model).param_count()


def _compares_a_modality(tree: ast.AST) -> list[int]:
    kinds = {"tokens", "images"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
            for v in values:
                if isinstance(v, ast.Constant) and v.value in kinds:
                    lines.append(node.lineno)
                if isinstance(v, (ast.Tuple, ast.List, ast.Set)) and any(
                    isinstance(e, ast.Constant) and e.value in kinds for e in v.elts
                ):
                    lines.append(node.lineno)
        if isinstance(node, ast.Attribute) and node.attr in ("input_kind", "vocab_size", "num_classes"):
            lines.append(node.lineno)
    return lines


def test_the_planner_asks_the_sheet_not_the_kind_of_model():
    """No comparison with an input kind, no built-in's shape field read, no model name in hpctrain/plan;
    and the guard finds one when there is."""
    found = {p.name: _compares_a_modality(ast.parse(p.read_text())) for p in ESTIMATOR}
    assert not any(found.values()), found
    assert _compares_a_modality(ast.parse('if spec.input_kind == "tokens": pass'))
    assert _compares_a_modality(ast.parse('x = kind in ("images", "other")'))
    names = {"gpt", "vit", "GPT", "ViT", "GPTSpec", "ViTSpec", "hpctrain.models.gpt.GPT"}
    for p in ESTIMATOR:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, (p.name, node.value)
            if isinstance(node, (ast.Name, ast.Attribute)):
                assert getattr(node, "id", getattr(node, "attr", None)) not in names, p.name
    assert not (PLAN / "user.py").exists()
