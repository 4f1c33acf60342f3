"""The writer process (``hpctrain.checkpoint.writer``) runs at nice 19 from its first instruction: its
interpreter's boot (importing torch) must not take the cores from the training ranks beside it."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.connection import Connection


def _report_priority(conn: Connection) -> None:  # the child's first act: nothing imported before it
    conn.send(os.getpriority(os.PRIO_PROCESS, 0))


def test_the_writer_process_is_born_at_nice_19_and_the_trainer_keeps_its_own() -> None:
    # Imported here: the spawned child imports this module, and a light one starts in a fraction of a second.
    from hpctrain.checkpoint.writer import NICE, _start_at_low_priority

    own = os.getpriority(os.PRIO_PROCESS, 0)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_report_priority, args=(child,), daemon=True)
    _start_at_low_priority(process)
    child.close()
    try:
        assert parent.poll(60), "the child did not report"
        assert parent.recv() == NICE
    finally:
        process.join(10)
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the training thread's own priority is untouched
