"""The torchrun template's node shell: the warning signal reaches the workers (which save and exit) instead
of killing torchrun and orphaning them. Run here with a stand-in for ``python -m torch.distributed.run``."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch.sbatch import render_script

# Stand-in for torchrun: starts one "worker" and waits for it. USR2 would end it (the default action) if the
# node shell did not start it with USR2 ignored. The worker saves (writes a file) on USR2 and exits 0.
AGENT = """#!/usr/bin/env python3
import os, signal, subprocess, sys, time
out = os.environ["OUT"]
worker = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
out = os.environ["OUT"]
def save(*_):
    open(out + "/saved", "w").write("checkpoint")
    sys.exit(0)
signal.signal(signal.SIGUSR2, save)
open(out + "/worker", "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
'''])
open(out + "/agent", "w").write(str(os.getpid()))
sys.exit(worker.wait())
"""


def _node_shell(tmp_path: Path) -> str:
    overrides = ["cluster=a100x32", "launcher=sbatch", "cluster.sbatch_template=torchrun"]
    script = render_script(to_typed(compose(overrides)), tmp_path / "run")
    found = re.search(r"bash -c '(.*?)' \\\n", script, re.S)
    assert found, "no node shell in the torchrun template"
    return found.group(1)


def test_the_warning_signal_reaches_the_workers_and_torchrun_survives(tmp_path: Path) -> None:
    agent = tmp_path / "python"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    shell = subprocess.Popen(
        ["bash", "-c", _node_shell(tmp_path), str(agent), "--nnodes=1"],
        env={"PATH": "/usr/bin:/bin", "OUT": str(out), "SLURM_NODEID": "0"},
    )
    deadline = time.monotonic() + 20
    while not (out / "worker").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (out / "worker").exists(), "the worker never started"
    shell.send_signal(signal.SIGUSR2)  # what Slurm's --signal=USR2@... delivers to the task
    assert shell.wait(timeout=20) == 0
    assert (out / "saved").read_text() == "checkpoint"
