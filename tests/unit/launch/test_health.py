"""A node's health check (hpctrain.launch.health.problem): what it refuses, and that the tasks of one node
checking at the same moment do not fail each other."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from hpctrain.launch import health


def _probe_many(run: str, times: int, out: multiprocessing.Queue) -> None:
    found = [health.problem(Path(run), None, "node1") for _ in range(times)]
    out.put([f for f in found if f is not None])


def test_tasks_of_one_node_check_at_once_without_failing_each_other(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_probe_many, args=(str(tmp_path), 300, out)) for _ in range(4)]
    for p in procs:
        p.start()
    problems = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert problems == [[], [], [], []]


def test_a_site_script_that_fails_is_the_reason_with_its_last_line(tmp_path: Path):
    script = tmp_path / "check.sh"
    script.write_text('#!/bin/sh\necho starting\necho "the scratch disk is full"\nexit 3\n')
    script.chmod(0o755)
    why = health.problem(tmp_path / "run", str(script), "node2")
    assert why == f"health check: cluster.health_check={script} exited 3 on node2: the scratch disk is full"
    assert health.problem(tmp_path / "run", None, "node2") is None


def test_a_run_directory_that_cannot_be_written_is_the_reason(tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the run directory's folders should go
    why = health.problem(blocked / "run", None, "node2")
    assert why is not None and why.startswith(
        f"health check: the run directory {blocked / 'run'} is not writable"
    )
