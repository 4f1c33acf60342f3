"""``eval._target_`` in this process (hpctrain.task.evaluate): the override taken apart from the run's, the
function found or refused, and what it returns checked before anything is written. The function on a real
checkpoint, and its failures in a process: tests/e2e/task/test_evaluate.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hpctrain.errors import ConfigError
from hpctrain.rundir import eval_metrics
from hpctrain.task.evaluate import checked_metrics, metric_function, split_target

T = "mymetrics.score"


def test_the_target_is_taken_apart_from_the_runs_overrides() -> None:
    assert split_target(["trainer.eval_batches=2", "eval._target_=a.b", "x=1"]) == (
        "a.b",
        ["trainer.eval_batches=2", "x=1"],
    )
    assert split_target(["trainer.eval_batches=2"]) == (None, ["trainer.eval_batches=2"])
    with pytest.raises(ConfigError, match=r"eval\._target_=: empty"):
        split_target(["eval._target_="])


def test_the_function_is_found_or_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymetrics_unit.py").write_text(
        "def score(model, data, device):\n    return {}\n\nconstant = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert metric_function("mymetrics_unit.score").__name__ == "score"
    refused = {
        "mymetrics_unit.constant": "is a int, not a function",
        "mymetrics_unit.nope": "has no attribute 'nope'",
        "nosuchmodule_xyz.fn": "cannot be imported",
        "score": "not a dotted name",
        "a.b; rm -rf /": "not a dotted name",
    }
    for target, words in refused.items():
        with pytest.raises(ConfigError) as caught:
            metric_function(target)
        assert words in str(caught.value) and "\n" not in str(caught.value)


def test_what_it_returns_becomes_the_records_metrics() -> None:
    metrics = checked_metrics(
        T, {"bleu": 0.25, "n": 3, "acc": torch.tensor(0.5), "f1/macro": torch.tensor([0.75])}
    )
    assert metrics == {"bleu": 0.25, "n": 3.0, "acc": 0.5, "f1/macro": 0.75}
    assert eval_metrics({"step": 10, "time": 1.0, "host": "h", "eval_target": T, **metrics}) == metrics


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        ([1.0], "returned list, not a non-empty mapping"),
        ({}, "returned dict, not a non-empty mapping"),
        (None, "returned NoneType"),
        ({"score": math.nan}, "returned score=nan"),
        ({"score": math.inf}, "returned score=inf"),
        ({"score": "high"}, "returned score='high'"),
        ({"score": True}, "returned score=True"),
        ({"score": torch.ones(2)}, "returned score=tensor"),
        ({"step": 1.0}, "the metric name 'step'"),
        ({"a b": 1.0}, "the metric name 'a b'"),
        ({"x\n": 1.0}, "the metric name 'x\\n'"),
        ({3: 1.0}, "the metric name 3"),
    ],
)
def test_anything_else_is_one_line(returned: object, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        checked_metrics(T, returned)
    line = str(caught.value)
    assert line.startswith(f"eval._target_={T}: ") and words in line and "\n" not in line, line
