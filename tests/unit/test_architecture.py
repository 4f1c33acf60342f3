"""The house rules of docs/architecture.md that a test can check: faults stay in their room, Slurm is
called from one module, the submit path imports no torch, no module grows past ~400 lines without a reason,
no two module-level check functions share a name, and the import-linter contracts hold (the rules on names
and derived numbers: tests/unit/test_rules.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpctrain"
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "salloc")


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_fault_words_live_only_in_the_faults_room() -> None:
    words = re.compile(r"fail_at|hang_at|slow_rank|save_delay_s")
    found = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix in (".py", ".yaml", ".j2") and words.search(path.read_text())
    ]
    assert found and all(f.startswith(("hpctrain/faults/", "hpctrain/conf/faults/")) for f in found), found


def test_no_slurm_command_is_run_outside_slurm() -> None:
    offenders = []
    for path in _sources():
        if path.is_relative_to(PACKAGE / "slurm"):
            continue
        text = path.read_text()
        for call in re.finditer(r"subprocess\.\w+\(\s*\[?\s*\"?(\w+)", text):
            if call.group(1) in SLURM_COMMANDS:
                offenders.append(f"{path.relative_to(ROOT)}: {call.group(0)}")
        for name in SLURM_COMMANDS:
            if re.search(rf"\[\s*\"{name}\"", text):
                offenders.append(f'{path.relative_to(ROOT)}: ["{name}" ...]')
    assert not offenders, offenders


def test_rundir_and_config_import_no_torch() -> None:
    code = (
        "import sys, hpctrain.rundir, hpctrain.config, hpctrain.config.validate, hpctrain.config.shape, "
        "hpctrain.config.compose, hpctrain.faults, hpctrain.slurm.commands, hpctrain.precision, "
        "hpctrain.submit.precheck, hpctrain.submit.sweep, hpctrain.submit.fits, hpctrain.submit.hydra_app, "
        "hpctrain.submit.measure, hpctrain.jobs.targets, hpctrain.jobs.summary, hpctrain.plan.check, "
        "hpctrain.plan.text, hpctrain.data.catalog, hpctrain.launch.submitit, hpctrain.launch.sbatch; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_long_modules_say_why() -> None:
    """A module of the package, the tests or the benchmarks over 400 lines gives its reason in its docstring
    ("Over 400 lines: ...")."""
    long = []
    others = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bench").rglob("*.py"))]
    for path in [*_sources(), *others]:
        lines = path.read_text().count("\n")
        if lines > 400 and "Over 400 lines" not in path.read_text()[:3000]:
            long.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert not long, long


def check_functions(paths: list[Path]) -> dict[str, list[str]]:
    """Module-level ``check*``, ``require*`` and ``validate*`` functions by name: the files defining each."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith(("check", "require", "validate")):
                found.setdefault(node.name, []).append(path.as_posix())
    return found


def test_no_two_check_functions_share_a_name(tmp_path: Path) -> None:
    """A refusal is found by its function's name: two rooms' ``check_data`` (the common keys, the built-in
    dataset's) read as one rule. The guard itself: two files defining ``check_x`` are caught."""
    twins = {name: where for name, where in check_functions(_sources()).items() if len(where) > 1}
    assert not twins, twins
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("def check_x():\n    pass\n")
    planted = [tmp_path / "a.py", tmp_path / "b.py"]
    assert [len(where) for where in check_functions(planted).values()] == [2]


