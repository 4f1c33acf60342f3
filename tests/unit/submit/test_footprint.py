"""The planner on users' models (examples/user_project, copied and run from its folder; tests/conftest.py's
``project``): parameters read on the meta device, activations measured on the CPU
(hpctrain.submit.footprint); the built-in plan and its check import no torch (a fresh interpreter)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.config.compose import compose, to_typed, user_config_dirs
from hpctrain.config.schema import Config
from hpctrain.plan.check import check_run
from hpctrain.plan.estimate import estimate
from hpctrain.plan.text import activation_line
from hpctrain.submit.footprint import _saved_bytes, measure_model
from hpctrain.submit.probe import build_model, first_batches
from hpctrain.train.loss import build_objective
from tests.support import CLI, REPO

CNN = ["model=cnn", "data=digits8"]
GPT2 = ["model=gpt2_tiny", "data=bytes", "data.max_bytes=20000"]


def user_cfg(*overrides: str) -> Config:
    cfg = to_typed(compose(list(overrides), user_config_dirs("conf")))
    check_run(cfg)
    return cfg


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        (CNN, "verdict   none: no GPU"),
        ([*GPT2, "cluster=a100x32", "trainer.precision=bf16"], "verdict   FITS"),
    ],
    ids=["cnn-local", "gpt2-a100"],
)
def test_plan_reads_the_user_models_parameters_and_measures_activations(
    cli: CLI, in_project: Path, args: list[str], verdict: str
):
    result = cli("plan", "--config-dir", "conf", *args, cwd=in_project)
    assert result.returncode == 0, result.stderr
    found = re.search(r"([\d,]+) parameters read on the meta device", result.stdout)
    assert found, result.stdout
    real = build_model(user_cfg(*args), "cpu")
    assert int(found.group(1).replace(",", "")) == sum(p.numel() for p in real.parameters())
    lines = result.stdout.splitlines()
    measured = [line for line in lines if line.startswith("activations  measured")]
    assert len(measured) == 1 and "2 and 4 samples on CPU" in measured[0], result.stdout
    assert any(line.startswith(verdict) for line in lines), result.stdout
    assert "activations      measured, micro-batch" in result.stdout


def test_dry_run_plans_a_user_model_before_a_gpu_submission(cli: CLI, in_project: Path, tmp_path: Path):
    result = cli(
        "--config-dir",
        "conf",
        *CNN,
        "cluster=a100x32",
        "dry_run=true",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=in_project,
    )
    assert result.returncode == 0, result.stderr
    plan = [line for line in result.stdout.splitlines() if line.startswith("plan: fits:")]
    assert len(plan) == 1, result.stdout
    assert "parameters read on the meta device, activations measured on CPU" in plan[0]
    assert "no memory estimate" not in result.stderr


def test_a_user_model_that_cannot_be_built_is_one_line(cli: CLI, in_project: Path):
    result = cli("plan", "--config-dir", "conf", *CNN, "model._target_=mynets.bad.raising", cwd=in_project)
    assert result.returncode == 2, result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "hpctrain: model._target_=mynets.bad.raising: raised ValueError: width must be even"
    )
    assert "Traceback (most recent call last)" not in result.stderr  # no hpctrain traceback
    assert (
        "/hpctrain/" not in result.stderr
    )  # the user's own frames only (tests/unit/submit/test_probe.py shows them)


def test_the_built_in_plan_and_its_check_stay_torch_free(tmp_path: Path):
    code = (
        "import sys; from hpctrain.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported on the submit path'; sys.exit(rc)"
    )
    for args in (
        ["plan", "model=gpt", "cluster=a100x32"],
        ["model=gpt", "cluster=a100x32", "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"],
        ["model=gpt", "dry_run=true", f"hydra.run.dir={tmp_path / 'local'}"],  # check_fits_here
    ):
        checked = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120
        )
        assert checked.returncode == 0, (args, checked.stderr[-2000:])


@pytest.mark.parametrize("args", [CNN, GPT2], ids=["cnn", "gpt2"])
def test_measured_activations_scale_to_a_larger_batch(in_project: Path, args: list[str]):
    """The line fitted through 2 and 4 samples, at 8, against the saved-tensor bytes of 8 samples."""
    cfg = user_cfg(*args)
    facts = measure_model(cfg)
    assert facts.measured is not None and not facts.measured.note and facts.measured.samples == (2, 4)
    acts = facts.activations_in("fp32")
    model = build_model(cfg, "cpu")
    blocks = []
    (batch,) = first_batches(cfg, [8])
    sizes, _ = _saved_bytes(model, blocks, build_objective(cfg.loss, cfg.data), batch, "fp32", backward=False)
    assert acts.saved.at(8) == pytest.approx(sizes["saved"], rel=0.10)
    assert acts.saved.per_sample > 0


@pytest.mark.parametrize(
    "args",
    [
        ["model=gpt", "trainer.precision=fp32", "parallel=none", "cluster.nproc=1"],
        ["model=gpt", "trainer.precision=bf16", "parallel=ddp"],
        ["model=vit", "data=digits", "parallel=fsdp", "parallel.activation_checkpointing=full"],
    ],
    ids=["gpt-fp32", "gpt-bf16-ddp", "vit-fsdp-full"],
)
def test_measuring_a_built_in_model_agrees_with_its_declared_shapes(args: list[str]):
    """A built-in measured as a user's model would be: the same parameters, and memory within 5% of the
    estimate from its declared shapes (which verify.plan_measure checks against real GPU tensors)."""
    cfg = to_typed(compose(args))
    check_run(cfg)
    declared = estimate(cfg)
    measured = estimate(cfg, measure_model(cfg))
    assert measured.n_params == declared.n_params
    assert measured.largest.params == declared.largest.params
    assert measured.largest.optimizer == declared.largest.optimizer
    assert measured.largest.total == pytest.approx(declared.largest.total, rel=0.05)
    assert measured.largest.activations == pytest.approx(declared.largest.activations, rel=0.05)
    assert torch.get_default_dtype() == torch.float32  # the measurement leaves the process as it was


def test_a_model_too_large_to_build_on_cpu_is_planned_without_activations(
    in_project: Path, monkeypatch: pytest.MonkeyPatch
):
    from hpctrain.plan.text import activation_line
    from hpctrain.submit import footprint

    monkeypatch.setattr(footprint, "MEASURE_LIMIT", 1000)
    cfg = user_cfg(*CNN)
    facts = measure_model(cfg)
    m = facts.measured
    assert facts.n_params == 10858 and m is not None and m.note.startswith("not measured") and not m.lines
    est = estimate(cfg, facts)
    assert est.largest.activations == 0 and est.largest.params == 4 * 10858
    line = activation_line(est)
    assert line is not None and "not measured" in line and "counts none" in line


def test_a_user_model_under_tp_and_pp_is_split_as_its_plan_and_split_say(in_project: Path):
    """Parameters per rank under tensor parallelism (the plan's column/row splits) and a pipeline (the
    stages hpctrain.parallel.stages cuts), against the real model's tensors."""
    from hpctrain.parallel.stages import pipeline_split, sequential_stage

    mixer = ["model=mixer", "data=bytes", "data.max_bytes=20000", "cluster.nproc=2"]
    plan = "parallel.tp_plan={blocks.*.up: colwise, blocks.*.down: rowwise}"
    cfg = user_cfg(*mixer, "parallel=tp", plan)
    est = estimate(cfg, measure_model(cfg))
    model = build_model(cfg, "cpu")
    split = {n for n, _ in model.named_parameters() if ".up." in n or n.endswith("down.weight")}
    per_rank = sum(p.numel() // (2 if n in split else 1) for n, p in model.named_parameters())
    assert est.largest.params == 4 * per_rank
    assert "split over tp/pp approximately" in (activation_line(est) or "")

    cfg = user_cfg(*mixer, "parallel=pp")
    est = estimate(cfg, measure_model(cfg))
    found = pipeline_split(model)
    assert found is not None
    stages = [sequential_stage(model, found[0], s, 2) for s in range(2)]
    assert [m.param_numel for m in est.ranks] == [sum(p.numel() for p in s.parameters()) for s in stages]
    assert est.n_params == sum(p.numel() for p in model.parameters())


def test_a_users_gpt2_with_lora_under_tp_is_planned_as_it_trains(in_project: Path):
    """The measured sheet of GPT-2 with LoRA: the base frozen (no gradient, no optimizer state), the
    adapters trained; its Conv1D projections ([in, out] weights) split on their own dimensions by the
    tensor-parallel plan, the adapters as hpctrain.parallel.tp splits them."""
    plan = "parallel.tp_plan={transformer.h.*.mlp.c_fc: colwise, transformer.h.*.mlp.c_proj: rowwise}"
    cfg = user_cfg(
        *GPT2,
        "model.adapters=lora",
        "model.lora.rank=4",
        "model.lora.targets=[c_attn,c_fc]",
        "parallel=tp",
        "cluster.nproc=2",
        plan,
    )
    facts = measure_model(cfg)
    by_name = {q.name: q for q in facts.params}
    adapters = [q for q in facts.params if ".lora_" in q.name]
    assert facts.n_trainable == sum(q.numel for q in adapters) > 0
    assert all(q.trainable == (".lora_" in q.name) for q in facts.params)
    mlp = "transformer.h.0.mlp"
    assert (by_name[f"{mlp}.c_fc.weight"].tp_dim, by_name[f"{mlp}.c_fc.bias"].tp_dim) == (1, 0)
    assert (by_name[f"{mlp}.c_proj.weight"].tp_dim, by_name[f"{mlp}.c_proj.bias"].tp_dim) == (0, None)
    assert (by_name[f"{mlp}.c_fc.lora_A.weight"].tp_dim, by_name[f"{mlp}.c_fc.lora_B.weight"].tp_dim) == (
        None,
        0,
    )
    assert by_name["transformer.h.0.attn.c_attn.lora_B.weight"].tp_dim is None
