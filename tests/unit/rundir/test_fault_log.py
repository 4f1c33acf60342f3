"""The run's one fault log (faults.jsonl): each fault as first seen and each answer of the fault policy, in
one file, told apart by the answer's ``entry``; a run directory of an earlier version (its answers in
restarts.jsonl) is read as it was, and nothing is written there again."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.rundir import RunDir


def test_faults_and_answers_share_one_file_and_are_told_apart(tmp_path: Path):
    rd = RunDir(tmp_path)
    rd.append_fault({"time": 1.0, "rank": 3, "host": "node2", "why": "hung", "action": "reported"})
    rd.append_answer({"time": 2.0, "job": "7.r0", "generation": 0, "action": "restart", "resume_step": 4})
    rd.append_fault({"time": 3.0, "rank": 1, "host": "node1", "why": "killed", "action": "the run ends"})
    lines = [json.loads(line) for line in rd.faults.read_text().splitlines()]
    assert [line["time"] for line in lines] == [1.0, 2.0, 3.0]  # one file, in the order things happened
    assert [f["why"] for f in rd.read_faults()] == ["hung", "killed"]
    (answer,) = rd.read_answers()
    assert (answer["action"], answer["entry"]) == ("restart", "answer"), answer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faults.jsonl"]


def test_an_earlier_versions_restarts_file_is_read_first_and_never_written(tmp_path: Path):
    legacy = tmp_path / "restarts.jsonl"
    old = [{"time": 1.0, "job": "5.r0", "generation": 0, "action": "restart", "progress": False}]
    legacy.write_text("".join(json.dumps(r) + "\n" for r in old))
    rd = RunDir(tmp_path)
    rd.append_answer({"time": 9.0, "job": "5.r1", "generation": 0, "action": "requeue", "progress": False})
    assert [(a["job"], a["action"]) for a in rd.read_answers()] == [("5.r0", "restart"), ("5.r1", "requeue")]
    assert legacy.read_text() == json.dumps(old[0]) + "\n"  # the earlier record stays as it was


def test_a_torn_last_line_is_skipped_and_the_next_line_lands_whole(tmp_path: Path):
    rd = RunDir(tmp_path)
    rd.append_answer({"time": 1.0, "action": "restart"})
    with open(rd.faults, "a") as out:
        out.write('{"time": 2.0, "acti')  # a writer killed mid-line
    assert [a["time"] for a in rd.read_answers()] == [1.0] and rd.read_faults() == []
    rd.append_answer({"time": 3.0, "action": "stopped"})  # starts a line of its own: not lost with the torn
    assert [a["time"] for a in rd.read_answers()] == [1.0, 3.0]