def test_import_contracts_hold() -> None:
    # The tool beside this interpreter (a venv's bin/, whether or not the venv is activated), else on PATH.
    beside = Path(sys.executable).parent / "lint-imports"
    command = str(beside) if beside.is_file() else "lint-imports"
    result = subprocess.run([command], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_promises_name_tests_that_exist() -> None:
    # The README's section, moved to a page of its own (issue 40): the page is the section.
    section = (ROOT / "docs" / "promises.md").read_text().split("# What hpctrain promises", 1)[1]
    cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+?)(\*)?)?`", section)
    assert len(cited) >= 10
    for path, name, star in cited:
        source = (ROOT / path).read_text()
        if name:
            pattern = rf"^def {name}\w*\(" if star else rf"^def {name}\("
            assert re.search(pattern, source, re.M), f"{path}::{name} does not exist"


def _skipped_statements(tree: ast.Module, lines: list[str]) -> list[tuple[int, ast.stmt | None]]:
    """Each ``# fmt: skip`` line and the innermost statement of ``tree`` it ends (None: none ends there)."""
    statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
    found = []
    for number, line in enumerate(lines, 1):
        if line.rstrip().endswith("# fmt: skip"):
            ending = [n for n in statements if n.end_lineno == number]
            found.append((number, min(ending, key=lambda n: n.end_lineno - n.lineno) if ending else None))
    return found


def _is_table(node: ast.stmt | None, top: set[int]) -> bool:
    """A module- or class-level constant whose value is a collection literal of six entries or more."""
    if node is None or id(node) not in top or not isinstance(node, (ast.Assign, ast.AnnAssign)):
        return False
    value = node.value
    if isinstance(value, ast.Dict):
        return len(value.keys) >= 6
    return isinstance(value, (ast.List, ast.Tuple, ast.Set)) and len(value.elts) >= 6


def test_the_formatter_is_skipped_only_for_tables_that_say_why() -> None:
    """``# fmt: skip`` keeps a table packed (a module's constant of six entries or more, one line per row
    instead of one per entry), each under a comment that says what it holds; 40 at most in all. Anywhere
    else the formatter decides."""
    bad, count = [], 0
    for path in [
        *_sources(),
        *sorted((ROOT / "tests").rglob("*.py")),
        *sorted((ROOT / "bench").rglob("*.py")),
    ]:
        text = path.read_text()
        if "# fmt: skip" not in text:
            continue
        tree, lines = ast.parse(text), text.splitlines()
        top = {id(n) for n in tree.body} | {
            id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in c.body
        }
        for number, node in _skipped_statements(tree, lines):
            count += 1
            where = f"{path.relative_to(ROOT)}:{number}"
            if not _is_table(node, top):
                bad.append(f"{where}: not a table")
            elif node is not None and not lines[node.lineno - 2].lstrip().startswith("#"):
                bad.append(f"{where}: no comment above the table")
    assert not bad, bad
    assert count <= 40, count


def _found_outside(module: str, finder: Callable[[ast.Module], list[tuple[int, str]]]) -> list[str]:
    """Where ``finder`` finds what only ``module`` (its path under hpctrain/) may do, in any other module."""
    return [
        f"{path.relative_to(ROOT)}:{line}: {how}"
        for path in _sources()
        if path.relative_to(PACKAGE).as_posix() != module
        for line, how in finder(ast.parse(path.read_text()))
    ]


def worker_starts(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, how) where ``tree`` names the worker's module to start it: in a command line or a spawn
    request (a list, tuple or call argument), or bound to a name. A logger of that name is no start."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) == "getLogger":
                continue
            values = node.args
        elif isinstance(node, (ast.List, ast.Tuple)):
            values = node.elts
        elif isinstance(node, ast.Assign):
            values = [node.value]
        else:
            continue
        found += [
            (node.lineno, "names hpctrain.worker")
            for v in values
            if isinstance(v, ast.Constant) and v.value == "hpctrain.worker"
        ]
    return found


def test_one_module_starts_the_worker() -> None:
    """``hpctrain.launch.spawn`` is the one place that starts ``hpctrain.worker`` (forked, fresh, exec'd or
    in process); every supervisor calls it. (The fork server imports the worker side once, by import.)"""
    offenders = _found_outside("launch/spawn.py", worker_starts)
    assert not offenders, offenders
    spawn = ast.parse((PACKAGE / "launch" / "spawn.py").read_text())
    assert len(worker_starts(spawn)) == 1  # WORKER_MODULE, named once
    broken = ast.parse(
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-m', 'hpctrain.worker', d])\n"
    )
    assert len(worker_starts(broken)) == 1


SUPERVISING = ("exit_outcome", "answer_fault")  # how a worker ended, read; a fault answered and carried out


def supervising_calls(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) where ``tree`` reads how a worker ended or answers a fault."""
    return [
        (node.lineno, name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for name in [node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")]
        if name in SUPERVISING
    ]


def test_one_loop_supervises_the_workers() -> None:
    """``hpctrain.launch.supervisor`` is the one loop that watches workers, reads how they ended and has
    their faults answered: the local launcher and each Slurm task's agent are sites it runs, not loops."""
    offenders = _found_outside("launch/supervisor.py", supervising_calls)
    assert not offenders, offenders
    loop = ast.parse((PACKAGE / "launch" / "supervisor.py").read_text())
    assert sorted(name for _, name in supervising_calls(loop)) == sorted(SUPERVISING)
    broken = ast.parse(
        "from hpctrain.launch import exits\nexits.exit_outcome(run_dir, 0, host, 1, 7, None)\n"
    )
    assert len(supervising_calls(broken)) == 1
