"""The ``checkpoint`` group's bad inputs: each is one line on stderr naming key, value and what is valid,
exit status 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            "checkpoint.local_every=0",
            "checkpoint.local_every=0: must be ≥ 1 (steps between fast-tier copies)",
        ),
        ("checkpoint.local_every=-3", "checkpoint.local_every=-3: must be ≥ 1"),
        ("checkpoint.local_path=shm/here", "checkpoint.local_path=shm/here: must be an absolute path"),
        ("checkpoint.local_path=", "checkpoint.local_path=: must be an absolute path"),
        ("checkpoint.local_path=/proc", "checkpoint.local_path=/proc: not writable"),
        (
            "checkpoint.on_writer_failure=maybe",
            "checkpoint.on_writer_failure=maybe: not a known choice (valid: warn, stop)",
        ),
    ],
)
def test_a_bad_fast_tier_setting_is_one_line(
    override: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = [] if "local_every" in override else ["checkpoint.local_every=5"]
    assert main(["--cfg", "job", override, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"hpctrain: {says}"), err


def test_a_fast_tier_path_that_is_a_file_or_holds_a_control_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["--cfg", "job", "checkpoint.local_every=5", f"checkpoint.local_path={blocker}"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"hpctrain: checkpoint.local_path={blocker}: is not a directory here (valid: an existing writable "
        "node-local directory, e.g. /dev/shm)"
    )
    assert main(["--cfg", "job", "checkpoint.local_every=5", "checkpoint.local_path=/dev/shm/a\tb"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "checkpoint.local_path" in err and "control character" in err


def test_the_fast_tier_is_the_trainers_and_a_job_id_is_checked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--cfg", "job", "task=script", "task.path=README.md", "checkpoint.local_every=5"]) == 2
    assert "checkpoint.local_every=5: the fast tier is hpctrain's trainer's, not task=script's" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("HPCTRAIN_JOB_ID", "../../elsewhere")
    assert main(["--cfg", "job"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hpctrain: HPCTRAIN_JOB_ID=../../elsewhere: not a job id "
        "(valid: 1-64 characters of A-Z a-z 0-9 . _ -)"
    )
    monkeypatch.setenv("HPCTRAIN_JOB_ID", "restart-7")
    assert main(["--cfg", "job", "checkpoint.local_every=5"]) == 0


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["checkpoint.path=/shared/ckpt"],
            "checkpoint.path=/shared/ckpt: a folder: the shared checkpoints are",
        ),
        (
            ["checkpoint.path=nosuch://b/p"],
            "checkpoint.path=nosuch://b/p: no fsspec file system for nosuch://",
        ),
        (["checkpoint.path=file:///tmp/x"], "checkpoint.path=file:///tmp/x: not a store other processes and"),
        (["checkpoint.path=memory://b/x"], "checkpoint.path=memory://b/x: not a store other processes and"),
        (["checkpoint.path=s3://"], "checkpoint.path=s3://: names no bucket, or climbs out of it"),
        (["checkpoint.path=s3://b/../other"], "checkpoint.path=s3://b/../other: names no bucket, or climbs"),
        (["checkpoint.path=' '"], "checkpoint.path= : not a URL"),
        (
            ["checkpoint.path=s3://b/p", "+checkpoint.storage_options.secret=hunter2"],
            "checkpoint.storage_options.secret=***: a credential would be recorded",
        ),
        (
            ["+checkpoint.storage_options.endpoint_url=http://127.0.0.1:9"],
            "checkpoint.storage_options={'endpoint_url': 'http://127.0.0.1:9'}: options of no store",
        ),
        (
            ["task=script", "task.path=README.md", "checkpoint.path=s3://b/p"],
            "checkpoint.path=s3://b/p: checkpoints are hpctrain's trainer's, not task=script's",
        ),
    ],
)
def test_a_bad_checkpoint_store_is_one_line(
    overrides: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--cfg", "job", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"hpctrain: {says}"), err
    assert "hunter2" not in err


def test_a_store_url_with_a_control_character_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cfg", "job", "checkpoint.path=s3://b/a\tb"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "checkpoint.path" in err and "control character" in err
