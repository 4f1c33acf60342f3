"""The tiers and the fixtures every tier shares (tests/README.md says more).

Every test gets the marker of the folder it lives in (``unit``, ``e2e``, ``slurm``), so ``-m unit`` selects
the fast tier without anybody remembering a decorator. Under pytest-xdist (``-n auto --dist loadgroup``, the
default of pyproject.toml: :func:`pytest_xdist_auto_num_workers`) the Slurm tier is one group (one worker runs
it, and starts its cluster once), and a module whose tests share a module-scoped fixture is one group, so the
fixture is built once.

One fork server serves the whole session (per xdist worker): every local launch outside tests/unit forks its
ranks from a process that imported torch once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import CLI, REPO, STDLIB, fork_server_imports

# One OpenMP thread per process unless a test says otherwise. The suite keeps both cores busy with its workers
# and their ranks, where a second intra-op thread only spins: a 1-process run of 60 steps took 12-21 % more
# CPU with 2 (the launcher's default for 1 rank on 2 cores). That default is for a machine a run has alone.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# bench/reference_ddp.py holds the hand-written DDP loop that parity tests compare against.
sys.path.insert(0, str(REPO / "bench"))

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "e2e", "slurm", "gpu")  # gpu: the CUDA path, run by bench/gpu.py on a GPU
# Fixtures wider than a test: a module that uses one is kept on one xdist worker.
SHARED_SCOPES = ("module", "class", "package")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """With ``-p no:xdist`` the suite runs in this one process: accept (and ignore) pyproject's ``-n`` and
    ``--dist``, which would otherwise be unknown options."""
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist (not loaded)")
    # ``_addoption``: pytest reserves lowercase short options for itself and its plugins; this is xdist's.
    group._addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="ignored: no xdist")
    group.addoption("--dist", dest="dist", default="no", help="ignored: no xdist")


# Local workers: one per core, at most 4 (an end-to-end test starts up to 8 ranks of its own).
MAX_LOCAL_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """pyproject's ``-n auto``: a worker per core for the local tests, and one more for the Slurm tier when it
    runs (it mostly waits on Slurm: the local workers keep both cores busy meanwhile). On the 2-core
    machine: 3 for the whole suite, 2 for the fast tier."""
    cores = min(len(os.sched_getaffinity(0)), MAX_LOCAL_WORKERS)
    return cores + (1 if _selects_the_slurm_tier(config) else 0)


def _selects_the_slurm_tier(config: pytest.Config) -> bool:
    expr = str(config.getoption("markexpr") or "")
    if expr and "slurm" not in expr.replace("not slurm", ""):  # -m unit, -m e2e, -m "not slurm"
        return False
    slurm = TESTS / "slurm"
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args] or [TESTS]
    return any(path == slurm or slurm in path.parents or path in slurm.parents for path in paths)


def tier_of(path: Path) -> str:
    parts = path.resolve().relative_to(TESTS).parts
    if len(parts) < 2 or parts[0] not in TIERS:
        raise pytest.UsageError(f"{path}: a test lives under tests/unit, tests/e2e, tests/slurm or tests/gpu")
    return parts[0]


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in SHARED_SCOPES for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before -m deselects and before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The CUDA path (tests/gpu) is deselected where there is no CUDA GPU, not skipped: a skip is a test that
    # should have run (CI fails the suite on skips), and these run where they can, by bench/gpu.py.
    if not _has_cuda():
        gpu = [item for item in items if tier_of(item.path) == "gpu"]
        if gpu:
            config.hook.pytest_deselected(items=gpu)
            items[:] = [item for item in items if item not in gpu]
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "slurm":  # one worker runs the Slurm tier (mostly waiting on Slurm) and its one cluster
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(TESTS).as_posix()))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


# ------------------------------------------------------------------------------ the CLI, in this process


@pytest.fixture
def cli(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> CLI:
    """``hpctrain ARGS`` in this process, as ``python -m hpctrain`` runs it (``sys.exit(main())``): its exit
    status and what it printed, like :func:`tests.support.hpctrain` returns, without an interpreter start.
    For bad input and dry runs, where no process boundary is under test.

    As in a fresh process: the working directory and environment given, the root logger without handlers
    (a dry run's ``logging.basicConfig`` then prints to stdout as typed), the submit directory that
    ``record_project_dir`` sets in ``os.environ`` undone afterwards, Hydra's global state cleared; no fork
    server (``HPCTRAIN_FORKSERVER=off`` unless ``env`` says otherwise)."""

    def run(
        *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        from hydra.core.global_hydra import GlobalHydra

        from hpctrain.cli import main
        from hpctrain.launch.forked import FORKSERVER_ENV, OFF
        from hpctrain.launch.project import PROJECT_DIR_ENV

        capfd.readouterr()  # what the test printed before is not the command's
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        with monkeypatch.context() as mp:
            mp.chdir(cwd or REPO)
            # No fork server prestarted (a process importing torch, stopped again when the command starts no
            # local run here): these commands start none. 60 bad inputs paid ~0.2 s of CPU each for it.
            mp.setenv(FORKSERVER_ENV, OFF)
            for key, value in (env or {}).items():
                mp.setenv(key, value)
            mp.delenv(PROJECT_DIR_ENV, raising=False)
            mp.setattr(sys, "argv", [sys.argv[0]])  # run_hydra sets sys.argv itself
            root.handlers = []
            try:
                code = main(list(args))
            except SystemExit as exit_:  # Hydra's own exits, as ``sys.exit`` would report them
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            finally:
                for handler in root.handlers:
                    if handler not in handlers:
                        handler.close()
                root.handlers, root.level = handlers, level
                GlobalHydra.instance().clear()
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["hpctrain", *args], code, out, err)

    return run


# ------------------------------------------------------------------------------ a user's project folder
EXAMPLE = REPO / "examples" / "user_project"
# Test-only user code that goes wrong in the ways a user's code does.
BAD_USER_CODE = """
import torch


def raising(width: int = 3, num_classes: int = 10):
    raise ValueError("width must be even")


def needs_depth(depth: int, width: int = 3):
    return torch.nn.Linear(depth, width)


def not_a_dataset(split: str):
    return 5


class StrItems(torch.utils.data.Dataset):
    def __init__(self, split: str):
        pass

    def __len__(self):
        return 64  # more than one global batch: the check of the items is what is under test

    def __getitem__(self, i):
        return "an image"


class Pooled(torch.nn.Module):
    # embed, blocks, head, but the forward pools over the sequence: not what the stages give

    def __init__(self, vocab_size: int = 256, width: int = 64, depth: int = 4):
        super().__init__()
        from mynets.mixer import Residual

        self.embed = torch.nn.Embedding(vocab_size, width)
        self.blocks = torch.nn.ModuleList(Residual(width) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


class OneHotDigits(torch.utils.data.Dataset):
    def __init__(self, split: str):
        pass

    def __len__(self):
        return 64  # more than one global batch: the check of the labels is what is under test

    def __getitem__(self, i):
        return torch.zeros(1, 8, 8), torch.nn.functional.one_hot(torch.tensor(i % 10), 10).float()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/user_project, copied to a folder outside the package (a user's own), with mynets/bad.py."""
    folder = tmp_path_factory.mktemp("user") / "project"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    (folder / "mynets" / "bad.py").write_text(BAD_USER_CODE)
    return folder


def _import_torchao_if_installed() -> None:
    """torchao, when installed (hpctrain does not use it; transformers imports it as it builds a model), logs
    load failures and deprecation warnings on stderr at import: imported here, before a test captures the
    stderr of a command whose one line it checks, it stays out of that line whichever test runs first."""
    import importlib.util

    if importlib.util.find_spec("torchao") is not None:
        import torchao  # noqa: F401


def _forget_user_modules() -> None:
    for name in [m for m in sys.modules if m == "mynets" or m.startswith("mynets.")]:
        del sys.modules[name]  # another module's copy of the project imports its own


@pytest.fixture
def in_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process in the project's folder, its package importable, as ``python -m hpctrain`` would be."""
    _import_torchao_if_installed()
    _forget_user_modules()
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    yield project
    _forget_user_modules()


# ------------------------------------------------------------------------------ a trained BPE token file
@pytest.fixture(scope="module")
def bpe_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 100 kB of the standard library's sources, copied (so the test owns the input directory)."""
    src = tmp_path_factory.mktemp("corpus") / "src"
    src.mkdir()
    for name in ("json/decoder.py", "json/encoder.py", "json/scanner.py", "textwrap.py", "shlex.py"):
        shutil.copy(STDLIB / name, src / name.replace("/", "_"))
    return src


@pytest.fixture(scope="module")
def bpe_corpus(bpe_sources: Path) -> Path:
    """``hpctrain prepare SOURCES --tokenizer train:512`` (in this process): the token file of a BPE of at
    most 512 ids trained on the sources, its header and tokenizer beside it."""
    from hpctrain.cli import main

    out = bpe_sources.parent / "out" / "corpus.bin"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["prepare", str(bpe_sources), "--out", str(out), "--tokenizer", "train:512"])
    assert code == 0
    assert "tokenizer" in printed.getvalue() and str(out) in printed.getvalue()
    return out


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The session's cache (HPCTRAIN_CACHE, inherited by every command and job it starts): rehearsal
    records and the shared Slurm watch (hpctrain.slurm.watch) of this session only, never the user's."""
    os.environ.setdefault("HPCTRAIN_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def _fork_server_beyond_the_fast_tier(request: pytest.FixtureRequest) -> None:
    """Every test outside tests/unit/ (which starts no process) has the session's fork server."""
    if "unit" not in request.node.path.relative_to(REPO).parts:
        request.getfixturevalue("fork_server")


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """One fork server for the session (``HPCTRAIN_FORKSERVER``): every local launch of the suite forks its
    ranks from a process that imported torch once. ``HPCTRAIN_TEST_FORKSERVER=per-launch`` leaves each
    launch its own server, ``=off`` starts every rank as a fresh interpreter; a ``HPCTRAIN_FORKSERVER``
    already set is used as it is."""
    from hpctrain.errors import ConfigError
    from hpctrain.launch.forked import FORKSERVER_ENV, OFF, SERVER_MODULE, ForkServer

    mode = os.environ.get("HPCTRAIN_TEST_FORKSERVER", "persistent")
    if FORKSERVER_ENV in os.environ or mode == "per-launch":
        yield os.environ.get(FORKSERVER_ENV)
        return
    if mode == "off":
        os.environ[FORKSERVER_ENV] = OFF
        yield OFF
        del os.environ[FORKSERVER_ENV]
        return
    path = str(tmp_path_factory.mktemp("forkserver") / "s.sock")
    command = [sys.executable, "-m", SERVER_MODULE, "--socket", path, "--parent", str(os.getpid())]
    for module in fork_server_imports():
        command += ["--import", module]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        while True:  # listening; it answers once its imports are done, while the first tests run
            assert server.poll() is None, f"the fork server ended with {server.returncode}"
            try:
                ForkServer.connect(path).close()
                break
            except ConfigError:
                time.sleep(0.05)
        os.environ[FORKSERVER_ENV] = path
        yield path
    finally:
        os.environ.pop(FORKSERVER_ENV, None)
        server.terminate()
        server.wait(timeout=30)
