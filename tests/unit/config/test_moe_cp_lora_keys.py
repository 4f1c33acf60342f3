"""Bad values of the keys of issue 31 (model.moe.*, parallel.ep, parallel.cp, model.adapters, model.lora.*):
wrong, empty, a control character, a combination that cannot run. One ConfigError naming key, value and
what is valid, raised by the checks the command line runs before anything starts (in-process: no process
boundary is under test)."""

from __future__ import annotations

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.errors import ConfigError
from hpctrain.plan.check import check_run

MOE = "model=gpt_moe"
CASES = [
    ([MOE, "model.moe.experts=0"], ["model.moe.experts=0", "≥ 1"]),
    ([MOE, "model.moe.experts=abc"], ["model.moe.experts=abc", "int"]),
    ([MOE, "model.moe.experts=''"], ["model.moe.experts="]),
    ([MOE, "model.moe.top_k=0"], ["model.moe.top_k=0", "≥ 1"]),
    ([MOE, "model.moe.top_k=5"], ["model.moe.top_k=5", "4 experts", "valid: 1 … 4"]),
    ([MOE, "model.moe.capacity=-1"], ["model.moe.capacity=-1.0", "dropless"]),
    ([MOE, "model.moe.aux_loss_weight=-1"], ["model.moe.aux_loss_weight=-1.0", "≥ 0"]),
    ([MOE, "model.moe.top_k='2\n'"], ["model.moe.top_k="]),
    ([MOE, "parallel=fsdp", "parallel.ep=3"], ["parallel.ep=3", "not divisible"]),
    ([MOE, "parallel=fsdp", "parallel.ep=-1"], ["parallel.ep=-1", "≥ 0"]),
    ([MOE, "parallel=fsdp", "parallel.ep=''"], ["parallel.ep=", "integer"]),
    ([MOE, "parallel=fsdp", "parallel.ep=2", "parallel.compile=true"], ["parallel.compile", "parallel.ep"]),
    ([MOE, "parallel=ddp", "parallel.ep=2"], ["parallel.ep=2", "parallel=ddp"]),
    (["model=gpt", "parallel=fsdp", "parallel.ep=2"], ["parallel.ep=2", "no experts", "model=gpt_moe"]),
    (["parallel=cp", "parallel.cp=3"], ["parallel=cp", "cp=3"]),
    (["parallel=ddp", "parallel.cp=2"], ["parallel.cp=2", "no cp dimension"]),
    (["parallel=cp", "parallel.cp='2\x1b'"], ["parallel.cp=", "integer"]),
    (["parallel=cp", "parallel.compile=true"], ["parallel.compile", "parallel.cp"]),
    (["model.adapters=bogus"], ["model.adapters=bogus", "valid: none, lora"]),
    (["model.adapters=''"], ["model.adapters=", "valid: none, lora"]),
    (["model.adapters='lo\tra'"], ["model.adapters=lo\\tra"]),
    (["model.adapters=lora", "model.lora.rank=0"], ["model.lora.rank=0", "≥ 1"]),
    (["model.adapters=lora", "model.lora.alpha=0"], ["model.lora.alpha=0.0", "> 0"]),
    (["model.adapters=lora", "model.lora.dropout=1"], ["model.lora.dropout=1.0", "[0, 1)"]),
    (
        ["model.adapters=lora", "model.lora.targets=['a\nb']"],
        ["model.lora.targets[0]=a\\nb", "control character"],
    ),
    (["model.adapters=lora", "model.lora.targets=['']"], ["model.lora.targets[0]=", "pattern"]),
    (["model.adapters=lora", "model.lora.targets=['attn/q']"], ["model.lora.targets[0]=attn/q"]),
    (["model.adapters=lora", "+model.lora.bogus=1"], ["model.lora.bogus", "rank, alpha, dropout, targets"]),
]


@pytest.mark.parametrize(("overrides", "words"), CASES, ids=[repr(" ".join(o)) for o, _ in CASES])
def test_a_bad_value_is_one_line_naming_it(overrides: list[str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as refused:
        check_run(to_typed(compose(overrides)))
    message = str(refused.value)
    assert "\n" not in message and all(w in message for w in words), message
