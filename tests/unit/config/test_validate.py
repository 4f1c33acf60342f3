"""Validation (hpctrain.config.validate) through the command line in this process: every bad value, layout
and sbatch option is one line naming key, value and what is valid, exit 2, and nothing starts."""

from __future__ import annotations

from pathlib import Path

import pytest

UNTIED = "model.tie_embeddings=false"  # these pipeline cases predate tied pipelines; kept as they were
# (overrides, words the one-line message must contain)
INVALID = [
    (["trainer.max_steps=abc"], ["trainer.max_steps", "abc", "integer"]),
    (["trainer.foo=1"], ["trainer.foo", "unknown key", "max_steps"]),
    (["+trainer.bogus=1"], ["trainer.bogus", "unknown key"]),
    (["model=resnet"], ["model=resnet", "unknown option", "gpt", "vit"]),
    (["optim=adam"], ["optim=adam", "adamw", "sgd"]),
    (["foo=bar"], ["foo", "groups"]),
    (["trainer.max_steps=[1"], ["cannot parse", "trainer.max_steps=[1"]),
    (["trainer.global_batch_size=30"], ["trainer.global_batch_size=30", "16 × 2 = 32"]),
    (["trainer.global_batch_size=32", "trainer.micro_batch_size=5"], ["micro_batch_size", "5 × 2 = 10"]),
    (["cluster.nproc=0"], ["cluster.nproc=0", "≥ 1"]),
    (["parallel=none", "cluster.nproc=2"], ["cluster.nproc=2", "parallel=none"]),
    (["model=vit", "data=text"], ["data=text", "model ViT takes images", "digits"]),
    (["model=vit", "data=digits", "model.image_size=16"], ["model.image_size=16", "8×8", "valid: 8"]),
    (["model=vit", "data=digits", "model.patch_size=3"], ["model.patch_size=3", "image_size=8"]),
    (["model.n_heads=5"], ["model.n_heads=5", "d_model=64"]),
    (["model.vocab_size=100"], ["model.vocab_size=100", "256"]),
    (["trainer.precision=fp8"], ["trainer.precision=fp8", "bf16"]),
    (["optim.lr=-1"], ["optim.lr", "> 0"]),
    (["data=tokens"], ["data.path", "hpctrain prepare"]),
    (["trainer.resume=/nonexistent/step_00000010"], ["trainer.resume", "never committed"]),
    (["logger.wandb_mode=cloud"], ["logger.wandb_mode=cloud", "offline"]),
    (["faults.fail_at=soon"], ["faults.fail_at=soon", "RANK:STEP"]),
    (["+foo=1"], ["foo=1", "unknown key", "trainer"]),
    (["dry_run=maybe"], ["dry_run=maybe", "true or false"]),
    (["launcher=sbatch"], ["launcher=sbatch", "valid: auto, local"]),
    # --- parallel layouts (issue 5, item 7): the degrees, the model's divisibility, the batch, combinations
    (["parallel=2d", "cluster.nproc=3"], ["parallel.tp=2", "world size 3 is not divisible by tp=2"]),
    (
        ["parallel=3d", "parallel.dp_shard=1", "cluster.nproc=8", "model.tie_embeddings=false"],
        ["world size 8 ≠ pp=2 × dp_shard=1 × tp=2 = 4"],
    ),
    (
        ["parallel=hsdp", "parallel.dp_shard=0"],
        ["parallel.dp_replicate", "only one of dp_replicate, dp_shard"],
    ),
    (
        ["parallel=tp", "model.n_heads=3", "model.d_model=48"],
        ["model.n_heads=3", "3 attention heads", "tp=2"],
    ),
    (["parallel=tp", "data=synthetic", "model.vocab_size=255"], ["model.vocab_size=255", "255 % 2 = 1"]),
    # --- flexible walltime (issue 45, item 5): sbatch --time-min
    (
        ["cluster=slurm_test", "cluster.time_min=soon"],
        ["cluster.time_min=soon", "not a Slurm time limit", "HH:MM:SS"],
    ),
    (["cluster=slurm_test", "cluster.time_min="], ["cluster.time_min=", "not a Slurm time limit"]),
    (["cluster=slurm_test", "cluster.time_min='1\x01'"], ["cluster.time_min=1\\x01", "control character"]),
    (["cluster=slurm_test", "cluster.time_min=0"], ["cluster.time_min=0", "not a Slurm time limit"]),
    (
        ["cluster=slurm_test", "cluster.time=00:30:00", "cluster.time_min=2:00:00"],
        ["cluster.time_min=2:00:00", "longer than cluster.time=00:30:00 (30 min)", "≤ 30 min"],
    ),
    (
        ["cluster=slurm_test", "cluster.time_min=2", "cluster.signal_lead_s=150"],
        ["cluster.signal_lead_s=150", "cluster.time_min=2 is 120 s", "< 120"],
    ),
    (
        ["cluster=slurm_test", "cluster.additional.time-min=5"],
        ["cluster.additional.time-min=5", "hpctrain sets this option itself"],
    ),
    # --- sbatch options (issue 17, item 4): checked for Slurm runs (a local run has no sbatch)
    (
        ["cluster=slurm_test", "cluster.additional.output=x"],
        ["cluster.additional.output=x", "hpctrain sets this option itself"],
    ),
    (
        ["cluster=slurm_test", "cluster.additional.comment='a;b'"],
        ["cluster.additional.comment=a;b", "a shell or sbatch would act"],
    ),
    (
        ["cluster=slurm_test", "cluster.additional.Bad_Name=1"],
        ["cluster.additional.Bad_Name=1", "not an sbatch long option"],
    ),
    (["cluster=slurm_test", "cluster.mail_type=SOMETIMES"], ["cluster.mail_type=SOMETIMES", "END, FAIL"]),
    (
        ["cluster=slurm_test", "cluster.mail_user=nobody"],
        ["cluster.mail_user=nobody", "not an e-mail address"],
    ),
    (
        ["cluster=slurm_test", "cluster.dependency=after:abc"],
        ["cluster.dependency=after:abc", "afterok:1234"],
    ),
    (["cluster=slurm_test", "cluster.gpus_per_task=0"], ["cluster.gpus_per_task=0", "≥ 1"]),
    (
        ["cluster=slurm_test", "cluster.gres='gpu a100'"],
        ["cluster.gres=gpu a100", "a shell or sbatch would act"],
    ),
    (["parallel=tp", "parallel.tp_plan={layers: spread}"], ["parallel.tp_plan[layers]=spread", "colwise"]),
    (["parallel=tp", "parallel.tp_plan={a..b: colwise}"], ["parallel.tp_plan=a..b", "module-name pattern"]),
    (["parallel=tp", "parallel.tp_plan={nosuch: colwise}"], ["parallel.tp_plan[nosuch]", "names no module"]),
    (
        ["parallel=pp", "model.n_layers=3", "model.tie_embeddings=false"],
        ["model.n_layers=3", "2 pipeline stages", "valid: a multiple of 2"],
    ),
    (
        [
            "parallel=pp",
            "parallel.schedule=interleaved_1f1b",
            "model.n_layers=2",
            "model.tie_embeddings=false",
        ],
        ["model.n_layers=2", "4 pipeline stages", "parallel.pp=2 × 2 per rank"],
    ),
    (
        [
            "parallel=pp",
            "model.tie_embeddings=false",
            "trainer.global_batch_size=12",
            "trainer.micro_batch_size=2",
        ],
        ["trainer.global_batch_size=12", "× parallel.microbatches = 2 × 1 × 4 = 8"],
    ),
    (
        ["parallel=pp", "model.tie_embeddings=false", "parallel.microbatches=1"],
        ["parallel.microbatches=1", "≥ 2"],
    ),
    (
        [
            "parallel=pp",
            "model.tie_embeddings=false",
            "parallel.schedule=gpipe",
            "parallel.stages_per_rank=2",
        ],
        ["parallel.stages_per_rank=2", "gpipe runs 1 per rank"],
    ),
    (["parallel=pp", "parallel.schedule=dualpipe"], ["parallel.schedule=dualpipe", "zbv_zero_bubble"]),
    (["parallel=fsdp", "parallel.compression=topk"], ["parallel.compression=topk", "DDP's", "parallel=fsdp"]),
    (["parallel=ddp", "parallel.cpu_offload=true"], ["parallel.cpu_offload=True", "no FSDP"]),
    (["parallel=ddp", "parallel.tp=2"], ["parallel.tp=2", "parallel=ddp has no tp dimension", "tp, 2d, 3d"]),
    (["parallel=zero4"], ["parallel=zero4", "fsdp", "3d"]),
    # --- a lost node (issue 27, item 2): spares and shrinking
    (["cluster=slurm_test", "cluster.spare_nodes=-1"], ["cluster.spare_nodes=-1", "≥ 0"]),
    (["cluster=slurm_test", "cluster.spare_nodes="], ["cluster.spare_nodes=", "integer"]),
    (["cluster=slurm_test", "cluster.spare_nodes=one"], ["cluster.spare_nodes=one", "integer"]),
    (["cluster=slurm_test", "cluster.spare_nodes=\x01"], ["cluster.spare_nodes=", "\\x01"]),
    (
        ["cluster=slurm_test", "cluster.spare_nodes=1", "cluster.max_restarts=0"],
        ["cluster.spare_nodes=1", "cluster.max_restarts ≥ 1"],
    ),
    (["cluster.spare_nodes=1", "cluster.max_restarts=1"], ["cluster.spare_nodes=1", "cluster.kind=local"]),
    (["cluster=slurm_test", "cluster.min_nodes=3"], ["cluster.min_nodes=3", "more than cluster.nodes=2"]),
    (
        [
            "cluster=slurm_test",
            "cluster.min_nodes=1",
            "cluster.max_restarts=1",
            "parallel=2d",
            "parallel.tp=4",
            "model.n_heads=4",
        ],
        ["cluster.min_nodes=1", "on 1 node the layout cannot run", "tp=4"],
    ),
    (
        [
            "cluster=slurm_test",
            "cluster.spare_nodes=1",
            "cluster.max_restarts=1",
            "launcher=sbatch",
            "cluster.sbatch_template=torchrun",
        ],
        ["cluster.spare_nodes=1", "torchrun"],
    ),
]


@pytest.mark.parametrize(("overrides", "words"), INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_input_is_one_line_and_starts_nothing(
    cli, tmp_path: Path, overrides: list[str], words: list[str]
):  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    result = cli(*overrides, f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hpctrain: ")
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in result.stdout + result.stderr
    assert not run_dir.exists(), "a run directory was created, so something started"


def test_unwritable_run_dir_is_rejected(cli, tmp_path: Path):  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = cli(f"hydra.run.dir={blocker}/run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hpctrain: hydra.run.dir={blocker}/run: cannot create a directory there: "
        f"{blocker} is not a directory"
    )
