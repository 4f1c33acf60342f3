"""torch's private API is used from one module (hpctrain/torchapi.py), and the torch and Python hpctrain
supports are checked before anything starts (hpctrain/version.py).

The guard reads every module of hpctrain/ by AST: ``import torch._x``, ``from torch.y import _x``, attribute
chains on a name bound to torch (``torch._C._f``, ``dist._X`` after ``import torch.distributed as dist``,
``torch.ops._c10d_functional``, ``torch.ops.aten._to_copy``, a module alias assigned to another name),
``getattr(torch..., "_x")``, and strings naming a private torch module (``importlib.import_module``'s
argument, a preload list, a logger's name). A private name is a dotted part that starts with ``_`` and is
not a dunder (``torch.__version__`` is public).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import version
from hpctrain.version import (
    PYTHON_SUPPORTED,
    TORCH_SUPPORTED,
    UnsupportedEnvironment,
    environment_problem,
    python_problem,
    release,
    spec,
    torch_problem,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpctrain"
HOME = PACKAGE / "torchapi.py"  # the one module allowed private torch names
TORCH_NAME = re.compile(r"torch(\.\w+)+")
RANGE = ">=2.13,<2.16"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _private_module_name(value: object) -> bool:
    """A whole string naming a private torch module (what import_module, a preload list or a logger takes)."""
    is_name = isinstance(value, str) and TORCH_NAME.fullmatch(value) is not None
    return is_name and any(_private(p) for p in str(value).split("."))


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for a chain not rooted at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_torch_names(source: str) -> list[tuple[int, str]]:
    """(line, what) of every private torch name ``source`` touches."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the torch path it stands for
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "torch":
                    continue
                if any(_private(p) for p in alias.name.split(".")):
                    found.add((node.lineno, f"import {alias.name}"))
                bound[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "torch":
                continue
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                if any(_private(p) for p in path.split(".")):
                    found.add((node.lineno, f"from {node.module} import {alias.name}"))
                bound[alias.asname or alias.name] = path
    # A torch module or object assigned to another name (``internals = state_dict_module``), to a fixed point.
    assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1]
    for _ in range(3):
        for node in assigned:
            target, chain = node.targets[0], _chain(node.value)
            if isinstance(target, ast.Name) and chain and chain[0] in bound and target.id not in bound:
                bound[target.id] = ".".join([bound[chain[0]], *chain[1:]])
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(parents.get(node), ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in bound:
                base = bound[chain[0]].split(".")
                # A private part of the alias's own path was reported where it was imported.
                if any(_private(p) for p in chain[1:]):
                    found.add((node.lineno, ".".join(base + chain[1:])))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            if node.func.id not in ("getattr", "hasattr", "setattr", "delattr"):
                continue
            chain, name = _chain(node.args[0]), node.args[1]
            named = isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value)
            if chain and chain[0] in bound and named:
                found.add((node.lineno, ".".join([bound[chain[0]], *chain[1:], str(name.value)])))
        elif isinstance(node, ast.Constant) and _private_module_name(node.value):
            found.add((node.lineno, repr(node.value)))
    return sorted(found)


def _violations(sources: dict[str, str]) -> list[str]:
    return [
        f"{name}:{line}: {what}"
        for name, source in sorted(sources.items())
        if name != str(HOME.relative_to(ROOT))
        for line, what in private_torch_names(source)
    ]


def test_only_torchapi_touches_private_torch_names() -> None:
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    found = _violations(sources)
    assert not found, "private torch API outside hpctrain/torchapi.py:\n" + "\n".join(found)


