"""The goodput ledger (hpctrain.observe.goodput): the buckets tile the wall time from the first submission,
whatever happened on the way (a restart, a requeue and its queue, a resubmission, no accounting), and
lost progress is the compute of the steps trained again."""

from __future__ import annotations

import pytest

from hpctrain.observe.goodput import BUCKETS, Attempt, ledger, summary_line
from hpctrain.slurm.commands import Instance


def attempt(
    key: str, launched: float, step: int, resumed: int = 0, job: str | None = None, **spent: float
) -> Attempt:
    """An attempt started at ``launched``: 1 s to start its interpreter, 0.5 s to join, then ``spent``."""
    phases = {"startup": 2.0, "data": 1.0, "compute": 20.0, "report": 1.0, "checkpoint": 2.0, **spent}
    joined = launched + 1.5
    return Attempt(
        key=key,
        slurm_job=job,
        launched=launched,
        rendezvous_at=launched + 1.0,
        joined=joined,
        resumed_from=resumed,
        step=step,
        load_s=0.5 if resumed else 0.0,
        first_step_s=2.2,
        median_step_s=0.2,
        spent=phases,
        written=joined + sum(phases.values()),
    )


def test_one_local_attempt_is_its_phases_end_to_end():
    book = ledger([attempt("local:a", 100.0, 100)], [], None, True)
    s = book.seconds
    assert book.wall == pytest.approx(27.5) and sum(s.values()) == pytest.approx(book.wall)
    assert s["start-up"] == pytest.approx(1.0 + 2.0) and s["rendezvous"] == pytest.approx(0.5)
    assert s["compile"] == pytest.approx(2.0) and s["productive steps"] == pytest.approx(18.0)
    assert s["data wait"] == 1.0 and s["save stall"] == 2.0 and s["logging and eval"] == 1.0
    assert s["queue wait"] == s["lost progress"] == s["restart gaps"] == 0.0
    assert book.ettr == pytest.approx(18.0 / 27.5)


def test_a_restart_counts_its_gap_and_the_steps_trained_again():
    first = attempt("local:a", 100.0, 100)  # ends at 127.5, having trained steps 1-100
    second = attempt("local:a.g1", 130.0, 200, resumed=80)  # trains 81-200: 81-100 again
    book = ledger([second, first], [], None, True)
    s = book.seconds
    assert sum(s.values()) == pytest.approx(book.wall) and book.wall == pytest.approx(57.5)
    assert s["restart gaps"] == pytest.approx(2.5)
    assert s["lost progress"] == pytest.approx(18.0 * 20 / 100)  # 20 of its 100 steps' compute
    assert s["checkpoint load"] == pytest.approx(0.5) and s["start-up"] == pytest.approx(2 * 3.0 - 0.5)
    assert s["productive steps"] == pytest.approx(18.0 - 3.6 + 18.0)


def test_slurm_queue_waits_and_a_requeue_with_its_second_wait():
    jobs = [Instance("42", 90.0, 100.0, 130.0), Instance("42", 140.0, 170.0, None)]  # requeued at 140
    first = attempt("slurm:42.0", 102.0, 100, job="42")
    second = attempt("slurm:42.1", 171.0, 150, resumed=100, job="42")
    book = ledger([first, second], jobs, 89.5, True)
    s = book.seconds
    assert book.start == 89.5 and sum(s.values()) == pytest.approx(book.wall)
    assert s["queue wait"] == pytest.approx((100.0 - 89.5) + (170.0 - 140.0))
    assert s["restart gaps"] == pytest.approx(140.0 - 129.5)  # the first's last record to the requeue
    # Each allocation to its worker's start (2 s, 1 s), then each worker's own (3 s; 2.5 s beside its load).
    assert s["start-up"] == pytest.approx(2.0 + 3.0 + 1.0 + 2.5)
    assert book.jobs == 2 and s["lost progress"] == 0.0
    assert summary_line(book).startswith("goodput: ETTR 0.33 of 109 s since submission (queue wait 37%,")


def test_without_accounting_the_queue_is_in_the_gaps_and_said():
    book = ledger([attempt("slurm:42.0", 102.0, 100, job="42")], [], 89.5, False)
    assert book.seconds["queue wait"] == 0.0 and book.seconds["restart gaps"] == pytest.approx(12.5)
    assert sum(book.seconds.values()) == pytest.approx(book.wall)
    assert "no Slurm accounting" in summary_line(book)


def test_a_resubmitted_run_starts_at_its_first_attempt():
    old = attempt("slurm:41.0", 10.0, 50, job="41")
    new = attempt("slurm:42.0", 500.0, 100, resumed=50, job="42")
    book = ledger([old, new], [Instance("42", 490.0, 499.0, None)], 490.0, True)
    assert book.start == 10.0 and sum(book.seconds.values()) == pytest.approx(book.wall)
    assert book.seconds["queue wait"] == pytest.approx(9.0)
    assert list(book.seconds) == list(BUCKETS)
