"""Issue 29, acceptance b, and issue 40, item 4: every command of the ``bash`` blocks of the README and of
``docs/*.md``, run as written on a fresh copy of the checkout, in order, prints no traceback and no warning
and exits 0; and the docs keep what a reader relies on (the README short and holding the commands CI runs,
every link naming a page and a heading that exist, a line per benchmark).

What the lines are: ``python -m hpctrain …`` and ``hpctrain …`` run as written (``hpctrain`` is
``python -m hpctrain`` of the copy); a command on a Slurm profile runs as a dry run (``dry_run=true``: the
whole check and the rendered submission, nothing submitted), so the test needs no cluster; ``cd DIR`` moves
the following lines of its block. The README's blocks run first, then each page of docs/ by name; a command
that an earlier block already ran (the same folder, the same arguments once the dry run is added) runs once:
the docs repeat the README's headline commands, and CI's time is counted. Not run: ``pip install`` (the
environment is the suite's own, installed once; reinstalling from the copy would change it for every other
test) and the lines that start and stop the Slurm test cluster (``python -m tests.slurm.cluster up|down``:
test infrastructure, which tests/slurm/ runs under its lock). Other fences (plain, ``python``) show output,
code or commands that cannot run here (a GPU, a cluster, a background server), not commands to run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
SLURM_PROFILES = {p.stem for p in (REPO / "conf" / "cluster").glob("*.yaml")} - {"local"}
SKIPPED = (re.compile(r"^pip install "), re.compile(r"tests\.slurm\.cluster (up|down)"))
# Commands another test runs as written, with stricter checks (exit 0, no traceback, no warning, more): run
# once in the suite, there. The named test must exist and run exactly that command (a guard below).
RUN_ELSEWHERE = {
    ("python", "-m", "hpctrain"): (
        REPO / "tests/e2e/launch/test_local.py",
        "test_bare_command_trains_and_says_where_outputs_are",
        "hpctrain(cwd=tmp_path, timeout=240)",
    ),
}
# What CI runs from the README as written (.ci/run): these lines must stay in it byte for byte.
SET_UP = "pip install -c constraints-cpu.txt -e '.[hf]' && python -m hpctrain"
TEST_COMMAND = "pip install -c constraints-cpu.txt -e '.[dev,hf]' && python -m pytest"
MAX_README_LINES = 250  # issue 40: a README a new user reads in five minutes


def pages() -> list[Path]:
    """The README, then every page of docs/ by name: the order their commands run in."""
    return [README, *sorted(DOCS.glob("*.md"))]


def bash_blocks(page: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def page_commands(page: Path) -> list[tuple[int, str, list[str]]]:
    """(block number, the folder relative to the checkout, the command) for every command line of a page."""
    commands = []
    for number, block in enumerate(bash_blocks(page)):
        folder = "."
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words:  # `A && B`: each command in turn
                cut = words.index("&&") if "&&" in words else len(words)
                command, words = words[:cut], words[cut + 1 :]
                text = shlex.join(command)
                if not command or any(p.search(text) for p in SKIPPED):
                    continue
                if command[0] == "cd":
                    folder = str(Path(folder) / command[1])
                    continue
                commands.append((number, folder, command))
    return commands


def _as_python(words: list[str]) -> tuple[str, ...]:
    return tuple(["python", "-m", "hpctrain", *words[1:]] if words[0] == "hpctrain" else words)


def _argv(words: list[str]) -> list[str]:
    if words[0] == "hpctrain":
        words = ["python", "-m", "hpctrain", *words[1:]]
    assert words[:3] == ["python", "-m", "hpctrain"], f"not an hpctrain command: {words}"
    rest = words[3:]
    on_slurm = any(w.startswith("cluster=") and w.split("=", 1)[1] in SLURM_PROFILES for w in rest)
    if on_slurm and not any(w.startswith("dry_run=") for w in rest):
        rest.append("dry_run=true")
    return [sys.executable, "-m", "hpctrain", *rest]


def commands_to_run() -> list[tuple[str, str, list[str]]]:
    """(where it is written, folder, command) of every command of every page, each distinct one once."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    runs = []
    for page in pages():
        for number, folder, words in page_commands(page):
            key = (os.path.normpath(folder), tuple(_argv(words)))
            if _as_python(words) in RUN_ELSEWHERE:
                continue
            if key not in seen:
                seen.add(key)
                runs.append((f"{page.relative_to(REPO)} block {number}", folder, words))
    return runs


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of the checkout: the files git tracks or would track, nothing a run left."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


