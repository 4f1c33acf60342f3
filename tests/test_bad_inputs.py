"""Bad input of issue 13, through the real command line: one line on stderr naming the key, exit 2, nothing
started or created, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import hpctrain

SLURM = "cluster=slurm_test"


def _refused(result, words: list[str]) -> str:  # type: ignore[no-untyped-def]
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hpctrain: ")
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


# --- control characters in values that reach a shell, a path or an #SBATCH line; run dirs that cannot be
# used. (overrides, environment, words). RUN is replaced by the test's run directory.
CONTROL = [
    (["hydra.run.dir='RUN\nx'"], {}, ["hydra.run.dir=", "\\nx", "control character '\\n'"]),
    (["hydra.run.dir=${oc.env:HPCTRAIN_TEST_DIR}"], {"HPCTRAIN_TEST_DIR": "RUN\r"}, ["hydra.run.dir", "\\r"]),
    (["-m", "optim.lr=1e-3,2e-3", "hydra.sweep.dir='RUN\nx'"], {}, ["hydra.sweep.dir", "\\n"]),
    ([SLURM, "cluster.job_name='abc\n'"], {}, ["cluster.job_name", "control character"]),
    ([SLURM, "cluster.partition='gpu\n'"], {}, ["cluster.partition"]),
    ([SLURM, "cluster.setup=['module load x\n#SBATCH --x']"], {}, ["cluster.setup[0]", "\\n"]),
    (["++cluster.env.FOO='a\nb'"], {}, ["cluster.env.FOO", "\\n"]),
    (["data=tokens", "data.path='/tmp/x\ty'"], {}, ["data.path", "\\t"]),
    (["logger.wandb_project='a\x1b[2Jb'"], {}, ["logger.wandb_project=a\\x1b[2Jb", "control"]),
    (["hydra.run.dir=/"], {}, ["hydra.run.dir=/", "root"]),
    (["hydra.run.dir=/proc/hpctrain-run"], {}, ["hydra.run.dir=/proc/hpctrain-run", "cannot create"]),
]


@pytest.mark.parametrize(
    ("overrides", "env", "words"), CONTROL, ids=[repr(" ".join(o)) for o, _, _ in CONTROL]
)
def test_control_characters_and_unusable_run_dirs(tmp_path: Path, overrides, env, words):  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    overrides = [o.replace("RUN", str(run_dir)) for o in overrides]
    env = {k: v.replace("RUN", str(run_dir)) for k, v in env.items()}
    if not any(o.startswith(("hydra.run.dir", "hydra.sweep.dir")) for o in overrides):
        overrides.append(f"hydra.run.dir={run_dir}")
    result = hpctrain("dry_run=true", *overrides, env=env, cwd=tmp_path, timeout=60)
    _refused(result, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was created"


# --- cluster.setup lines are shell by design: verbatim in the job script, each on its own line
@pytest.mark.parametrize("template", ["srun", "torchrun"])
def test_setup_lines_reach_the_job_script_verbatim(tmp_path: Path, template: str):
    run_dir = tmp_path / "render"
    lines = ["source $HOME/venv/bin/activate && cd ~/proj", 'echo "$VIRTUAL_ENV" | tr a-z A-Z > ~/out']
    result = hpctrain(
        SLURM,
        "launcher=sbatch",
        f"cluster.sbatch_template={template}",
        "dry_run=true",
        "cluster.setup=[" + ",".join(f"'{line}'" for line in lines) + "]",
        f"hydra.run.dir={run_dir}",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    script = (run_dir / "job.sbatch").read_text()
    for line in lines:
        assert f"\n{line}\n" in script, script
    # Run the setup part with a HOME of the test's own: $HOME, &&, ~ and the pipe act as typed.
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "proj").mkdir()
    (home / "venv" / "bin" / "activate").write_text("export VIRTUAL_ENV=myenv\n")
    setup = script[script.index(lines[0]) : script.index(lines[1]) + len(lines[1])]
    ran = subprocess.run(
        ["bash", "-c", setup + "\npwd"], capture_output=True, text=True, env={"HOME": str(home)}
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(home / "proj")
    assert (home / "out").read_text().strip() == "MYENV"