def test_torchapi_holds_private_names() -> None:
    """The guard sees the home module's own names (a guard that saw nothing would pass anything)."""
    assert len(private_torch_names(HOME.read_text())) >= 20


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import torch._dynamo", True),
        ("import torch.distributed._functional_collectives as funcol", True),
        ("from torch.utils._pytree import tree_flatten", True),
        ("from torch.distributed.checkpoint.filesystem import _StorageInfo", True),
        ("import torch\ntorch._C._current_graph_task_id()", True),
        ("import torch\nx = torch.ops.aten._to_copy.default", True),
        ("import torch\nx = torch.ops._c10d_functional.reduce_scatter_tensor", True),
        ("import torch.distributed as dist\nx = dist._DEFAULT_FIRST_BUCKET_BYTES", True),
        ("from torch import distributed\nx = distributed._DEFAULT_FIRST_BUCKET_BYTES", True),
        ("from torch.distributed.checkpoint import state_dict as sd\ninner = sd\ninner._gc_context()", True),
        ("import torch\ngetattr(torch.ops.aten, '_to_copy')", True),
        ("import importlib\nimportlib.import_module('torch._inductor.config')", True),
        ("import logging\nlogging.getLogger('torch.utils._pytree')", True),
        ("import torch\nprint(torch.__version__, torch.nn.functional.relu)", False),
        ("from torch.distributed.checkpoint import state_dict as _dcp\n_dcp.get_state_dict", False),
        ("import os\nos._exit(0)", False),
        ('"""See torch._dynamo for why."""', False),
    ],
)
def test_the_guard_catches_each_form(source: str, caught: bool) -> None:
    assert bool(private_torch_names(source)) is caught, private_torch_names(source)


# ------------------------------------------------------------------------- the supported torch and Python


@pytest.mark.parametrize(
    ("installed", "supported"),
    [
        ("2.13.0", True),
        ("2.13.0+cpu", True),  # a local build tag: placed by 2.13.0
        ("2.13.0a0+gitabc123", True),  # a source build of 2.13
        ("2.15.1+cu126", True),
        ("2.13", True),
        ("2.12.1", False),
        ("2.5.1", False),
        ("2.16.0", False),
        ("2.16.0a0+gitabc", False),  # a pre-release of 2.16 is 2.16
        ("2.16.0.dev20261201", False),  # a nightly of 2.16
        ("3.0.0", False),
    ],
)
def test_torch_range(installed: str, supported: bool) -> None:
    problem = torch_problem(installed, ("2.13", "2.16"))
    assert (problem is None) is supported, problem
    if problem is not None:
        assert "\n" not in problem
        assert f"torch {installed}" in problem and RANGE in problem
        assert problem.endswith(f"pip install 'torch{RANGE}'")


def test_the_torch_message_names_the_installed_torch_and_the_range() -> None:
    assert torch_problem("2.5.1", ("2.13", "2.16")) == (
        "hpctrain supports torch >=2.13,<2.16; this environment has torch 2.5.1: "
        "pip install 'torch>=2.13,<2.16'"
    )


@pytest.mark.parametrize("garbage", ["", "latest", "v", "cpu-2.13", "2.13\n\x1b[31mred"])
def test_an_unparsable_torch_version_is_refused_in_one_line(garbage: str) -> None:
    problem = torch_problem(garbage, ("2.13", "2.16"))
    if garbage.startswith("2.13"):  # leading release numbers: placed by them, as pip would not
        assert problem is None
        return
    assert problem is not None and "\n" not in problem and "not a version" in problem and RANGE in problem


def test_no_torch_is_refused() -> None:
    assert torch_problem(None, ("2.13", "2.16")) == (
        "hpctrain supports torch >=2.13,<2.16; this environment has no torch: pip install 'torch>=2.13,<2.16'"
    )


def test_release_numbers() -> None:
    assert release("2.13.0+cpu") == (2, 13, 0)
    assert release("2.16.0.dev20261201") == release("2.16.0a0+gitabc") == (2, 16, 0)
    assert release("nightly") is None
    assert spec(("3.10", None)) == ">=3.10" and spec(("2.13", "2.16")) == RANGE


