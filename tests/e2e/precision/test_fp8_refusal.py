"""On a machine without float8 tensor cores, trainer.precision=fp8 is refused in one line before anything
starts (this CPU machine: no CUDA GPU at all)."""

from __future__ import annotations

from pathlib import Path

from tests.support import hpctrain


def test_fp8_without_a_float8_gpu_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = hpctrain("trainer.precision=fp8", "parallel.compile=true", f"hydra.run.dir={run}")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "hpctrain: trainer.precision=fp8: float8 training needs a CUDA GPU of compute capability ≥ 8.9 "
        "(H100, H200, L40S, L4, RTX 40xx); this machine has none (valid: fp32, bf16, fp16)"
    ]
    assert "Traceback" not in done.stdout and not run.exists()
