"""The house rules of docs/architecture.md, each checked as written (not as a list of words):

- only ``hpctrain/rundir`` spells a name of the run directory's map (:data:`hpctrain.rundir.LAYOUT`) in a
  path, and docs/runs.md's "What a run leaves behind" is that map;
- only ``hpctrain/config`` derives the run's shape: nothing else imports the derivations of
  ``config/shape.py`` (only ``run_shape`` and its types), nor multiplies, divides or takes a remainder of two
  shape quantities;
- the core never compares a model input kind (what a spec's ``input_kind`` names) or a built-in model's
  name: what a model needs is a method of its spec (``models/``);
- tests import nothing from ``hpctrain/cli`` but its entry point (``main``) and exit statuses: the CLI only
  parses, calls and prints.

Each guard reads the package's sources with :mod:`ast`; ``test_guards_catch_a_broken_rule`` breaks each rule
once in a copy of a module and checks that its guard names it.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpctrain.config.shape as shape_module
from hpctrain.config.schema import ClusterConfig, ParallelConfig, TrainerConfig
from hpctrain.data.catalog import DATASETS
from hpctrain.models.builtin import BUILTIN
from hpctrain.rundir import LAYOUT

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpctrain"


def _sources(skip: tuple[str, ...] = ()) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] not in skip:
            yield path, ast.parse(path.read_text(), str(path))


# --------------------------------------------------------------------------------------------- run dir
RUN_DIR_NAMES = {name.rstrip("/") for name in LAYOUT}
# Calls whose string arguments are paths (or path patterns).
PATH_CALLS = {"Path", "PurePath", "open", "join", "joinpath", "glob", "rglob", "iglob", "with_name", "mkdir"}


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Names bound to a string literal anywhere in the module (``SLURM_DIR = "slurm"``)."""
    found = {}
    for node in ast.walk(tree):
        assigned = isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        if assigned and isinstance(node.value.value, str):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def path_literals(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every string a path is built of: operands of ``/``, arguments of path calls (a name bound to a literal
    counts as its literal), and the literal parts of f-strings that hold a ``/``."""
    consts = _string_constants(tree)

    def literals(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and node.id in consts:
            return [consts[node.id]]
        if isinstance(node, ast.JoinedStr):
            return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                yield from ((node.lineno, s) for s in literals(side))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in PATH_CALLS:
                for arg in node.args:
                    yield from ((node.lineno, s) for s in literals(arg))
        elif isinstance(node, ast.JoinedStr):
            parts = literals(node)
            if any("/" in p for p in parts):
                yield from ((node.lineno, p) for p in parts)


def run_dir_names_in_paths(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every run-directory name a path of ``tree`` spells (an absolute path is a system
    path, not one of a run's)."""
    return [
        (line, part)
        for line, text in path_literals(tree)
        if not text.startswith("/")
        for part in text.split("/")
        if part in RUN_DIR_NAMES
    ]


def test_only_rundir_spells_a_run_directory_name_in_a_path() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name!r}"
        for path, tree in _sources(skip=("rundir",))
        for line, name in run_dir_names_in_paths(tree)
    ]
    assert not offenders, offenders