@pytest.mark.parametrize(
    ("python", "supported", "ok"),
    [
        ((3, 10, 0), ("3.10", None), True),
        ((3, 13, 1), ("3.10", None), True),
        ((3, 9, 18), ("3.10", None), False),
        ((3, 13, 1), ("3.10", "3.14"), True),
        ((3, 14, 0), ("3.10", "3.14"), False),
    ],
)
def test_python_range(python: tuple[int, int, int], supported: tuple[str, str | None], ok: bool) -> None:
    problem = python_problem(python, supported, "/usr/bin/python3.9")
    assert (problem is None) is ok, problem
    if problem is not None:
        assert "\n" not in problem and spec(supported) in problem and ".".join(map(str, python)) in problem


def test_the_python_message() -> None:
    assert python_problem((3, 9, 18), ("3.10", None), "/usr/bin/python3.9") == (
        "hpctrain supports Python >=3.10; this is Python 3.9.18 (/usr/bin/python3.9): make the environment "
        "with a Python >=3.10"
    )


def test_this_environment_is_supported_and_the_constants_are_ranges() -> None:
    assert environment_problem() is None
    for low, top in (TORCH_SUPPORTED, PYTHON_SUPPORTED):
        assert release(low) is not None and (top is None or release(top) > release(low))


def test_pyproject_declares_the_ranges_hpctrain_checks() -> None:
    """pip refuses what the import-time check would: the two declarations are one range."""
    project = (ROOT / "pyproject.toml").read_text()
    assert f'requires-python = "{spec(PYTHON_SUPPORTED)}"' in project
    assert f'"torch{spec(TORCH_SUPPORTED)}"' in project


def test_torchapi_refuses_an_unsupported_torch_at_import() -> None:
    """Importing the module checks the torch it imports (here: made to look like 2.5.1)."""
    code = (
        "import torch; torch.__version__ = '2.5.1'\n"
        "try:\n    import hpctrain.torchapi\n"
        "except Exception as err:\n    print(type(err).__name__, err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == f"{UnsupportedEnvironment.__name__} {torch_problem('2.5.1')}"


def _refused_for_torch(
    tmp_path: Path, torch_version: str, module_args: list[str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE_ARGS`` where torch says it is ``torch_version``: refused with exit
    EXIT_UNSUPPORTED and the one line that names the version."""
    result = subprocess.run(
        [sys.executable, "-m", *module_args],
        cwd=cwd,
        env=_fake_torch(tmp_path, torch_version),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == version.EXIT_UNSUPPORTED, result.stderr
    assert result.stderr.splitlines() == [torch_problem(torch_version)], result.stderr
    return result


def _fake_torch(tmp_path: Path, torch_version: str) -> dict[str, str]:
    """An environment whose package metadata says torch is ``torch_version`` (a dist-info first on its
    path)."""
    site = tmp_path / "site"
    info = site / f"torch-{torch_version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    path = os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("argv", [[], ["train", "trainer.max_steps=2"], ["resume"], ["eval", "runs/x"]])
def test_the_cli_refuses_an_unsupported_torch_before_anything(tmp_path: Path, argv: list[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    result = _refused_for_torch(tmp_path, "2.5.1", ["hpctrain", *argv], work)
    assert "Traceback" not in result.stderr and not result.stdout
    assert list(work.iterdir()) == []  # no run directory, nothing written


def test_the_worker_refuses_an_unsupported_torch_before_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _refused_for_torch(tmp_path, "2.16.0.dev20261201", ["hpctrain.worker", str(run_dir)], tmp_path)
    assert list(run_dir.iterdir()) == []


def test_the_fork_server_refuses_an_unsupported_torch_before_importing_it(tmp_path: Path) -> None:
    """A Slurm node whose environment differs starts its fork server there: one line, no traceback."""
    socket_path = tmp_path / "fs.sock"
    _refused_for_torch(tmp_path, "2.5.1", ["hpctrain.forkserver", "--socket", str(socket_path)], tmp_path)
    assert not socket_path.exists()
