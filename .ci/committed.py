"""Exit 0 when the newest run under OUTPUTS holds a committed checkpoint whose every file matches its
manifest's checksums; else one line and exit 1. CI's proof that a fresh install trains *and saves*: the
first save is where an undeclared dependency (crc32c) failed on a clean machine.

    python .ci/committed.py OUTPUTS_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpctrain.rundir.checkpoints import committed, problem_with


def main(outputs: Path) -> int:
    runs = sorted((p.parent for p in outputs.rglob("config.yaml") if (p.parent / "checkpoints").is_dir()),
                  key=lambda p: p.stat().st_mtime)  # fmt: skip
    if not runs:
        print(f"committed.py: no run with a checkpoints/ folder under {outputs}")
        return 1
    run = runs[-1]
    steps = committed(run / "checkpoints")
    if not steps:
        print(f"committed.py: {run} has no committed checkpoint")
        return 1
    problem = problem_with(steps[0])
    if problem:
        print(f"committed.py: {steps[0]}: {problem}")
        return 1
    print(f"committed.py: {steps[0]} committed, every file matches its checksum")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
