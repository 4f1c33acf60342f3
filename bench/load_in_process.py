"""A checkpoint's check + load in one process, against this disk's cold read measured just before: the
reader's own throughput without a launch, ranks or the CLI around it (``bench/resume_cost.py`` has those).

    python bench/load_in_process.py [--sizes 40M 120M] [--rounds 3] [--dir /tmp]

Per size (``bench/gpt_sizes.py``): the built-in GPT and AdamW after one step are saved once with
``CheckpointManager`` (synchronous); then ``--rounds`` times: a file as large as the checkpoint is written,
dropped from the page cache and read in 8 MiB blocks (cold), the checkpoint's files are dropped from the
page cache, and a fresh interpreter builds a fresh model and optimizer and times ``CheckpointManager.resume``
(manifest, checksums, load, the optimizer's state made); then, dropped again, the checkpoint's own files
read by the same 8 MiB loop in a fresh interpreter that built the same model and optimizer (on this VM a
process holding the state reads into the page cache more slowly than the small one that measures the disk:
the load's ratio to both is printed). ``--tree`` names the checkout whose hpctrain is
measured: alternate two to compare them (a paired A/B on a shared machine). A timing is a figure, never
an assertion.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpt_sizes import DEFAULT, SIZES
from resume_cost import GIB, disk_read, drop_from_cache

CHILD = """
import sys, time, warnings, torch
from pathlib import Path
warnings.filterwarnings("ignore")
from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.state import ModelOptimizerState, TrainState
from hpctrain.models.gpt import GPT
layers, width, heads = map(int, sys.argv[2:5])
torch.manual_seed(0)
model = GPT(n_layers=layers, d_model=width, n_heads=heads, seq_len=64)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
state = {"model_optim": ModelOptimizerState(model, optimizer), "train": TrainState()}
manager = CheckpointManager(Path(sys.argv[5]), keep_last=1, rank=0)
if sys.argv[1] == "save":
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    manager.save(1, state)
elif sys.argv[1] == "read":  # the checkpoint's own files, plain reads, beside the same model and optimizer
    buffer = bytearray(8 << 20)
    started = time.perf_counter()
    for path in sorted(p for p in Path(sys.argv[5]).rglob("*") if p.is_file()):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
    print(time.perf_counter() - started)
else:
    started = time.perf_counter()
    assert manager.resume(state, "auto") is not None
    print(time.perf_counter() - started)
manager.close()
"""


def child(mode: str, size: str, root: Path, tree: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, *map(str, SIZES[size]), str(root)],
        capture_output=True,
        text=True,
        cwd=tree,  # its hpctrain is imported (cwd first on sys.path)
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        sys.exit(f"{mode} {size} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT[1:], choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    here = Path(__file__).resolve().parents[1]
    parser.add_argument("--tree", type=Path, default=here, help="the checkout whose hpctrain is measured")
    opts = parser.parse_args()
    print(f"{'size':>5} {'MiB':>7} {'load s':>7} {'GiB/s':>6} {'cold disk':>9} {'÷ cold':>7}  (medians)")
    for size in opts.sizes:
        with tempfile.TemporaryDirectory(prefix="hpctrain-load-", dir=opts.dir) as tmp:
            root = Path(tmp) / "checkpoints"
            child("save", size, root, opts.tree)
            files = [p for p in root.rglob("*") if p.is_file()]
            nbytes = sum(p.stat().st_size for p in files)
            loads, colds, ratios, beside = [], [], [], []
            for _ in range(opts.rounds):
                cold, _ = disk_read(Path(tmp), nbytes)
                for path in files:
                    drop_from_cache(path)
                loads.append(float(child("load", size, root, opts.tree)))
                colds.append(cold)
                ratios.append(nbytes / loads[-1] / cold)
                for path in files:
                    drop_from_cache(path)
                beside.append(float(child("read", size, root, opts.tree)))
            load = statistics.median(loads)
            print(
                f"{size:>5} {nbytes / 2**20:>7.1f} {load:>7.2f} {nbytes / load / GIB:>6.2f} "
                f"{statistics.median(colds) / GIB:>9.2f} {statistics.median(ratios):>7.2f}  "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}); a plain cold read of the checkpoint "
                f"beside the same model and optimizer {nbytes / statistics.median(beside) / GIB:.2f} GiB/s, "
                f"the load {statistics.median(beside) / load:.2f} × it",
                flush=True,
            )


if __name__ == "__main__":
    main()
