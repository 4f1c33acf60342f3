"""Every module of hpctrain/ has a fast test, or tests/README.md says which end-to-end test covers it.

A module is *named* by a test of the fast tier (tests/unit/) when a test file imports it (``import`` or
``from ... import``, a package's submodule included) or holds its dotted name as a string of code: a whole
string such as ``"hpctrain.models.gpt.GPT"`` (a ``_target_``, a module run by name), or Python source that
imports it (what a test hands ``python -c``), or, for a module of ``hpctrain/cli``, a call of the
CLI with its subcommand (``main([...])``, the ``cli`` fixture, a test's ``X_main(NAME, ARGV)`` wrapper of
``main``). Docstrings and prose do not count. A package's ``__init__``
counts as a module where it defines something (a function, a class, a constant). Modules that only processes
or Slurm can exercise are listed, with the test that covers them, in the "Covered end-to-end only" table of
tests/README.md; the table may list nothing that a fast test names, so that it shrinks as fast tests grow.
"""

from __future__ import annotations

import ast
import contextlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpctrain"
FAST = ROOT / "tests" / "unit"
README = ROOT / "tests" / "README.md"
DOTTED = re.compile(r"hpctrain(\.\w+)*")
ROW = re.compile(r"^\| `(hpctrain[\w.]*)` \| (.+) \|$", re.M)
CITED = re.compile(r"`(tests/(?:e2e|slurm)/[\w/]+\.py)(?:::(\w+))?`")


def modules() -> dict[str, Path]:
    """Dotted name → file of every module of the package (an ``__init__`` only where it defines something)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            body = ast.parse(path.read_text()).body
            defines = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
            if not any(isinstance(node, defines) for node in body):
                continue
        found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def _subcommands_called(tree: ast.AST) -> set[str]:
    """``hpctrain.cli.<module>`` of every subcommand a test runs: ``main(["status", ...])`` or
    ``cli("status", ...)`` (a call whose first word is no subcommand runs ``train``, the bare form)."""
    from hpctrain.cli import SUBCOMMANDS

    called = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        first, name = node.args[0], node.func.id
        if name == "main" and isinstance(first, ast.List) and first.elts:
            first = first.elts[0]
        elif name not in ("cli", "run", "run_prepare") and not name.endswith("_main"):
            continue
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        if first.value in SUBCOMMANDS:
            called.add(f"hpctrain.cli.{SUBCOMMANDS[first.value].module}")
        elif name in ("main", "cli"):  # overrides: the bare form runs train
            called.add(f"hpctrain.cli.{SUBCOMMANDS['train'].module}")
    return called


def named_by(paths: list[Path]) -> set[str]:
    """Every dotted name the files import or hold as code, and its prefixes (hpctrain.a.b → hpctrain.a)."""
    names: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text())
        names |= _imports(tree) | _subcommands_called(tree)
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docs:
                continue
            text = node.value.strip()
            if DOTTED.fullmatch(text):
                names.add(text)
            elif "import" in text:
                with contextlib.suppress(SyntaxError):  # prose that mentions importing
                    names |= _imports(ast.parse(text))
    prefixes = set()
    for name in names:
        parts = name.split(".")
        prefixes.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return prefixes


def end_to_end_only() -> dict[str, list[tuple[str, str]]]:
    """The README's table: module → the (test file, test name or "") that cover it."""
    section = README.read_text().split("## Covered end-to-end only", 1)[1].split("\n## ", 1)[0]
    return {module: CITED.findall(cells) for module, cells in ROW.findall(section)}


def test_every_module_has_a_fast_test_or_is_listed_with_the_test_that_covers_it() -> None:
    named = named_by(sorted(FAST.rglob("*.py")))
    listed = end_to_end_only()
    neither = [m for m in modules() if m not in named and m not in listed]
    assert not neither, (
        f"{len(neither)} module(s) named by no test of tests/unit/ and not in tests/README.md's "
        f"'Covered end-to-end only' table: {', '.join(neither)} (write a fast test, or list the e2e/slurm "
        "test that covers it)"
    )


def test_the_end_to_end_table_is_true() -> None:
    listed = end_to_end_only()
    assert listed, "tests/README.md has no 'Covered end-to-end only' table"
    known = modules()
    named = named_by(sorted(FAST.rglob("*.py")))
    for module, cited in listed.items():
        assert module in known, f"{module}: listed in tests/README.md, but hpctrain/ has no such module"
        assert module not in named, f"{module}: a fast test names it now; take it out of the README's table"
        assert cited, f"{module}: the table cites no tests/e2e or tests/slurm test"
        for path, name in cited:
            source = ROOT / path
            assert source.is_file(), f"{module}: {path} does not exist"
            if name:
                assert re.search(rf"^def {name}\(", source.read_text(), re.M), (
                    f"{path}::{name} does not exist"
                )
