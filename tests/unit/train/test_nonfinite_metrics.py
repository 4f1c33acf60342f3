"""Every step the non-finite guard skips (``trainer.nonfinite=skip``) has its line in metrics.jsonl,
``"nonfinite": true``, whether or not it falls on a logging step, and metrics.jsonl is strict JSON: its
NaN loss is ``null``, never a bare ``NaN``. One rank of ``task=train`` in this process
(hpctrain.task.train), a NaN loss at one step (``faults.nan_at``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config.compose import compose
from hpctrain.config.io import load_run_config, write_run_config
from hpctrain.launch.local import free_port
from hpctrain.rendezvous.env import DistEnv
from hpctrain.resilience.signals import StopSignals
from hpctrain.task.train import run_training
from tests.support import FAST

RUN = [
    *FAST,
    "parallel=none",
    "cluster.nproc=1",
    "trainer.max_steps=4",
    "trainer.log_every=2",
    "trainer.eval_every=0",
    "trainer.ckpt_every=0",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.nonfinite=skip",
    "logger.progress_bar=false",
]


def strict(line: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON: {line}")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.usefixtures("as_a_worker")
@pytest.mark.parametrize("bad", [3, 2], ids=["between-logging-steps", "on-a-logging-step"])
def test_every_skipped_step_is_a_strict_json_line(tmp_path: Path, bad: int) -> None:
    write_run_config(tmp_path, compose([*RUN, f"faults.nan_at=0:{bad}", f"hydra.run.dir={tmp_path}"]))
    env = DistEnv(0, 0, 1, 1, "127.0.0.1", free_port("127.0.0.1"), hostname="localhost")
    cfg = load_run_config(tmp_path / "config.yaml")  # as the worker read it
    run_training(tmp_path, env, None, StopSignals({"USR2", "TERM"}), cfg)
    records = [strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == sorted({2, 4, bad}), records
    skipped = [r for r in records if r.get("nonfinite")]
    assert [r["step"] for r in skipped] == [bad], records
    assert skipped[0]["nonfinite"] is True and skipped[0]["loss"] is None, skipped
    assert all(r["loss"] is not None and r["loss"] > 0 for r in records if r["step"] != bad)


@pytest.mark.parametrize(
    ("finite", "stops"),
    [
        ([False, False, False], True),  # every step NaN (a NaN model or loss): FAILED, not exit 0
        (
            [True, False, False],
            False,
        ),  # one finite step: the last ones skipped, as trainer.nonfinite=skip says
        ([False, True, False], False),
        ([False], True),
    ],
)
def test_a_run_whose_every_step_was_non_finite_ends_failed(finite: list[bool], stops: bool) -> None:
    """Issue 41 (b, wrong accepts): a model whose output is NaN from the first step, or a loss that returns
    NaN, ended with exit 0 and NaN logged: every step was skipped, so the run learned nothing."""
    from hpctrain.train.nonfinite import Guard, NonFiniteStop

    guard = Guard("skip", max_skips=10)
    outcome = None
    try:
        for step, ok in enumerate(finite, 1):
            if ok:
                guard.good()
            else:
                guard.bad(step, float("nan"), float("nan"), last=step == len(finite))
    except NonFiniteStop as err:
        outcome = str(err)
    assert (outcome is not None) == stops, outcome
    if stops:
        assert f"all {len(finite)} step(s) this attempt trained were non-finite" in str(outcome)
