"""Bad input of issue 13, through the real command line: one line on stderr naming the key, exit 2, nothing
started or created, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, REPO, hpctrain, worker_pids

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
def printed_script(stdout: str) -> str:
    """The job script a dry run of the sbatch launcher prints (it writes none)."""
    script = stdout.split("sbatch script (as submission would write it):\n", 1)[1]
    return script.split("\nWithout dry_run", 1)[0]


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
    script = printed_script(result.stdout)
    assert not run_dir.exists(), "a dry run writes nothing"
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


# --- secrets: a cluster.env value whose name looks secret is never recorded, yet reaches the workers
def _grep(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_secret_env_value_is_not_recorded_but_reaches_the_workers(tmp_path: Path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            *FAST,
            "trainer.max_steps=100000",
            "++cluster.env.MY_API_KEY=s3cretvalue",
            "++cluster.env.PLAIN=visible",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        environ = b""
        while b"MY_API_KEY=" not in environ:
            assert first.poll() is None and time.monotonic() < deadline, "no worker started"
            for pid in worker_pids(run_dir):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
            time.sleep(0.1)
        assert b"\0MY_API_KEY=s3cretvalue\0" in environ and b"\0PLAIN=visible\0" in environ
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert (run_dir / "config.yaml").is_file() and "visible" in (run_dir / "config.yaml").read_text()
    assert "***" in (run_dir / "config.yaml").read_text()
    assert _grep(run_dir, "s3cretvalue") == []


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_secret_env_value_stays_out_of_slurm_job_scripts(tmp_path: Path, launcher: str):
    run_dir = tmp_path / "run"
    result = hpctrain(
        SLURM,
        f"launcher={launcher}",
        "dry_run=true",
        "++cluster.env.WANDB_API_KEY=s3cretvalue",
        "++cluster.env.DB_PASSWORD_FILE=s3cretvalue",
        f"hydra.run.dir={run_dir}",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "s3cretvalue" not in result.stdout + result.stderr
    assert not run_dir.exists(), "a dry run writes nothing"


def test_launchers_pass_secrets_through_the_environment(monkeypatch: pytest.MonkeyPatch):
    from hpctrain.config.redact import export_secrets, redact_config

    for name in ("HPCTRAIN_TEST_TOKEN", "PLAIN"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # restored to its old state afterwards
    export_secrets({"HPCTRAIN_TEST_TOKEN": "t0k", "PLAIN": "x"})
    assert os.environ["HPCTRAIN_TEST_TOKEN"] == "t0k" and "PLAIN" not in os.environ
    plain = {"cluster": {"env": {"WANDB_API_KEY": "k", "A_SECRET": "s", "HOME2": "h"}}, "x": 1}
    assert redact_config(plain) == {  # and the file names which values are secret (issue 29)
        "cluster": {
            "env": {"WANDB_API_KEY": "***", "A_SECRET": "***", "HOME2": "h"},
            "secret_env": ["A_SECRET", "WANDB_API_KEY"],
        },
        "x": 1,
    }


# --- precheck gaps: numbers that are not finite, local runs this machine cannot hold, malformed sweeps
PRECHECK = [
    (["optim.lr=inf"], ["optim.lr=inf", "finite"]),
    (["optim.lr=nan"], ["optim.lr=nan", "finite"]),
    (["optim.grad_clip=nan"], ["optim.grad_clip=nan", "finite"]),
    (["cluster.nproc=100000"], ["cluster.nproc=100000", "CPU cores", "valid: 1.."]),
    (["cluster.master_addr=no-such-host.invalid"], ["cluster.master_addr=no-such-host.invalid", "resolved"]),
    (["-m", "optim.lr=1,"], ["cannot parse override 'optim.lr=1,'"]),
    (["-m", "optim.lr=1,2", "trainer.max_steps=[1"], ["cannot parse override 'trainer.max_steps=[1'"]),
]


@pytest.mark.parametrize(("overrides", "words"), PRECHECK, ids=[" ".join(o) for o, _ in PRECHECK])
def test_precheck_gaps(tmp_path: Path, overrides: list[str], words: list[str]):
    dirs = [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]
    result = hpctrain("dry_run=true", *overrides, *dirs, cwd=tmp_path, timeout=60)
    _refused(result, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was created"


@pytest.mark.parametrize("case", ["same file", "its header", "inside the input directory"])
def test_prepare_refuses_to_write_over_its_input(tmp_path: Path, case: str):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello world\n")
    made = hpctrain("prepare", str(src / "a.txt"), "--out", str(tmp_path / "a.bin"), timeout=60)
    assert made.returncode == 0, made.stderr
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    inputs, out = {
        "same file": (tmp_path / "a.bin", tmp_path / "a.bin"),
        "its header": (tmp_path / "a.json", tmp_path / "a.bin"),
        "inside the input directory": (src, src / "corpus.bin"),
    }[case]
    result = hpctrain("prepare", str(inputs), "--out", str(out), timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--out={out}" in lines[0] and "valid:" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# --- token files whose header would pass a loose check and fail (or mislead) inside the workers.
TOKEN_HEADERS = {
    "a list": "[1, 2]",
    "a null vocabulary": '{"format": "hpctrain-tokens", "version": 1, "dtype": "uint16", "vocab_size": null, '
    '"num_tokens": 4}',
    "a dtype that does not match the file size": '{"format": "hpctrain-tokens", "version": 1, '
    '"dtype": "uint32", "vocab_size": 256, "num_tokens": 4}',
    "another version": '{"format": "hpctrain-tokens", "version": 9, "dtype": "uint16", "vocab_size": 256, '
    '"num_tokens": 4}',
}


@pytest.mark.parametrize("case", list(TOKEN_HEADERS))
def test_a_token_file_with_a_bad_header_is_refused_in_one_line(tmp_path: Path, case: str):
    data = tmp_path / "corpus.bin"
    data.write_bytes(bytes(8))  # 4 uint16 tokens
    (tmp_path / "corpus.json").write_text(TOKEN_HEADERS[case])
    run = tmp_path / "run"
    result = hpctrain("data=tokens", f"data.path={data}", f"hydra.run.dir={run}")
    _refused(result, ["data.path=", "corpus"])
    assert not run.exists()


def test_a_model_larger_than_this_machine_is_refused_before_it_starts(tmp_path: Path):
    run = tmp_path / "run"
    big = ["model.d_model=8192", "model.n_heads=64", "model.n_layers=48", "cluster.nproc=2"]
    line = _refused(hpctrain(*big, f"hydra.run.dir={run}"), ["GiB per process", "this machine", "plan_check"])
    assert "× 2 processes" in line
    assert not run.exists()


def test_secret_env_value_stays_out_of_a_slurm_sweep_directory(tmp_path: Path):
    sweep = tmp_path / "sweep"
    result = hpctrain(
        "-m",
        SLURM,
        "optim.lr=1e-3,2e-3",
        "dry_run=true",
        "++cluster.env.WANDB_API_KEY=s3cretvalue",
        f"hydra.sweep.dir={sweep}",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "2 members would run (a job array)" in result.stdout
    assert "s3cretvalue" not in result.stdout + result.stderr
    assert not sweep.exists(), "a dry run writes nothing"
