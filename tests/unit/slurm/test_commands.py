"""What a job asks of Slurm from inside itself (hpctrain.slurm.commands), against fake clients on PATH: each
records its arguments and answers with a canned output and exit status (tests/support/fake_slurm.py)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from hpctrain.slurm import commands
from tests.support.fake_slurm import SHOW_JOB, Fake


def test_cancelled_from_accounting_or_from_a_job_slurm_is_ending(fake: Fake):
    fake.answer("sacct", "CANCELLED by 1000\n")
    assert commands.was_cancelled("12")
    fake.answer("sacct", "RUNNING\n")
    assert not commands.was_cancelled("12")
    fake.answer("sacct", "", rc=1)  # no accounting: scontrol's JobState decides
    fake.answer("scontrol", SHOW_JOB.replace("RUNNING", "COMPLETING"))
    assert commands.was_cancelled("12")
    fake.answer("scontrol", SHOW_JOB)
    assert not commands.was_cancelled("12")
    assert fake.calls()[0] == "sacct --noheader --allocations --jobs 12 --format State%40"
    assert fake.calls()[-1] == "scontrol show job 12"


def test_job_fields_and_partition_nodes(fake: Fake):
    fake.answer("scontrol", SHOW_JOB)
    fields = commands.job_fields("12")
    assert (fields["Partition"], fields["ExcNodeList"], fields["NumNodes"]) == ("gpu", "(null)", "2-2")
    assert fields["Comment"] == "a comment with spaces"
    fake.answer("scontrol", "", rc=1)
    assert commands.job_fields("12") == {}
    fake.answer("sinfo", "node[1-3]\ngpu7\n")
    assert commands.partition_nodes("gpu") == {"node1", "node2", "node3", "gpu7"}
    assert fake.calls()[-1] == "sinfo --noheader --partition gpu --format %N"


def test_end_time(fake: Fake):
    fake.answer("squeue", "2030-01-02T03:04:05\n")
    assert commands.end_time("12") == datetime(2030, 1, 2, 3, 4, 5).timestamp()
    assert fake.calls() == ["squeue --noheader --jobs 12 --format %e"]
    for out, rc in (("N/A\n", 0), ("", 0), ("2030-01-02T03:04:05\n", 1)):
        fake.answer("squeue", out, rc)
        assert commands.end_time("12") is None


def test_end_time_without_squeue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert commands.end_time("12") is None
