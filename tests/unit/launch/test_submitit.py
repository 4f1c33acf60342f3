"""The submitit launcher (hpctrain.launch.submitit) without a cluster: the parameters a dry run prints and the
job script submitit renders from them, for the fixed config of the sbatch golden files
(tests/unit/launch/golden/submitit.*, regenerated with HPCTRAIN_UPDATE_GOLDEN=1; submitit.sbatch is
submitit's own template, so a new submitit release may change it); sbatch options without a submitit
parameter of their own. (Submission itself: tests/slurm/test_submit.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import submitit

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch.project import project_dir
from hpctrain.launch.snapshot import plan_project, project_path_entry
from hpctrain.launch.submitit import _executor, sbatch_extras, submitit_parameters
from hpctrain.plan.check import check_run
from hpctrain.rundir import RunDir
from tests.support.golden import (
    GOLDEN_CLUSTER,
    GOLDEN_RUN_DIR,
    as_golden,
    check_golden,
    golden_project,
)


def test_the_dry_run_parameters_and_submitits_script_match_their_golden_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    project = golden_project(tmp_path, monkeypatch)
    cfg = to_typed(compose(GOLDEN_CLUSTER))
    check_run(cfg)
    plan = plan_project(project_dir(), cfg.cluster.snapshot_paths)
    # What the dry run prints (SubmititLauncher.launch with dry_run=true).
    params = submitit_parameters(
        cfg.cluster, RunDir(GOLDEN_RUN_DIR).code, project_path_entry(plan, GOLDEN_RUN_DIR), project_dir()
    )
    check_golden("submitit.json", as_golden(json.dumps(params, indent=1) + "\n", project))
    assert "not-written" not in json.dumps(params)  # a secret cluster.env value stays in the environment
    # The script submitit writes for that job: the launcher's own executor, rendered as submit() would
    # render it (submitit wants srun on PATH, as on a login node; nothing is submitted).
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    executor = _executor(cfg.cluster, RunDir(GOLDEN_RUN_DIR).slurm, GOLDEN_RUN_DIR, plan)
    script = executor._make_submission_file_text(executor._submitit_command_str, "golden")
    check_golden("submitit.sbatch", as_golden(script, project))
    assert "not-written" not in script


def test_options_without_a_submitit_parameter_go_to_sbatch_as_typed():
    cluster = to_typed(
        compose(
            [
                "cluster=slurm_test",
                "cluster.reservation=maint",
                "cluster.time_min=0:20:30",
                "cluster.additional.comment=x",
                "cluster.additional.overcommit=true",
                "cluster.additional.hold=false",
            ]
        )
    ).cluster
    assert sbatch_extras(cluster) == {
        "requeue": True,
        "signal": f"{cluster.signal}@{cluster.signal_lead_s}",
        "reservation": "maint",
        "time-min": 21,  # minutes, seconds rounded up as Slurm does
        "comment": "x",
        "overcommit": True,
    }
