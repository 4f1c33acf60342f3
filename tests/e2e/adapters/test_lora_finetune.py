"""docs/weights.md's fine-tuning recipe through the real command line: pretrain, then ``model.init_from`` +
``model.adapters=lora`` on 2 processes under FSDP. The fine-tuning checkpoints hold the adapters alone (the
base is read from init_from at every start); a run killed after its step-4 checkpoint resumes to the losses
of an uninterrupted one; ``hpctrain export --merge`` writes the base with the adapters folded in, and
``--adapters-only`` a PEFT folder that ``PeftModel.from_pretrained`` puts on the base to the same logits. A
transformers Llama takes adapters by its own module names, and its merged export loads with
``from_pretrained``; a user's ``_target_`` returning a PEFT model trains its adapters only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hpctrain.config.io import load_run_config
from hpctrain.models import build_model
from hpctrain.rundir import RunDir
from hpctrain.weights.load import read_checkpoint_model
from tests.support import CLI, hpctrain, metrics
from tests.support.user_project import user

peft = pytest.importorskip("peft")

TINY = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.seq_len=32",
    "data=synthetic",
    "data.num_samples=256",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "logger=jsonl",
]
LORA = ["model.adapters=lora", "model.lora.rank=4", "model.lora.alpha=8", "optim.lr=1e-2"]
ADAPTERS = [f"layers.{i}.attn.{m}.lora_{x}.weight" for i in (0, 1) for m in ("q", "v") for x in "AB"]


def _logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain run (no adapters) of 4 steps: the base that fine-tuning starts from, and the run without
    adapters that ``--merge`` refuses. Read only, by every test that takes it."""
    pre = tmp_path_factory.mktemp("pretrained") / "pre"
    done = hpctrain(*TINY, "cluster.nproc=1", "parallel=none", "trainer.max_steps=4", f"hydra.run.dir={pre}")
    assert done.returncode == 0, done.stderr
    return pre


def test_init_from_then_lora_resumes_exactly_and_exports(pretrained: Path, tmp_path: Path, cli: CLI) -> None:
    pre, ref, run = pretrained, tmp_path / "ref", tmp_path / "run"
    tune = [
        *TINY,
        *LORA,
        f"model.init_from={pre}",
        "cluster.nproc=2",
        "parallel=fsdp",
        "trainer.max_steps=8",
        "trainer.ckpt_every=4",
    ]
    whole = hpctrain(*tune, f"hydra.run.dir={ref}")
    assert whole.returncode == 0, whole.stderr
    first = hpctrain(*tune, "faults.fail_at=0:5", f"hydra.run.dir={run}")
    assert first.returncode == 1 and "injected failure at step 5" in first.stderr, first.stderr
    # What a fine-tuning checkpoint holds: the adapters (their optimizer state beside), no base weight.
    assert sorted(read_checkpoint_model(run / "checkpoints" / "step_00000004")) == sorted(ADAPTERS)
    second = hpctrain(*tune, f"hydra.run.dir={run}")
    assert second.returncode == 0, second.stderr
    log = (run / "logs" / "rank0.log").read_text()
    assert "Resumed from" in log and "Initialised the model from" in log
    ref_losses = {r["step"]: r["loss"] for r in metrics(ref)}
    losses = {r["step"]: r["loss"] for r in metrics(run)}
    assert sorted(losses) == list(range(1, 9))
    for step, loss in ref_losses.items():
        assert losses[step] == pytest.approx(loss, rel=1e-6, abs=0), step

    merged, adapters, base = tmp_path / "merged", tmp_path / "adapters", tmp_path / "base"
    for args in (["--merge"], ["--adapters-only"]):
        out = merged if args == ["--merge"] else adapters
        done = cli("export", str(run), "--to", str(out), *args)  # no process boundary under test: in-process
        assert done.returncode == 0, done.stderr
    assert cli("export", str(pre), "--to", str(base)).returncode == 0
    assert json.loads((adapters / "adapter_config.json").read_text())["r"] == 4
    # generate of the run (issue 41: it refused, "36 missing … 8 unexpected"): the merged export's text.
    prompt = ["--prompt", "def ", "--max-new-tokens", "12", "--temperature", "0"]
    from_run, from_export = cli("generate", str(run), *prompt), cli("generate", str(merged), *prompt)
    assert from_run.returncode == 0 and from_export.returncode == 0, from_run.stderr + from_export.stderr
    assert from_run.stdout == from_export.stdout and from_run.stdout.startswith("def "), from_run.stdout
    # Merged: W + (alpha / rank) · B A, every other weight the base's.
    lora = read_checkpoint_model(run / "checkpoints" / "step_00000008")
    got, was = load_file(str(merged / "model.safetensors")), load_file(str(base / "model.safetensors"))
    for name in got:
        module = name.removesuffix(".weight")
        if f"{module}.lora_A.weight" in lora:
            delta = 2.0 * lora[f"{module}.lora_B.weight"] @ lora[f"{module}.lora_A.weight"]
            assert delta.abs().max() > 0
            torch.testing.assert_close(got[name], was[name] + delta, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(got[name], was[name]), name
    # PEFT puts the adapters on the base model: the merged model's logits.
    cfg = load_run_config(RunDir(run).config)
    plain, on_base = build_model(cfg.model), build_model(cfg.model)
    plain.load_state_dict(got, strict=False)
    on_base.load_state_dict(was, strict=False)
    adapted = peft.PeftModel.from_pretrained(on_base, str(adapters))
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(adapted, x), _logits(plain, x), rtol=1e-5, atol=1e-5)