def test_a_command_run_elsewhere_is_run_there_as_written():
    """RUN_ELSEWHERE's pointers hold: each names a test that exists and runs its command with no argument
    added (``hpctrain()`` of tests.support is ``python -m hpctrain`` of this checkout), and the command is
    still on a page (else it needs no entry)."""
    written = {_as_python(words) for page in pages() for _, _, words in page_commands(page)}
    for command, (path, name, call) in RUN_ELSEWHERE.items():
        source = path.read_text()
        assert f"def {name}(" in source, (command, path, name)
        body = source.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
        assert call in body, (command, name, call)
        assert command in written, command


def test_the_readme_and_the_docs_have_commands():
    readme = page_commands(README)
    assert len({number for number, _, _ in readme}) >= 2 and len(readme) >= 5
    in_docs = [page for page in pages()[1:] if bash_blocks(page)]
    assert len(in_docs) >= 3, in_docs
    # The docs repeat some of the README's commands: those run once.
    every = sum(len(page_commands(page)) for page in pages())
    assert len(commands_to_run()) < every


def test_the_readme_is_short_and_keeps_what_ci_runs():
    text = README.read_text()
    assert text.count("\n") <= MAX_README_LINES, f"README.md has {text.count(chr(10))} lines"
    assert any(SET_UP in block.splitlines() for block in bash_blocks(README)), (
        "the set-up line is not a bash line"
    )
    assert TEST_COMMAND in text.splitlines(), "the test command is not a line of README.md"


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading (mkdocs' toc gives the same to these pages' headings; mkdocs --strict
    checks its own): lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _unfenced(text: str) -> str:
    """The text without its fenced blocks, where `#` starts a comment, not a heading."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are code, not links."""
    return re.sub(r"`+[^`\n]*`+", "", _unfenced(text))


def test_every_link_names_a_page_and_a_heading_that_exist():
    broken = []
    for page in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", _unfenced(linked.read_text()), re.M)
                if anchor not in {github_anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def test_every_benchmark_has_one_line_in_performance():
    """docs/performance.md is a table of one line per benchmark (a script of bench/ that runs; the others are
    its helpers): its latest figure and its reference."""
    scripts = {p.name for p in (REPO / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text()}
    rows = [
        line for line in (DOCS / "performance.md").read_text().splitlines() if line.startswith("| `python ")
    ]
    named = [m.group(1) for row in rows if (m := re.match(r"\| `python bench/(\w+\.py)", row))]
    assert sorted(named) == sorted(scripts), (sorted(set(scripts) - set(named)), named)


def test_every_command_of_the_readme_and_docs_runs_as_written(checkout: Path):
    env = {**os.environ, "PYTHONPATH": str(checkout)}  # the copy's hpctrain, as an editable install of it
    env.pop("SLURM_CONF", None)
    # A new user has no persistent fork server: each local run starts its own, as theirs would (the suite's
    # serves this checkout, not the copy, and would be refused: every worker a fresh interpreter).
    env.pop("HPCTRAIN_FORKSERVER", None)
    for where, folder, words in commands_to_run():
        result = subprocess.run(
            _argv(words), cwd=checkout / folder, env=env, capture_output=True, text=True, timeout=900
        )
        shown = f"{where}, in {folder}: {shlex.join(words)}\n"
        shown += result.stdout[-2000:] + result.stderr[-3000:]
        assert result.returncode == 0, shown
        output = result.stdout + result.stderr
        assert "Traceback" not in output, shown
        assert not re.search(r"\bwarning\b", output, flags=re.I), shown
