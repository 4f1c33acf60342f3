"""torch.compile applied per block (the blocks :mod:`hpctrain.parallel.blocks` finds), and its caches kept
where a requeued job finds them.

Compiling blocks rather than the whole model keeps parameter names unchanged (checkpoints resume under any
layout) and lets one graph serve every identical block; torchtitan compiles per block for the same reasons.

Compiling costs the first step of every process start: tens of seconds to minutes (Dynamo traces,
AOTAutograd splits forward and backward, inductor generates and builds kernels). torch caches each stage's
output on disk, keyed by the graph, the torch version, the device and its own config: inductor's FX graph
cache (``torch._inductor.config.fx_graph_cache``, with the kernels it built: C++ on CPUs, Triton on GPUs) and
the AOTAutograd cache (``torch._functorch.config.enable_autograd_cache``), both under
``TORCHINDUCTOR_CACHE_DIR``, by default a folder of the node's /tmp, which a job requeued onto another node
(or a fresh container) does not see. :func:`open_compile_cache` points that directory at a folder that
stays: ``RUN_DIR/compile_cache/<key>`` (``parallel.compile_cache=run``) or ``<path>/<key>`` on a shared file
system, ``<key>`` (:func:`cache_key`) naming the torch and hpctrain versions, the device and the config
parts that shape the graphs, so a restarted job of the same config reuses every entry, and two configs
never share a folder. A directory rather than torch's portable "mega-cache" bytes
(``torch.compiler.save_cache_artifacts``): every rank's entries land there as they are compiled (each
written by rename: inductor's ``write_atomic``), so a job killed at any point leaves what it compiled, and
nothing has to be saved at a chosen moment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain import torchapi
from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.parallel.blocks import find_blocks
from hpctrain.rundir import RunDir, write_compile_key
from hpctrain.version import __version__

log = logging.getLogger(__name__)

torchapi.import_compile_config()  # at import, as ever: before a run sets CACHE_ENV

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
# dynamo's counters (torchapi.dynamo_counters): (group, name) of each cache's hits and misses.
COUNTERS = {
    "FX graph": ("inductor", "fxgraph_cache_hit", "fxgraph_cache_miss"),
    "AOTAutograd": ("aot_autograd", "autograd_cache_hit", "autograd_cache_miss"),
}


def apply_compile(model: nn.Module, block_classes: Sequence[str] = ()) -> None:
    """Compile each block in place (``Module.compile`` keeps parameter names, unlike ``torch.compile(m)``).
    Blocks are identical, so one graph serves all of them."""
    for block in find_blocks(model, block_classes):
        block.module.compile()


# ------------------------------------------------------------------------------------------ the cache
def device_kind(device: torch.device) -> str:
    """What compiled code depends on of the device: a GPU's name and compute capability (Triton builds for
    it); for the CPU, the machine's architecture (inductor builds C++ for the host's vector ISA, which its
    own key also records)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda:{torch.cuda.get_device_name(device)}:sm{major}{minor}"
    return f"{device.type}:{platform.machine()}"


def key_inputs(cfg: Config, shape: RunShape, device: str, torch_version: str) -> dict[str, Any]:
    """The parts of a run that decide which graphs it compiles: versions, device, model, data item shape,
    layout, precision and micro-batch. Left out: what does not (the optimizer, steps, seed, paths, logging,
    the cache setting itself), so a changed learning rate or a resumed run keeps its cache."""
    model = {"target": cfg.model.target, "args": cfg.model.args}
    parallel = {k: v for k, v in dataclasses.asdict(cfg.parallel).items() if k != "compile_cache"}
    data = {"name": cfg.data.name, "target": cfg.data.target, "args": cfg.data.args}
    return {
        "torch": torch_version,
        "hpctrain": __version__,
        "device": device,
        "model": model,
        "data": data,
        "parallel": parallel,
        "degrees": dataclasses.asdict(shape.degrees),
        "world_size": shape.world_size,
        "precision": cfg.trainer.precision,
        "micro_batch_size": shape.micro_batch_size,
        "microbatches": shape.microbatches,
    }


def cache_key(inputs: dict[str, Any]) -> str:
    """A folder name for ``inputs`` (:func:`key_inputs`): the torch version (readable) and 16 hex digits of
    the SHA-256 of all of them."""
    text = json.dumps(inputs, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    version = "".join(c if c.isalnum() or c in ".-" else "-" for c in str(inputs["torch"]))
    return f"torch{version}-{digest}"


def cache_root(cfg: Config, run_dir: Path) -> Path | None:
    """The folder the keyed caches go under (``parallel.compile_cache``), None for torch's default."""
    setting = cfg.parallel.compile_cache
    if setting == "off":
        return None
    return RunDir(run_dir).compile_cache if setting == "run" else Path(setting)


@dataclass
class CompileCache:
    """Where this process's compile caches live, and how often it found what it compiled there."""

    path: Path
    key: str

    def counts(self) -> dict[str, tuple[int, int]]:
        """{cache: (hits, misses)} of this process so far."""
        counters = torchapi.dynamo_counters()
        return {name: (counters[g][hit], counters[g][miss]) for name, (g, hit, miss) in COUNTERS.items()}

    def summary(self) -> str:
        found = ", ".join(f"{name} {h} hit(s), {m} miss(es)" for name, (h, m) in self.counts().items())
        return f"compile cache {self.path}: {found}"


def open_compile_cache(
    cfg: Config, shape: RunShape, device: torch.device, run_dir: Path, is_main: bool = True
) -> CompileCache | None:
    """Point torch's compile caches at the run's keyed folder before anything is compiled; None when the run
    compiles nothing or keeps torch's default (``parallel.compile_cache=off``). The main rank writes
    ``key.json`` into the folder."""
    root = cache_root(cfg, run_dir)
    if not cfg.parallel.compile or root is None:
        return None
    inputs = key_inputs(cfg, shape, device_kind(device), torch.__version__)
    key = cache_key(inputs)
    path = root / key
    path.mkdir(parents=True, exist_ok=True)
    if is_main:
        write_compile_key(path, inputs)
    os.environ[CACHE_ENV] = str(path)  # read by inductor at each use (cache_dir_utils.cache_dir)
    # Paths inductor derived from the previous directory and memoised (as torch's own temporary_cache_dir
    # clears them).
    torchapi.clear_inductor_caches()
    # Both default to on in torch ≥ 2.5; a site's config or an environment variable may have turned them off.
    torchapi.enable_compile_caches()
    log.info("torch.compile caches in %s", path)
    return CompileCache(path, key)
