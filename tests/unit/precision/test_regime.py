"""The regime rule (hpctrain.precision): which numbers a run computes in, from ``trainer.precision`` and
whether FSDP shards its parameters; torch-free (a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpctrain.precision import PRECISIONS, REGIMES, regime, regimes_of, scales_loss


@pytest.mark.parametrize(
    ("precision", "sharded", "expected"),
    [
        ("fp32", False, "fp32"),
        ("fp32", True, "fp32"),
        ("bf16", False, "autocast"),
        ("bf16", True, "fsdp_mixed"),
        ("fp16", False, "autocast"),
        ("fp16", True, "fsdp_mixed"),
    ],
)
def test_the_regime_follows_precision_and_sharding(precision: str, sharded: bool, expected: str) -> None:
    assert regime(precision, sharded) == expected


def test_every_regime_a_layout_may_pick_is_proposed() -> None:
    for precision in PRECISIONS:
        for can_shard in (False, True):
            proposed = regimes_of(precision, can_shard)
            assert set(proposed) <= set(REGIMES)
            # What some layout would run in is among the proposals: unsharded always, sharded where possible.
            assert regime(precision, False) in proposed
            assert (regime(precision, True) in proposed) == (can_shard or precision == "fp32")


def test_only_fp16_scales_the_loss() -> None:
    assert [p for p in PRECISIONS if scales_loss(p)] == ["fp16"]


def test_the_rule_imports_no_torch() -> None:
    code = "import sys, hpctrain.precision; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