def test_bad_export_flags_are_one_line(pretrained: Path, tmp_path: Path, cli: CLI) -> None:
    run, plain = tmp_path / "run", pretrained
    common = [*TINY, "cluster.nproc=1", "parallel=none", "trainer.max_steps=1"]
    assert hpctrain(*common, *LORA, f"hydra.run.dir={run}").returncode == 0
    for args, words in [
        ([str(run)], ["RUN_DIR=", "model.adapters=lora", "valid: --merge or --adapters-only"]),
        ([str(plain), "--merge"], ["--merge=True", "trained no adapters"]),
        ([str(run), "--adapters-only", "--format", "pt"], ["--format=pt", "valid: safetensors"]),
    ]:
        done = cli("export", *args, "--to", str(tmp_path / "out"))  # a refusal: in-process
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words), done.stderr
        assert not (tmp_path / "out").exists()


def test_a_transformers_llama_takes_adapters_by_its_own_names(
    project: Path, tmp_path: Path, cli: CLI
) -> None:
    from transformers import AutoModelForCausalLM

    run, merged, adapters = tmp_path / "run", tmp_path / "merged", tmp_path / "adapters"
    done = user(
        project,
        "model=llama_tiny",
        "data=bytes",
        "data.max_bytes=60000",
        "trainer.max_steps=3",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=2",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "logger=jsonl",
        "cluster.nproc=2",
        "parallel=ddp",
        *LORA,
        "model.lora.targets=[q_proj,v_proj]",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for args, out in ((["--merge", "--format", "hf"], merged), (["--adapters-only"], adapters)):
        exported = cli("export", str(run), "--to", str(out), *args, cwd=project)
        assert exported.returncode == 0, exported.stderr
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM" and len(config["target_modules"]) == 8  # 4 layers × q, v
    theirs = AutoModelForCausalLM.from_pretrained(merged)
    saved = read_checkpoint_model(run / "checkpoints" / "step_00000003")
    sys.path.insert(0, str(project))
    base = build_model(load_run_config(RunDir(run).config).model)
    base.load_state_dict({k: v for k, v in saved.items() if ".lora_" not in k}, strict=False)
    adapted = peft.PeftModel.from_pretrained(base, str(adapters))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(adapted, x), _logits(theirs, x), rtol=1e-5, atol=1e-5)


PEFT_MODEL = """
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def llama_lora(rank: int = 4):
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=rank, target_modules=["q_proj", "v_proj"]))
"""


