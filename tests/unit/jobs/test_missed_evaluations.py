"""trainer.eval_job (issue 41, item 5): an evaluation that will never give its result is a line of
``hpctrain status``, never silence; and ``hpctrain eval`` in an evaluation job releases its checkpoint's pin
however it ends. No Slurm: the job states are what the test says."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.errors import ConfigError
from hpctrain.jobs import status as status_module
from hpctrain.jobs.targets import Target
from hpctrain.rundir import RunDir
from hpctrain.slurm import commands
from hpctrain.slurm.commands import JobState


def test_status_names_each_evaluation_that_will_not_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir(tmp_path)
    run.write_config_text("trainer:\n  max_steps: 20\n")
    run.append_eval({"step": 15, "val_loss": 1.5, "time": 1.0})
    run.write_eval_pin(5, "123")  # never read, its job gone
    run.write_eval_pin(10, "124", released="failed: --step=10: no committed checkpoint of that step")
    run.write_eval_pin(15, "125", released="read")  # evaluated: in eval.jsonl
    run.write_eval_pin(20, "126")  # still in the queue: not missing (yet)
    states = {"123": "TIMEOUT", "126": "PENDING"}
    monkeypatch.setattr(
        commands,
        "job_states",
        lambda ids: {j: JobState(j, states[j], "", "", "") for j in ids if j in states},
    )
    report = status_module.status(Target(text=str(tmp_path), run_dir=tmp_path))
    missing = [line for line in report.lines if "missing" in line]
    assert missing == [
        "missing   evaluation of step 5 (job 123) missing: the job ended TIMEOUT before reading its "
        "checkpoint",
        "missing   evaluation of step 10 (job 124) missing: failed: --step=10: no committed checkpoint of "
        "that step",
    ], report.lines


def test_an_evaluation_job_releases_its_pin_however_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir(tmp_path)
    run.write_eval_pin(5, "123")
    run.write_eval_pin(10, None)  # its job started before the training job's sbatch call returned
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv(commands.EVAL_STEP_ENV, "5")

    def refused(run_dir: Path, step: int | None, overrides: list[str]) -> dict[str, object]:
        raise ConfigError("--step", str(step), "no committed checkpoint of that step", valid="15, 10")

    import hpctrain.task.evaluate as evaluate

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", refused)
    assert main(["eval", str(tmp_path), "--step", "5"]) == 2
    assert run.read_eval_pins()[5]["released"].startswith("failed: --step=5: no committed checkpoint"), (
        run.read_eval_pins()
    )

    record = {"step": 10, "val_loss": 1.0, "eval_s": 0.1}
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda run_dir, step, overrides: record)
    monkeypatch.setenv("SLURM_JOB_ID", "130")
    monkeypatch.setenv(commands.EVAL_STEP_ENV, "10")
    assert main(["eval", str(tmp_path), "--step", "10"]) == 0
    assert run.read_eval_pins()[10] | {"time": 0} == {
        "step": 10,
        "job_id": "130",
        "time": 0,
        "released": "read",
    }

    run.write_eval_pin(15, "140")
    monkeypatch.delenv(commands.EVAL_STEP_ENV)  # someone's own hpctrain eval: the job's pin stays
    assert main(["eval", str(tmp_path), "--step", "15"]) == 0
    assert run.read_eval_pins()[15]["released"] is None