def test_the_docs_show_the_run_directory_map() -> None:
    page = ROOT / "docs" / "runs.md"  # the README's section, moved to the docs (issue 40)
    section = page.read_text().split("## What a run leaves behind", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    rows = [line for line in block.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")]
    shown = {line.split()[0] for line in rows}
    assert shown == set(LAYOUT), (sorted(shown - set(LAYOUT)), sorted(set(LAYOUT) - shown))


# ------------------------------------------------------------------------------------------- run shape
def shape_quantities() -> set[str]:
    """The run shape's numbers: RunShape's and Degrees' fields and properties, and the config fields that
    run_shape derives them from (read from config/shape.py itself)."""
    names = set()
    for cls in (shape_module.RunShape, shape_module.Degrees):
        names |= {f.name for f in dataclasses.fields(cls)}
        names |= {n for n, v in vars(cls).items() if isinstance(v, property)}
    tree = ast.parse(Path(shape_module.__file__).read_text())
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for group in (ClusterConfig, ParallelConfig, TrainerConfig):
        names |= read & {f.name for f in dataclasses.fields(group)}
    # Not numbers: which strategy, schedule or regime, and the Degrees record itself.
    return names - {"kind", "name", "schedule", "degrees", "regime", "precision"}


def derivations() -> set[str]:
    """config/shape.py's functions other than run_shape: the derivations only config/ may call."""
    return {
        name
        for name, value in vars(shape_module).items()
        if callable(value)
        and not isinstance(value, type)
        and getattr(value, "__module__", "") == shape_module.__name__
        and name != "run_shape"
    }


def shape_derivations(tree: ast.Module) -> list[tuple[int, str]]:
    quantities, private = shape_quantities(), derivations()

    def mentions(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr in quantities for n in ast.walk(node))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == shape_module.__name__:
            found += [(node.lineno, f"imports {a.name}") for a in node.names if a.name in private]
        # A product, quotient or remainder of two shape numbers derives a third (a ratio `/` in a formula,
        # such as a ring all-reduce's (n − 1)/n, derives none).
        ops = (ast.Mult, ast.FloorDiv, ast.Mod)
        arithmetic = isinstance(node, ast.BinOp) and isinstance(node.op, ops)
        if arithmetic and mentions(node.left) and mentions(node.right):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_only_config_derives_the_run_shape() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path, tree in _sources(skip=("config",))
        for line, what in shape_derivations(tree)
    ]
    assert not offenders, offenders


# ------------------------------------------------------------------------------------- model-blind core
INPUT_KINDS = {spec.input_kind for spec in BUILTIN.values() if spec.input_kind}
MODEL_NAMES = {p.stem for p in (PACKAGE / "conf" / "model").glob("*.yaml")} | {
    target.rsplit(".", 1)[1] for target in BUILTIN
}


def model_branches(tree: ast.Module, room: str) -> list[tuple[int, str]]:
    """Comparisons with an input kind, and any built-in model's name, in a module of ``room``. data/ may
    compare its own datasets' names, one of which is also an input kind ("tokens")."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                for item in items:
                    kind = isinstance(item, ast.Constant) and item.value in INPUT_KINDS
                    if kind and not (room == "data" and item.value in DATASETS):
                        found.append((node.lineno, f"compares {item.value!r}"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODEL_NAMES:
            found.append((node.lineno, f"names model {node.value!r}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = node.args[1:] and node.args[1]
            names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds] if kinds else []
            for name in names:
                spelled = name.id if isinstance(name, ast.Name) else getattr(name, "attr", "")
                if spelled.endswith("Spec"):  # a model's kind, asked of its spec's class
                    found.append((node.lineno, f"asks isinstance of {spelled}"))
    return found


def test_the_core_never_asks_which_model_it_has() -> None:
    """models/ declares the models; verify/ trains the built-ins by name to check the core (it stays off the
    training path: an import-linter contract)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path, tree in _sources(skip=("models", "verify"))
        for line, what in model_branches(tree, path.relative_to(PACKAGE).parts[0])
    ]
    assert not offenders, offenders


# ------------------------------------------------------------------------------------------------- CLI
ENTRY_POINTS = ("main", "SUBCOMMANDS", "readme_table")


def test_tests_import_only_the_clis_entry_point() -> None:
    """cli/ modules parse, call and print; what a test needs lives in the room that does the work. A test
    may call the CLI (``main``) and compare exit statuses (a subcommand's ``EXIT_*``), no more."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            from_cli = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpctrain.cli")
            if not from_cli:
                continue
            allowed = ENTRY_POINTS if node.module == "hpctrain.cli" else ()
            if any(a.name not in allowed and not a.name.startswith("EXIT_") for a in node.names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


# ------------------------------------------------------------------------------- the guards themselves
BROKEN = {
    "run dir": ("hpctrain/train/trainer.py", "log_dir = run_dir / 'logs'\n", run_dir_names_in_paths),
    "run shape": (
        "hpctrain/launch/local.py",
        "ranks = cfg.cluster.nodes * cfg.cluster.tasks_per_node\n",
        lambda tree: shape_derivations(tree),
    ),
    "model": (
        "hpctrain/jobs/summary.py",
        "tokens_in = spec.input_kind == 'tokens'\n",
        lambda tree: model_branches(tree, "plan"),
    ),
    "model class": (
        "hpctrain/plan/layout.py",
        "transformer = isinstance(spec, TransformerSpec)\n",
        lambda tree: model_branches(tree, "plan"),
    ),
}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_guards_catch_a_broken_rule(rule: str) -> None:
    """A module that keeps the rule passes its guard; the same module with one offending line does not."""
    path, line, guard = BROKEN[rule]
    source = (ROOT / path).read_text()
    assert guard(ast.parse(source)) == []
    broken = guard(ast.parse(source + "\n\ndef _broken(cfg, run_dir, spec):\n    " + line))
    assert len(broken) == 1, broken


def test_the_architecture_layout_names_every_room() -> None:
    """docs/architecture.md's Layout block names every package of hpctrain/ (each says what it holds in its
    docstring)."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^hpctrain/(\w+)/", section, re.M))
    rooms = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"conf", "sbatch_templates"}
    assert named == rooms, (sorted(rooms - named), sorted(named - rooms))
    undocumented = [
        r
        for r in sorted(rooms)
        if not ast.get_docstring(ast.parse((PACKAGE / r / "__init__.py").read_text()))
    ]
    assert not undocumented, undocumented
