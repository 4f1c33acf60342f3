"""The record a rehearsal leaves (hpctrain.plan.rehearsal): which plans share one, what the dry run says of
it, and records that are not whole or not this version's, which are never read as a rehearsal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctrain import paths
from hpctrain.plan import rehearsal
from tests.support.configs import typed

HEADLINE = ("model=vit", "parallel=3d", "cluster=a100x32")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_one_record_per_start_up_not_per_run() -> None:
    """What shapes a rank's start-up changes the fingerprint; the run's name, schedule and time do not."""
    base = rehearsal.fingerprint(typed(*HEADLINE))
    assert (
        rehearsal.fingerprint(typed(*HEADLINE, "run=other", "trainer.max_steps=7", "cluster.time=2:00:00"))
        == base
    )
    for changed in ("parallel.tp=4", "model.n_layers=4", "trainer.micro_batch_size=8", "optim.name=sgd"):
        assert rehearsal.fingerprint(typed(*HEADLINE, changed)) != base, changed


def test_the_dry_run_line_says_whether_and_how(cache: Path) -> None:
    cfg = typed(*HEADLINE)
    assert "not rehearsed" in rehearsal.rehearsal_line(cfg) and "--rehearse" in rehearsal.rehearsal_line(cfg)
    assert rehearsal.record(cfg, 32, 8, 3.2, None) is not None
    line = rehearsal.rehearsal_line(cfg)
    assert line.startswith("Rehearsal: rehearsed on ") and "8 of 32 ranks started" in line, line
    failure = "rank 3 (pp 0 · tp 1) fails at start-up in parallelize: NotImplementedError: no"
    rehearsal.record(cfg, 32, 8, 1.0, failure)
    assert "FAILED" in rehearsal.rehearsal_line(cfg) and failure in rehearsal.rehearsal_line(cfg)
    assert [p.name for p in (cache / "rehearsals").iterdir()] == [f"{rehearsal.fingerprint(cfg)}.json"]


@pytest.mark.parametrize(
    "text",
    [
        "",  # empty
        '{"format": 1, "time": 1',  # torn
        '{"format": 99, "time": 1.0, "failure": null}',  # another version's
        '{"format": 1, "time": "yesterday", "failure": null}',  # a wrong value
        '{"format": 1, "time": 1.0, "failure": ["rank 0"]}',
        "[1, 2]",
    ],
)
def test_a_record_that_is_not_whole_or_not_ours_is_not_a_rehearsal(cache: Path, text: str) -> None:
    cfg = typed(*HEADLINE)
    path = cache / "rehearsals" / f"{rehearsal.fingerprint(cfg)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert rehearsal.recorded(cfg) is None
    assert "not rehearsed" in rehearsal.rehearsal_line(cfg)


def test_a_failure_line_with_control_characters_stays_one_line(cache: Path) -> None:
    cfg = typed(*HEADLINE)
    rehearsal.record(cfg, 32, 8, 1.0, "rank 0 fails\nat start-up \x1b[31m")
    line = rehearsal.rehearsal_line(cfg)
    assert "\n" not in line and "\x1b" not in line, repr(line)


def test_a_cache_that_cannot_be_written_costs_the_record_only(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(paths.CACHE_ENV, str(blocker))
    cfg = typed(*HEADLINE)
    assert rehearsal.record(cfg, 32, 8, 1.0, None) is None
    assert "not rehearsed" in rehearsal.rehearsal_line(cfg)
    assert not list(tmp_path.glob("**/*.tmp*"))


def test_the_default_cache_is_xdgs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(paths.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert paths.cache_dir() == tmp_path / "hpctrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "hpctrain"
