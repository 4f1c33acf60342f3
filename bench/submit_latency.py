"""How long ``python -m hpctrain ... cluster=slurm_test`` takes to return, beside Python and torch imports.

    SLURM_CONF=... python bench/submit_latency.py [--runs 5]     # against a running cluster
    python bench/submit_latency.py                                # starts the test cluster itself (root)

Median of ``--runs`` invocations each of: the submission (until the command returns with the job queued),
``python -c pass`` and ``python -c "import torch"``, measured in this run on this machine. Target: the
submission ≤ 1.5 s and well under an import of torch. Submitted jobs are cancelled at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.cluster import environment_for_benchmarks  # noqa: E402


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    with environment_for_benchmarks() as env, tempfile.TemporaryDirectory() as tmp:
        submit, bare, torch_import = [], [], []
        for i in range(opts.runs):
            submit.append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "hpctrain",
                        "cluster=slurm_test",
                        "trainer.max_steps=1",
                        f"hydra.run.dir={tmp}/run{i}",
                    ],
                    env,
                )
            )
            bare.append(timed([sys.executable, "-c", "pass"], env))
            torch_import.append(timed([sys.executable, "-c", "import torch"], env))
        subprocess.run(["scancel", "--name=hpctrain"], env=env, check=False)
    rows = [
        ("python -m hpctrain ... cluster=slurm_test", submit),
        ("python -c pass", bare),
        ('python -c "import torch"', torch_import),
    ]
    for name, times in rows:
        print(
            f"{name:45s} median {statistics.median(times):6.3f} s",
            f"(runs: {', '.join(f'{t:.3f}' for t in times)})",
        )
    ratio = statistics.median(submit) / statistics.median(torch_import)
    print(f"submission / torch import = {ratio:.2f}   (target: submission ≤ 1.5 s)")


if __name__ == "__main__":
    main()
