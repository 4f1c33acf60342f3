"""Issue 29, item 4: the planner prices each precision at its own peak (an fp32 step at the fp32 peak, not
the bf16 one), says which, and a profile's peak keys refuse bad values in one line."""

from __future__ import annotations

import pytest

from hpctrain.cli import main
from hpctrain.config.compose import compose, to_typed
from hpctrain.plan.estimate import estimate
from hpctrain.precision import PEAKS, matmul_peak
from hpctrain.train.metrics import PEAK_FLOPS


def _time(*overrides: str):  # type: ignore[no-untyped-def]
    est = estimate(to_typed(compose(["model=gpt2_124m", *overrides])))
    assert est.time is not None
    return est.time


def test_each_precision_is_priced_at_its_own_peak() -> None:
    assert {p: matmul_peak(p) for p in ("fp32", "bf16", "fp16", "fp8")} == {
        "fp32": "fp32",  # an fp32 run keeps IEEE float32 matmuls: no TF32 (hpctrain.precision.allows_tf32)
        "bf16": "bf16",
        "fp16": "bf16",
        "fp8": "bf16",  # its float8 layers at the fp8 peak on top (tests/unit/plan/test_fp8_price.py)
    }
    for profile, fp32_peak, bf16_peak in (("a100x32", 19.5e12, 312e12), ("h100x64", 67e12, 989e12)):
        fp32 = _time(f"cluster={profile}", "trainer.precision=fp32")
        bf16 = _time(f"cluster={profile}", "trainer.precision=bf16")
        assert (fp32.peak_kind, fp32.peak) == ("fp32", fp32_peak)
        assert (bf16.peak_kind, bf16.peak) == ("bf16", bf16_peak)
        # The same model FLOPs, so the compute time is the ratio of the peaks (16× on an A100).
        assert fp32.flops_per_step == bf16.flops_per_step
        assert fp32.compute_s / bf16.compute_s == pytest.approx(bf16_peak / fp32_peak)
        assert fp32.mfu == pytest.approx(bf16.mfu, rel=0.05)  # each against its own peak


def test_the_profiles_peaks_are_the_data_sheets(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped profiles and the trainer's table of devices (MFU without a profile) agree."""
    for profile, device in (("a100x32", "A100"), ("h100x64", "H100")):
        cluster = to_typed(compose([f"cluster={profile}"])).cluster
        assert {k: cluster.peak(k) for k in PEAKS if cluster.peak(k)} == PEAK_FLOPS[device]
    assert main(["plan", "model=gpt2_124m", "cluster=a100x32", "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "19.5 TFLOP/s fp32 peak × 45% achievable" in out
    assert "of the fp32 peak (IEEE float32 matmuls: an fp32 run does not use TF32), 19.5 TFLOP/s" in out
    assert "(cluster.peak_fp32_flops)" in out


def test_a_profile_with_only_the_bf16_peak_plans_bf16_and_says_what_fp32_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A profile written before the other keys existed: peak_flops is still the bf16 peak."""
    old = ["cluster=a100x32", "cluster.peak_fp32_flops=null", "cluster.peak_tf32_flops=null"]
    assert _time(*old, "trainer.precision=bf16").peak == 312e12
    assert estimate(to_typed(compose(["model=gpt2_124m", *old]))).time is None
    assert main(["plan", "model=gpt2_124m", *old, "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert (
        "time per step: not estimated (cluster.peak_fp32_flops unknown: an fp32 run's matmuls are priced at "
        "the fp32 peak" in out
    )


BAD_PEAKS = [
    ("-1", "must be > 0"),
    ("0", "must be > 0"),
    ("nan", "must be a finite number"),
    ("inf", "must be a finite number"),
    ("''", "expected a number or null"),
    ("abc", "expected a number or null"),
    ("'1e12\x01'", "expected a number or null"),
    ("1e12\x07", "token recognition error"),
]


# The new keys; peak_flops and peak_fp8_flops go through the same checks (check_plan_inputs, config.sanity).
@pytest.mark.parametrize("key", ["peak_fp32_flops", "peak_tf32_flops"])
def test_a_bad_peak_is_one_line(key: str, capsys: pytest.CaptureFixture[str]) -> None:
    for value, why in BAD_PEAKS:
        assert main(["plan", "model=gpt", "cluster=a100x32", f"cluster.{key}={value}"]) == 2, value
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert captured.out == "" and len(lines) == 1, (value, captured)
        assert lines[0].startswith("hpctrain: ") and f"cluster.{key}=" in lines[0] and why in lines[0], lines