def test_a_peft_model_as_target_trains_its_adapters_only(project: Path, tmp_path: Path) -> None:
    """A user's ``_target_`` that returns a PEFT model: its base arrives frozen and stays as built."""
    from hpctrain.checkpoint.state import seed_everything

    (project / "mynets" / "peft_llama.py").write_text(PEFT_MODEL)
    (project / "conf" / "model" / "peft_llama.yaml").write_text("_target_: mynets.peft_llama.llama_lora\n")
    run = tmp_path / "run"
    done = user(
        project,
        "model=peft_llama",
        "data=bytes",
        "data.max_bytes=60000",
        "trainer.max_steps=2",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=2",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "logger=jsonl",
        "cluster.nproc=2",
        "parallel=fsdp",
        "optim.lr=1e-2",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    saved = read_checkpoint_model(run / "checkpoints" / "step_00000002")
    sys.path.insert(0, str(project))
    cfg = load_run_config(RunDir(run).config)
    seed_everything(cfg.trainer.seed)  # the trainer's seed before it builds the model
    built = build_model(cfg.model).state_dict()
    trained = [n for n in saved if ".lora_" in n]
    assert trained and all(not torch.equal(saved[n], built[n]) for n in trained if "lora_B" in n)
    for name, tensor in saved.items():
        if ".lora_" not in name:
            assert torch.equal(tensor, built[name]), name


# GPT-2 (transformers, from a config: examples/user_project's gpt2_tiny) fine-tuned from hpctrain's own hf
# export. Its projections are transformers' Conv1D (weight [in, out]); c_attn is one fused q/k/v projection,
# which stays whole under tensor parallelism (no plan of transformers' own for GPT-2), the MLP is split.
GPT2_DATA = ["model=gpt2_tiny", "data=bytes", "data.max_bytes=20000", "trainer.global_batch_size=8",
             "trainer.micro_batch_size=4", "trainer.eval_every=0", "trainer.eval_batches=1", "logger=jsonl",
             "trainer.log_every=1"]  # fmt: skip
# Its adapters, packed as a command line reads (a table of overrides).
GPT2_LORA = ["model.adapters=lora", "model.lora.rank=4", "model.lora.alpha=8",
             "model.lora.targets=[c_attn,c_fc]", "optim.lr=3e-2", "optim.warmup_steps=0",
             "trainer.max_steps=6"]  # fmt: skip
GPT2_TP = "parallel.tp_plan={transformer.h.*.mlp.c_fc: colwise, transformer.h.*.mlp.c_proj: rowwise}"


def test_gpt2_from_its_export_fine_tunes_under_fsdp_and_tp_and_exports_for_transformers_and_peft(
    project: Path, tmp_path: Path, cli
) -> None:  # type: ignore[no-untyped-def]
    """Issue 31, acceptance c: the base stays bitwise what the export holds, the loss falls, the merged
    export loads in transformers and the adapters in PEFT, both to the logits of the run's own model."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hpctrain.models.adapters import add_lora

    pre, base = tmp_path / "pre", tmp_path / "base"
    done = user(
        project, *GPT2_DATA, "cluster.nproc=1", "parallel=none", "trainer.max_steps=1", f"hydra.run.dir={pre}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert cli("export", str(pre), "--to", str(base), "--format", "hf", cwd=project).returncode == 0
    base_weights = load_file(str(base / "model.safetensors"))
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    layouts = {"fsdp": ["parallel=fsdp"], "tp": ["parallel=tp", GPT2_TP]}
    runs: dict[str, Path] = {}
    for name, layout in layouts.items():
        run = runs[name] = tmp_path / name
        done = user(
            project,
            *GPT2_DATA,
            *GPT2_LORA,
            *layout,
            f"model.init_from={base}",
            "cluster.nproc=2",
            f"hydra.run.dir={run}",
        )
        assert done.returncode == 0, (name, done.stderr[-3000:])
        # 4 adapted Conv1D of 64 → 192 (c_attn) and 64 → 256 (c_fc): A is 4 × 64, B out × 4.
        adapters_numel = 2 * (4 * 64 + 192 * 4) + 2 * (4 * 64 + 256 * 4)
        said = f"{sum(base_weights[k].numel() for k in base_weights) + adapters_numel:,} parameters, "
        assert said + f"{adapters_numel:,} trained (adapters" in (run / "logs" / "rank0.log").read_text()
        losses = {r["step"]: r["loss"] for r in metrics(run)}
        assert sum(losses[s] for s in (4, 5, 6)) < sum(losses[s] for s in (1, 2, 3)) - 0.15, (name, losses)
        # What trained: the adapters alone, every one moved from where it started.
        trained = read_checkpoint_model(run / "checkpoints" / "step_00000006")
        targets = [f"transformer.h.{i}.{m}" for i in (0, 1) for m in ("attn.c_attn", "mlp.c_fc")]
        assert sorted(trained) == sorted(f"{t}.lora_{x}.weight" for t in targets for x in "AB"), name
        assert all(trained[f"{t}.lora_B.weight"].abs().max() > 0 for t in targets), name
        merged, adapters = tmp_path / f"{name}-merged", tmp_path / f"{name}-adapters"
        for flags, out in ((["--merge", "--format", "hf"], merged), (["--adapters-only"], adapters)):
            exported = cli("export", str(run), "--to", str(out), *flags, cwd=project)
            assert exported.returncode == 0, (name, exported.stderr)
        # The base bitwise as exported: every weight but the adapted ones; those W + 2 (B A)ᵀ (Conv1D).
        folded = load_file(str(merged / "model.safetensors"))
        assert sorted(folded) == sorted(base_weights), name
        for key, tensor in folded.items():
            module = key.removesuffix(".weight")
            if module in targets:
                delta = 2.0 * (trained[f"{module}.lora_B.weight"] @ trained[f"{module}.lora_A.weight"]).T
                torch.testing.assert_close(tensor, base_weights[key] + delta, rtol=1e-6, atol=1e-7)
            else:
                assert torch.equal(tensor, base_weights[key]), (name, key)
        # The run's own model: hpctrain builds it from the run's config, the base, the adapters.
        sys.path.insert(0, str(project))
        cfg = load_run_config(RunDir(run).config)
        own = build_model(cfg.model)
        own.load_state_dict(base_weights, strict=False)  # lm_head is tied to wte
        add_lora(own, cfg.model.lora)
        own.load_state_dict(trained, strict=False)
        expected = _logits(own.eval(), x)
        theirs = AutoModelForCausalLM.from_pretrained(str(merged)).eval()
        torch.testing.assert_close(_logits(theirs, x), expected, rtol=1e-5, atol=1e-5)
        on_base = peft.PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(str(base)), str(adapters)
        )
        torch.testing.assert_close(_logits(on_base.eval(), x), expected, rtol=1e-5, atol=1e-5)
    # Two layouts of the same 6 steps: the math of one process, to rounding.
    fsdp, tp = ({r["step"]: r["loss"] for r in metrics(runs[n])} for n in ("fsdp", "tp"))
    assert all(abs(fsdp[s] - tp[s]) < 1e-5 for s in fsdp), (fsdp, tp)
