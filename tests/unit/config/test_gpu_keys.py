"""Bad values of the GPU-path keys (parallel.compile_cache, trainer.precision=fp8's combinations, optim.fused,
cluster.peak_fp8_flops): one ConfigError naming key, value and what is valid, raised by the same checks the
command line runs before anything starts (in-process here: no process boundary is under test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.plan.check import check_run
from hpctrain.plan.estimate import estimate
from hpctrain.submit.precheck import check_float8_here, local_gpu_capabilities


def _config(*overrides: str) -> Config:
    return to_typed(compose(list(overrides)))


def _refused(cfg: Config) -> str:
    with pytest.raises(ConfigError) as refused:
        check_run(cfg)
    return str(refused.value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", ["parallel.compile_cache=", "empty", "valid: run"]),
        ("cache/here", ["parallel.compile_cache=cache/here", "absolute path"]),
        ("/tmp/../etc/cache", ["parallel.compile_cache=/tmp/../etc/cache", "without .."]),
        ("/tmp/cache\x1b[2J", ["parallel.compile_cache=", "control character", "'\\x1b'"]),
        ("/proc/hpctrain", ["parallel.compile_cache=/proc/hpctrain", "cannot create a directory"]),
        ("/", ["parallel.compile_cache=/", "file system root"]),
    ],
)
def test_a_bad_compile_cache_is_one_line(value: str, words: list[str]) -> None:
    cfg = _config("parallel.compile=true")
    cfg.parallel.compile_cache = value
    message = _refused(cfg)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_compile_cache_under_a_file_or_unwritable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cfg = _config()
    cfg.parallel.compile_cache = str(tmp_path / "file" / "cache")
    assert "is not a directory" in _refused(cfg)
    for fine in ("run", "off", str(tmp_path / "shared" / "cache")):
        cfg.parallel.compile_cache = fine
        check_run(cfg)
    assert not (tmp_path / "shared").exists()  # checking creates nothing


def test_fp8_combinations_that_cannot_work_are_refused() -> None:
    message = _refused(_config("trainer.precision=fp8", "parallel=tp"))
    assert message.startswith("trainer.precision=fp8: float8 layers do not split under parallel.tp=2")
    assert "valid: bf16 with tensor parallelism" in message
    message = _refused(_config("trainer.precision=fp4"))
    assert "trainer.precision=fp4" in message and "valid: fp32, bf16, fp16, fp8" in message
    check_run(_config("trainer.precision=fp8", "parallel=fsdp"))  # the layout itself is fine


def test_fused_is_adamws_only() -> None:
    message = _refused(_config("optim=sgd", "optim.fused=true"))
    assert message.startswith("optim.fused=True: the fused kernel is AdamW's; optim=sgd has none")
    check_run(_config("optim.fused=true"))


def test_a_bad_fp8_peak_is_refused_by_the_planner() -> None:
    cfg = _config("cluster=h100x64", "model=gpt2_124m", "cluster.peak_fp8_flops=-1")
    check_run(cfg)
    with pytest.raises(ConfigError, match=r"cluster.peak_fp8_flops=-1.0: must be > 0"):
        estimate(cfg)


def test_fp8_here_needs_a_float8_gpu_seen_by_the_workers() -> None:
    with pytest.raises(ConfigError, match=r"this machine has none \(valid: fp32, bf16, fp16\)"):
        check_float8_here([])
    with pytest.raises(ConfigError, match=r"this GPU is 8\.0"):
        check_float8_here([(9, 0), (8, 0)])  # a local worker may take the A100
    check_float8_here([(9, 0), (8, 9)])  # torchao is installed (dev extra)
    assert local_gpu_capabilities({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert local_gpu_capabilities({"CUDA_VISIBLE_DEVICES": "-1"}) == []
