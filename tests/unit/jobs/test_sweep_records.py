"""In-process: a sweep of several arrays and packs of members, as records and states (no Slurm needed)."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.jobs.status import where
from hpctrain.jobs.summary import pack_member_state
from hpctrain.launch.submitit import pack_groups
from hpctrain.rundir import RunLock
from hpctrain.rundir.records import SweepMember, SweepRecord, read_sweep, write_json
from hpctrain.slurm.commands import JobState, _fields_lines


def test_pack_groups_cover_every_member_once() -> None:
    assert pack_groups(6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert pack_groups(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert pack_groups(3, 1) == [[0], [1], [2]]


def test_a_sweep_of_several_arrays_reads_back_and_says_so(tmp_path: Path) -> None:
    members = [
        SweepMember(i, [f"trainer.seed={i}"], str(tmp_path / str(i)), f"{10 + i // 4}_{i % 4}")
        for i in range(6)
    ]
    write_json(tmp_path / "sweep.json", SweepRecord("10", "slurm_test", members, array_job_ids=["10", "11"]))
    record = read_sweep(tmp_path)
    assert record is not None and record.arrays == ["10", "11"] and record.members == members
    assert where(record) == "2 array jobs 10, 11 on slurm_test"
    # A record written before several arrays existed: one array, its id.
    raw = json.loads((tmp_path / "sweep.json").read_text())
    del raw["array_job_ids"]
    for member in raw["members"]:
        del member["pack"]
    (tmp_path / "sweep.json").write_text(json.dumps(raw))
    old = read_sweep(tmp_path)
    assert old is not None and old.arrays == ["10"] and where(old) == "array job 10 on slurm_test"


def _member(tmp_path: Path, steps: int, max_steps: int = 30) -> SweepMember:
    run = tmp_path / f"m{steps}"
    run.mkdir()
    (run / "config.yaml").write_text(f"trainer:\n  max_steps: {max_steps}\n")
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, steps + 1))
    )
    return SweepMember(0, [], str(run), "12_0", pack=0)


def test_a_pack_members_state_comes_from_its_run_directory(tmp_path: Path) -> None:
    running = JobState("12_0", "RUNNING", "", "node1", "1:00")
    done, started, waiting = _member(tmp_path, 30), _member(tmp_path, 8), _member(tmp_path, 0)
    assert pack_member_state(done, running).state == "COMPLETED"
    lock = RunLock(Path(started.run_dir)).acquire()
    try:
        assert pack_member_state(started, running).state == "RUNNING"
    finally:
        lock.release()
    turn = pack_member_state(waiting, running)
    assert turn.state == "PENDING" and turn.reason == "earlier members of its pack"
    queued = JobState("12_0", "PENDING", "", "", "", "Resources", "2026-11-26T10:00:00")
    assert pack_member_state(done, queued).state == "COMPLETED"  # a requeued pack: what is done stays done
    assert pack_member_state(started, queued).start == "2026-11-26T10:00:00"
    ended = JobState("12_0", "COMPLETED", "0:0", "node1", "2:00")
    assert pack_member_state(started, ended).state == "FAILED"  # the pack ended, this member did not finish
    (Path(waiting.run_dir) / "logs").mkdir()
    (Path(waiting.run_dir) / "logs" / "rank0.error.json").write_text("{}")
    assert pack_member_state(waiting, ended).state == "FAILED"


def test_scontrol_show_config_is_read_as_keys() -> None:
    text = "Configuration data as of 2026-11-26T09:00:00\nMaxArraySize            = 4\nMaxJobCount = 10000\n"
    fields = _fields_lines(text)
    assert fields["MaxArraySize"] == "4" and fields["MaxJobCount"] == "10000"
