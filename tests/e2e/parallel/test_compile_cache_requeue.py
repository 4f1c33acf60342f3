"""A restarted process of the same run finds what the first compiled: inductor's FX graphs and AOTAutograd's
graphs come from RUN_DIR/compile_cache/<key>, not from compiling again (the counters torch keeps say so).

Each start is its own process, as a requeued job's is; the model is one small block (a C++ kernel build on
the CPU costs tens of seconds, the process boundary is what is under test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

# One rank of a run with parallel.compile=true: open the run's compile cache, compile the blocks, one step.
RANK = """
import json, sys
from pathlib import Path
import torch
from torch import nn
from hpctrain.config.compose import compose, to_typed
from hpctrain.config.shape import run_shape
from hpctrain.parallel.compile import apply_compile, open_compile_cache

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)) + x

cfg = to_typed(compose(["parallel=none", "cluster.nproc=1", "parallel.compile=true", sys.argv[2]]))
cache = open_compile_cache(cfg, run_shape(cfg), torch.device("cpu"), Path(sys.argv[1]))
model = nn.Sequential(nn.ModuleList([Block()]))
apply_compile(model)
model[0][0](torch.randn(2, 8, requires_grad=True)).sum().backward()
print(json.dumps({"path": str(cache.path), "counts": cache.counts()}))
"""


def _start(run_dir: Path, override: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(run_dir / "not-this-one")}  # overridden by the run
    done = subprocess.run(
        [sys.executable, "-c", RANK, str(run_dir), override],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_restarted_run_hits_the_cache(tmp_path: Path) -> None:
    first = _start(tmp_path, "trainer.micro_batch_size=4")
    folder = Path(first["path"])
    assert folder.parent == tmp_path / "compile_cache" and (folder / "key.json").is_file()
    assert json.loads((folder / "key.json").read_text())["micro_batch_size"] == 4
    assert first["counts"]["FX graph"][0] == 0 and first["counts"]["FX graph"][1] > 0  # compiled: misses
    assert (folder / "fxgraph").is_dir() and (folder / "aotautograd").is_dir()
    # torch creates its default folder when it is imported; nothing is written there.
    assert not any((tmp_path / "not-this-one").iterdir())

    again = _start(tmp_path, "trainer.micro_batch_size=4")  # the requeued job
    assert again["path"] == first["path"]
    assert again["counts"]["FX graph"] == [first["counts"]["FX graph"][1], 0]  # every graph a hit
    assert again["counts"]["AOTAutograd"][0] > 0 and again["counts"]["AOTAutograd"][1] == 0
