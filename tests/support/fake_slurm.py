"""Fake Slurm clients for tests of what a job asks of Slurm from inside itself: each records its arguments and
answers with a canned output and exit status (tests/unit/conftest.py's ``fake`` puts them on PATH)."""

from __future__ import annotations

from pathlib import Path

# A canned answer per client, or per client and first word (``scontrol.requeue.rc``) when one is given.
FAKE = """#!/bin/sh
name=$(basename "$0")
echo "$name $*" >> "$FAKE_DIR/calls"
[ -f "$FAKE_DIR/$name.$1.rc" ] && name="$name.$1"
[ -f "$FAKE_DIR/$name.out" ] && cat "$FAKE_DIR/$name.out"
exit $(cat "$FAKE_DIR/$name.rc" 2>/dev/null || echo 0)
"""
SHOW_JOB = """JobId=12 JobName=train
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=gpu AllocNode:Sid=login1:4242
   ReqNodeList=(null) ExcNodeList=(null)
   NumNodes=2-2 NumCPUs=16 NumTasks=2
   Comment=a comment with spaces
"""


class Fake:
    def __init__(self, root: Path) -> None:
        self.root = root

    def answer(self, name: str, out: str = "", rc: int = 0) -> None:
        (self.root / f"{name}.out").write_text(out)
        (self.root / f"{name}.rc").write_text(str(rc))

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []
