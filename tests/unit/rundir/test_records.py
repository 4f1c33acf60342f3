"""What launchers and ranks record in a run directory (hpctrain.rundir.records): job and sweep records that
read back as written, error records of failed ranks, and the first error that is a cause rather than a peer's
symptom."""

from __future__ import annotations

from pathlib import Path

from hpctrain.rundir import JOB_RECORD, SWEEP_RECORD, RunDir
from hpctrain.rundir.records import (
    JobRecord,
    SweepMember,
    SweepRecord,
    error_last_line,
    first_error,
    read_error_file,
    read_error_record,
    read_job,
    read_sweep,
    split_overrides,
    write_error_record,
    write_json,
)


def test_job_and_sweep_records_read_back_as_written(tmp_path: Path) -> None:
    assert read_job(tmp_path) is None and read_sweep(tmp_path) is None
    job = JobRecord("77", "sbatch", "slurm_test", 2, 2, f"{tmp_path}/slurm/%j.out", submitted_at=1.5)
    write_json(tmp_path / JOB_RECORD, job)
    assert read_job(tmp_path) == job
    members = [
        SweepMember(i, [f"optim.lr={lr}"], str(tmp_path / str(i)), f"78_{i}") for i, lr in enumerate((1, 2))
    ]
    sweep = SweepRecord("78", "slurm_test", members, submitted_at=2.5)
    write_json(tmp_path / SWEEP_RECORD, sweep)
    assert read_sweep(tmp_path) == sweep
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([JOB_RECORD, SWEEP_RECORD])  # no temporaries


def test_the_first_error_is_a_cause_not_a_peers_symptom(tmp_path: Path) -> None:
    assert first_error(tmp_path) is None
    write_error_record(tmp_path, 0, "RuntimeError", "Connection closed by peer [10.0.0.2]:1234")
    write_error_record(tmp_path, 3, "ValueError", "bad batch", trace="Traceback ...\nValueError: bad batch\n")
    write_error_record(tmp_path, 2, "RuntimeError", "Connection refused")
    rank, record = first_error(tmp_path) or (None, {})
    assert (
        rank == 3 and record["message"] == "bad batch" and error_last_line(record) == "ValueError: bad batch"
    )
    assert read_error_file(tmp_path, 0) == "RuntimeError: Connection closed by peer [10.0.0.2]:1234"
    assert read_error_record(tmp_path, 1) is None
    # Only peers' symptoms: the lowest rank's is shown.
    only_peers = tmp_path / "peers"
    write_error_record(only_peers, 2, "RuntimeError", "Connection refused")
    write_error_record(only_peers, 1, "RuntimeError", "Socket Timeout")
    assert (first_error(only_peers) or (None,))[0] == 1


def test_a_record_of_another_shape_is_no_error_record(tmp_path: Path) -> None:
    write_error_record(tmp_path, 0, "RuntimeError", "x")
    error = RunDir(tmp_path).error_file(0)
    for text in ("[1, 2]", "{", '{"rank": 0}'):
        error.write_text(text)
        assert read_error_record(tmp_path, 0) is None


def test_sweep_overrides_split_into_common_and_own() -> None:
    members = [
        SweepMember(0, ["trainer.max_steps=5", "optim.lr=0.1"], "a", "1_0"),
        SweepMember(1, ["trainer.max_steps=5", "optim.lr=0.2"], "b", "1_1"),
    ]
    assert split_overrides(members) == (["trainer.max_steps=5"], [["optim.lr=0.1"], ["optim.lr=0.2"]])
    assert split_overrides(members[:1]) == ([], [["trainer.max_steps=5", "optim.lr=0.1"]])


def test_a_slurm_submissions_kept_recipe_is_put_back_and_nothing_else(tmp_path: Path) -> None:
    """Issue 41, item 2 under Slurm: the submitting command has ended when the job's ranks refuse the
    checkpoint; rank 0 puts back the recipe (config.yaml, .hydra/) the submission kept, so that `hpctrain
    resume` replays what last trained. A crafted file writes nothing outside those files."""
    from hpctrain.rundir import RECORD_BEFORE

    run = RunDir(tmp_path)
    run.config.write_text("trained: 1\n")
    run.hydra.mkdir()
    run.hydra_overrides.write_text("- trained=1\n")
    before = run.snapshot_record()
    run.save_record(before)
    run.config.write_text("refused: 3\n")
    (run.hydra / "hydra.yaml").write_text("new: file\n")  # absent before: removed again
    run.hydra_overrides.write_text("- model.n_layers=3\n")
    assert run.restore_saved_record()
    assert run.config.read_text() == "trained: 1\n" and run.hydra_overrides.read_text() == "- trained=1\n"
    assert not (run.hydra / "hydra.yaml").exists() and not (tmp_path / RECORD_BEFORE).exists()
    assert not run.restore_saved_record()  # once
    for crafted in ('{"../outside": "x", "checkpoints/a": "y", "config.yaml": 3}', "[1]", "{", ""):
        (tmp_path / RECORD_BEFORE).write_text(crafted)
        run.restore_saved_record()
        assert run.config.read_text() == "trained: 1\n"
        assert not (tmp_path.parent / "outside").exists() and not (tmp_path / "checkpoints").exists()
