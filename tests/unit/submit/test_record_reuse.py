"""Issue 41, in this process: a sweep's name reused with other values, an Optuna sweep rerun with another
search space, a trial that differs from the member it would continue, and a run directory inside a checkpoint
are refused in one line before anything is written (hpctrain.submit.existing); a typed secret reaches Hydra
only as ``${oc.env:NAME}`` (hpctrain.config.redact). Sweep and run directories are written by hand as real
ones leave them; tests/e2e/submit/test_run_record.py runs real ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hpctrain.errors import ConfigError
from tests.support import CLI
from tests.support.runs import local_run, steps


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_grid_sweep_name_reused_with_other_values_is_refused(cli: CLI, tmp_path: Path) -> None:
    """A sweep as Hydra's grid left it (multirun.yaml holds the command's overrides, members 0 and 1): the
    same name with other learning rates is refused naming them and the two ways on; nothing rewritten."""
    sweep = tmp_path / "multirun" / "lrs"
    typed = ["optim.lr=1e-3,3e-4", "trainer.max_steps=150", "run=lrs"]
    for i, lr in enumerate(("0.001", "0.0003")):
        local_run(sweep / str(i), [f"optim.lr={lr}", "trainer.max_steps=150", "run=lrs"], steps(150))
    record = {"hydra": {"mode": "MULTIRUN", "overrides": {"task": typed}}}
    (sweep / "multirun.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(record)))
    before = _files(sweep)

    result = cli("-m", "optim.lr=1e-2,3e-3", "trainer.max_steps=150", "run=lrs", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = _one_line(result.stderr)
    assert line.startswith(f"hpctrain: run=lrs: sweep {sweep} was run with other values"), line
    assert "(optim.lr 1e-3,3e-4 → 1e-2,3e-3)" in line, line
    assert "a new run=NAME" in line, line
    own = "python -m hpctrain -m optim.lr=1e-3,3e-4 trainer.max_steps=150 run=lrs"
    assert f"continue it: {own})" in line, line
    assert "Traceback" not in result.stderr and _files(sweep) == before


def test_an_optuna_sweep_rerun_with_another_search_space_is_refused(cli: CLI, tmp_path: Path) -> None:
    """An Optuna sweep (no multirun.yaml: sweep.json records its command): another interval is refused
    before a trial runs; sweep.json and the sweeper's results are untouched."""
    sweep = tmp_path / "multirun" / "opt"
    command = [
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=1",
        "optim.lr=interval(0.0001,0.01)",
        "trainer.max_steps=2",
        "run=opt",
    ]
    local_run(sweep / "0", ["optim.lr=0.0021", "trainer.max_steps=2", "run=opt"], steps(2))
    member = {"index": 0, "overrides": ["optim.lr=0.0021"], "run_dir": str(sweep / "0"), "job_id": "local:0"}
    sweep_json = {"array_job_id": "local", "cluster": "local", "members": [member], "command": command}
    (sweep / "sweep.json").write_text(json.dumps(sweep_json))
    (sweep / "optimization_results.yaml").write_text("best_value: 5.0\n")
    before = _files(sweep)

    changed = [c.replace("interval(0.0001,0.01)", "interval(0.001,0.1)") for c in command]
    result = cli("-m", *changed, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = _one_line(result.stderr)
    assert "optim.lr interval(0.0001,0.01) → interval(0.001,0.1)" in line, line
    assert "python -m hpctrain -m hydra/sweeper=optuna" in line and "a new run=NAME" in line, line
    assert _files(sweep) == before


def test_a_trial_that_differs_from_the_member_it_would_continue_is_refused(tmp_path: Path) -> None:
    """The same Optuna command without a seed samples other trials: trial 0's value is never honoured on
    member 0's weights (the task refuses it before writing anything); the same trial continues it."""
    from hpctrain.submit.existing import check_member_reuse

    sweep = tmp_path / "opt"
    local_run(sweep / "0", ["optim.lr=0.0021", "trainer.max_steps=2", "run=opt"], steps(2))
    check_member_reuse(sweep / "0", sweep, ["optim.lr=0.0021", "trainer.max_steps=2", "run=opt"], "opt")
    with pytest.raises(ConfigError) as refused:
        check_member_reuse(sweep / "0", sweep, ["optim.lr=0.0077", "trainer.max_steps=2", "run=opt"], "opt")
    assert "holds member 0, trained with other values (optim.lr 0.0021 → 0.0077)" in str(refused.value)


INSIDE = ["checkpoints/step_00000004", "checkpoints", "checkpoints/step_00000004/x"]


@pytest.mark.parametrize("inside", INSIDE)
def test_a_run_directory_inside_a_checkpoint_is_refused_before_anything_is_written(
    cli: CLI, tmp_path: Path, inside: str
) -> None:
    run = local_run(tmp_path / "other", ["trainer.max_steps=4"], steps(4))
    checkpoint = run / "checkpoints" / "step_00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "manifest.json").write_text(json.dumps({"step": 4}))
    (checkpoint / ".metadata").write_bytes(b"dcp")
    (checkpoint / "config.yaml").write_bytes((run / "config.yaml").read_bytes())
    before, paths = _files(tmp_path), sorted(tmp_path.rglob("*"))

    result = cli("trainer.max_steps=8", f"hydra.run.dir={run / inside}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = _one_line(result.stderr)
    assert line.startswith(f"hpctrain: hydra.run.dir={run / inside}:"), line
    assert "only the checkpoint manager" in line, line
    assert _files(tmp_path) == before and sorted(tmp_path.rglob("*")) == paths  # no file, no folder


def test_a_secret_is_the_name_of_its_key_and_never_reaches_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.config.redact import is_secret, secret_overrides

    secret = [
        "DB_PASSWD",
        "WANDB_API_KEY",
        "my_pass",
        "PWD",
        "ghToken",
        "AWS_SECRET_ACCESS_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "DB_PASSWORD_FILE",
    ]
    plain = ["MONKEY", "TOKENIZERS_PARALLELISM", "PASSAGE", "KEYBOARD", "HOME", "NCCL_IB_HCA"]
    assert [n for n in secret if not is_secret(n)] == [] and [n for n in plain if is_secret(n)] == []
    monkeypatch.delenv("DB_PASSWD", raising=False)
    typed = ["+cluster.env.DB_PASSWD='p@ss w0rd'", "++cluster.env.PLAIN=x", "optim.lr=1e-3"]
    assert secret_overrides(typed) == ["+cluster.env.DB_PASSWD=${oc.env:DB_PASSWD}", *typed[1:]]
    assert os.environ["DB_PASSWD"] == "p@ss w0rd"
    with pytest.raises(ConfigError, match=r"cluster.env.API_TOKEN=\*\*\*: a secret cannot be swept"):
        secret_overrides(["+cluster.env.API_TOKEN=a,b"])
