"""Bad input of issue 13 (hpctrain.config.sanity), through the command line in this process: one line on
stderr naming the key, exit 2, nothing started or created, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import refused

SLURM = "cluster=slurm_test"


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
def test_control_characters_and_unusable_run_dirs(cli, tmp_path: Path, overrides, env, words):  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    overrides = [o.replace("RUN", str(run_dir)) for o in overrides]
    env = {k: v.replace("RUN", str(run_dir)) for k, v in env.items()}
    if not any(o.startswith(("hydra.run.dir", "hydra.sweep.dir")) for o in overrides):
        overrides.append(f"hydra.run.dir={run_dir}")
    result = cli("dry_run=true", *overrides, env=env, cwd=tmp_path)
    refused(result, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was created"


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
def test_precheck_gaps(cli, tmp_path: Path, overrides: list[str], words: list[str]):  # type: ignore[no-untyped-def]
    dirs = [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]
    result = cli("dry_run=true", *overrides, *dirs, cwd=tmp_path)
    refused(result, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was created"


# --- the checks themselves, on values and typed configs
def test_the_checks_name_the_key_the_value_and_what_is_valid(tmp_path: Path) -> None:
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.config.sanity import (
        check_finite,
        check_local_cluster,
        check_text,
        check_writable_dir,
        leaves,
    )
    from hpctrain.errors import ConfigError

    check_text("k", "printable ünïcödé")
    with pytest.raises(ConfigError) as caught:
        check_text("cluster.job_name", "a\tb")
    assert str(caught.value) == (
        "cluster.job_name=a\\tb: contains the control character '\\t' (valid: printable characters only "
        "(no newline, tab, carriage return or escape))"
    )
    cfg = to_typed(compose(["++cluster.env.A=x", "model=vit", "data=digits"]))
    keys = dict(leaves(cfg))
    assert keys["cluster.env.A"] == "x" and keys["model._target_"] == "hpctrain.models.vit.ViT"
    assert "model.image_size" in keys and "optim.lr" in keys
    check_finite(cfg)
    cfg.optim.lr = float("nan")
    with pytest.raises(ConfigError, match=r"^optim\.lr=nan: must be a finite number$"):
        check_finite(cfg)
    check_local_cluster(2, "127.0.0.1")
    with pytest.raises(ConfigError, match=r"^cluster\.nproc=100000: too many local processes"):
        check_local_cluster(100000, "127.0.0.1")
    check_writable_dir("hydra.run.dir", tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # probed, nothing left behind
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_writable_dir("hydra.run.dir", tmp_path / "file" / "run")
