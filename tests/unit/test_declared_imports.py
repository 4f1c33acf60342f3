"""Every third-party module that hpctrain imports comes from a distribution that pyproject.toml declares.

A fresh clone on a machine where a package was once installed by hand passes every other test and still
breaks for the next user: `crc32c` was imported by the checkpoint writer and declared nowhere, and every
save failed on a clean install. This test reads the code and the declaration, not what happens to be
installed: every ``import`` in hpctrain/ and hydra_plugins/ (the wheel's two packages), nested ones
included, is matched to the distribution that provides it, and that distribution must be named in
``[project] dependencies`` or an extra. A module provided only through another package's dependencies
(PyYAML through hydra-core, threadpoolctl through scikit-learn) counts as undeclared: a dependency's
dependencies may change under us.

An import of a distribution declared only in an extra must be lazy (inside a function: hpctrain imports
without the extra) and ``hpctrain.errors.pip_line`` must name an extra that installs it, so the refusal a
user sees names the right ``pip install`` line.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib's origin (the dev extra installs it there)
    import tomli as tomllib

from hpctrain.errors import pip_line

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hpctrain", "hydra_plugins")


def _norm(name: str) -> str:
    """PEP 503's normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _norm(re.split(r"[<>=!~ \[;(]", requirement, maxsplit=1)[0])


def declared(root: Path) -> dict[str, set[str]]:
    """Normalised distribution -> where pyproject.toml declares it ('required' and/or extras' names)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    out: dict[str, set[str]] = {}
    for requirement in project["dependencies"]:
        out.setdefault(_requirement_name(requirement), set()).add("required")
    for extra, requirements in project.get("optional-dependencies", {}).items():
        for requirement in requirements:
            out.setdefault(_requirement_name(requirement), set()).add(extra)
    return out


def imports(root: Path) -> list[tuple[str, str, bool]]:
    """(imported module, "file:line", at module level) for every absolute import under ``root``'s packages.

    "At module level" means executed when the module is imported: not inside a function or class body's
    function, and not under ``if TYPE_CHECKING``.
    """
    found: list[tuple[str, str, bool]] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            lazy: set[int] = set()
            for node in ast.walk(tree):
                lazily_run = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
                    isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                )
                if lazily_run:
                    lazy.update(id(inner) for inner in ast.walk(node) if inner is not node)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                where = f"{path.relative_to(root)}:{node.lineno}"
                found.extend((name, where, id(node) not in lazy) for name in names)
    return found


@cache
def _providers() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions that provide it; ``hydra_plugins.X`` keyed whole
    (a namespace that several distributions, hpctrain among them, share)."""
    out = {top: [_norm(d) for d in dists] for top, dists in metadata.packages_distributions().items()}
    for dist in metadata.distributions():
        name = _norm(dist.metadata["Name"])  # once: each .metadata parses the METADATA file again (18 s here)
        for file in dist.files or ():
            parts = file.parts
            # Python 3.10's packages_distributions reads top_level.txt only (scikit-learn ships none): the
            # top-level names from the files, as 3.11's does.
            if len(parts) > 1 and file.suffix == ".py" and not parts[0].endswith((".dist-info", ".data")):
                names = out.setdefault(parts[0], [])
                if name not in names:
                    names.append(name)
            if len(parts) > 2 and parts[0] == "hydra_plugins":
                names = out.setdefault(f"hydra_plugins.{parts[1]}", [])
                if name not in names:
                    names.append(name)
    return out


def distributions_of(module: str) -> list[str]:
    """The distributions that provide an imported module, read from what is installed here.

    ``hydra_plugins`` is a namespace that several distributions (hpctrain itself among them) share: its
    second component names the plugin. A module no installed distribution provides is looked up under its
    own name, which then fails the test unless a distribution of that name is declared.
    """
    parts = module.split(".")
    top = parts[0]
    if top in sys.stdlib_module_names or top == "__future__" or module.startswith("hpctrain"):
        return []
    if top == "hydra_plugins" and len(parts) > 1:
        if (ROOT / "hydra_plugins" / parts[1]).exists():
            return []
        return _providers().get(f"hydra_plugins.{parts[1]}") or [_norm(parts[1])]
    return _providers().get(top) or [_norm(top)]


def gaps(root: Path) -> list[str]:
    """One line per import whose distribution is undeclared, or extra-only and not lazy / not pip-lined."""
    decl = declared(root)
    problems = []
    for module, where, eager in imports(root):
        dists = distributions_of(module)
        if not dists:
            continue
        kinds = set().union(*(decl.get(d, set()) for d in dists))
        if not kinds:
            problems.append(
                f"{where}: imports {module!r}, whose distribution ({', '.join(dists)}) "
                "pyproject.toml does not declare"
            )
        elif "required" not in kinds:
            if eager:
                problems.append(f"{where}: imports {module!r} (extra {sorted(kinds)}) at import of hpctrain")
            extras = kinds - {"dev"}
            line = pip_line(module)
            if not any(f"hpctrain[{extra}]" in line for extra in extras):
                problems.append(f"{where}: {module!r} comes with {sorted(extras)}; its refusal says {line!r}")
    return problems


def test_every_import_of_hpctrain_is_declared_in_pyproject() -> None:
    problems = gaps(ROOT)
    assert not problems, "\n".join(problems)


def test_the_guard_finds_undeclared_and_eager_imports(tmp_path: Path) -> None:
    """The rule itself, on a tree made for it: crc32c's defect (a nested import nothing declares), an
    extra's package imported at module level, and a module no distribution provides."""
    package = tmp_path / "hpctrain"
    package.mkdir()
    # 33a5a31's declaration in short: crc32c nowhere, wandb in an extra.
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torch>=2.6"]\n'
        '[project.optional-dependencies]\nwandb = ["wandb"]\nhf = ["tokenizers"]\n'
    )
    (tmp_path / "hydra_plugins").mkdir()
    (package / "store.py").write_text(
        "def checksum(data):\n"
        "    from crc32c import crc32c\n"  # nested, as the real one was
        "    return crc32c(data)\n"
    )
    (package / "logs.py").write_text("import wandb\n")
    (package / "fine.py").write_text(
        "import os\nimport torch\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import wandb\n"
        "def tokens():\n    import tokenizers\n"
    )
    (package / "quant.py").write_text("def f():\n    import nosuchdistribution_xyz\n")
    problems = gaps(tmp_path)
    assert any("store.py:2" in p and "'crc32c'" in p and "does not declare" in p for p in problems), problems
    assert any("logs.py:1" in p and "at import of hpctrain" in p for p in problems), problems
    assert any("quant.py:2" in p and "nosuchdistribution" in p for p in problems), problems
    assert not any("fine.py" in p for p in problems), problems
