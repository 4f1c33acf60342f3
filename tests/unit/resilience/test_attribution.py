"""Failure attribution (hpctrain.resilience.attribution) as a table: exit facts → class, and the class → the
policy's answer, for every class; and the worker's error record carries what attribution reads (errno,
path, whose frame raised), from real exceptions."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

from hpctrain.errors import error_facts
from hpctrain.resilience import policy
from hpctrain.resilience.attribution import ExitFacts, classify
from hpctrain.resilience.policy import Caps, Fail, Fault, History, Requeue, Restart


def _record(kind: str, message: str, **extra: object) -> dict[str, object]:
    return {"type": kind, "message": message, **extra}


GIB = 1024**3
# (what happened, the facts, the kind, words the detail holds)
TABLE = [
    ("kill -9", ExitFacts(-signal.SIGKILL), policy.KILLED, ""),
    (
        "the OOM killer",
        ExitFacts(-signal.SIGKILL, oom_killed=True, peak_rss=int(1.5 * GIB)),
        policy.OOM,
        "by the kernel's OOM killer at 1.50 GiB peak RSS",
    ),
    (
        "the OOM killer, beside the plan's host memory of the rank",
        ExitFacts(-signal.SIGKILL, oom_killed=True, peak_rss=int(21.3 * GIB), planned=18 * GIB),
        policy.OOM,
        "by the kernel's OOM killer at 21.30 GiB peak RSS (plan: 18.00 GiB for the rank)",
    ),
    (
        "SIGTERM while an OOM kill happened elsewhere",
        ExitFacts(-signal.SIGTERM, oom_killed=True),
        policy.KILLED,
        "",
    ),
    (
        "torch's out of memory",
        ExitFacts(1, _record("OutOfMemoryError", "CUDA out of memory")),
        policy.OOM,
        "raised",
    ),
    (
        "a full disk",
        ExitFacts(1, _record("OSError", "[Errno 28] No space left", errno=errno.ENOSPC, filename="/ckpt/x")),
        policy.STORAGE,
        "no space left on the device (/ckpt/x)",
    ),
    ("over quota", ExitFacts(1, _record("OSError", "q", errno=errno.EDQUOT)), policy.STORAGE, "quota"),
    (
        "permission",
        ExitFacts(1, _record("PermissionError", "p", errno=errno.EACCES)),
        policy.STORAGE,
        "denied",
    ),
    ("a stale NFS handle", ExitFacts(1, _record("OSError", "s", errno=errno.ESTALE)), policy.IO, "stale"),
    ("a refusal", ExitFacts(1, _record("ConfigError", "data.path: x", origin="refusal")), policy.REFUSED, ""),
    (
        "the store",
        ExitFacts(1, _record("DistNetworkError", "connect() timed out")),
        policy.NETWORK,
        "rendezvous",
    ),
    (
        "an object store that does not answer",
        ExitFacts(1, _record("ReadTimeoutError", 'Read timeout on endpoint URL: "http://s3/b/step_1/x"')),
        policy.NETWORK,
        "the checkpoint store did not answer",
    ),
    (
        "a peer's reset",
        ExitFacts(1, _record("RuntimeError", "Connection reset by peer"), peer_symptom=True),
        policy.PEER,
        "",
    ),
    (
        "hpctrain's bug",
        ExitFacts(1, _record("TypeError", "x", origin="hpctrain", frame="hpctrain/train/step.py:88 in step")),
        policy.OWN_BUG,
        "in hpctrain's code at hpctrain/train/step.py:88",
    ),
    (
        "the user's bug",
        ExitFacts(1, _record("ValueError", "bad", origin="user", frame="model.py:12 in forward")),
        policy.RAISED,
        "in your code at model.py:12 in forward",
    ),
    (
        "a library's error",
        ExitFacts(1, _record("RuntimeError", "shape", origin="library")),
        policy.RAISED,
        "",
    ),
    ("no record", ExitFacts(3), policy.EXITED, ""),
]


@pytest.mark.parametrize(("what", "facts", "kind", "detail"), TABLE, ids=[row[0] for row in TABLE])
def test_each_exit_is_classified(what: str, facts: ExitFacts, kind: str, detail: str):
    found = classify(facts)
    assert found.kind == kind, (what, found)
    assert detail in found.detail, (what, found)


def test_the_causes_stay_in_a_supervisors_words():
    """The policy compares causes across attempts (the same error at the same step twice): unchanged."""
    assert classify(ExitFacts(-9, oom_killed=True)).cause == "was killed by SIGKILL"
    assert (
        classify(ExitFacts(1, _record("ValueError", "bad"))).cause
        == "failed with exit code 1: ValueError: bad"
    )


CAPS = Caps(max_restarts=2, max_no_progress=3, max_requeues=2)
SLURM = History(on_slurm=True)
# The class → the answer, with restarts and requeues left: what no restart heals stops at once.
ANSWERS = [
    (policy.OOM, Fail),
    (policy.STORAGE, Fail),
    (policy.REFUSED, Fail),
    (policy.OWN_BUG, Fail),
    (policy.IO, Restart),
    (policy.NETWORK, Restart),
    (policy.RAISED, Restart),
    (policy.KILLED, Restart),
]


@pytest.mark.parametrize(("kind", "answer"), ANSWERS)
def test_each_class_gets_its_answer(kind: str, answer: type):
    action = policy.decide(Fault(kind, "x", 1, "node2", 5), SLURM, CAPS)
    assert isinstance(action, answer), (kind, action)
    if isinstance(action, Fail):
        assert action.why.startswith("not restarted:"), action.why


def test_a_node_io_fault_past_the_restarts_requeues_without_the_node():
    action = policy.decide(Fault(policy.IO, "x", 1, "node2"), History(restarts_done=2, on_slurm=True), CAPS)
    assert action == Requeue(("node2",))


def _raise_in_user_code(tmp_path: Path) -> BaseException:
    user = tmp_path / "usermodel.py"
    user.write_text("def forward():\n    raise ValueError('bad shape')\n")
    namespace: dict[str, object] = {}
    exec(compile(user.read_text(), str(user), "exec"), namespace)
    try:
        namespace["forward"]()  # type: ignore[operator]
    except ValueError as err:
        return err
    raise AssertionError("no error")


def test_the_worker_records_whose_frame_raised_and_the_path(tmp_path: Path):
    err = _raise_in_user_code(tmp_path)
    facts = error_facts(err)
    assert facts["origin"] == "user" and facts["frame"].startswith(f"{tmp_path}/usermodel.py:2 in forward")
    try:
        os.open(tmp_path / "missing" / "x", os.O_RDONLY)
    except OSError as io_err:
        facts = error_facts(io_err)
    assert facts["errno"] == errno.ENOENT and facts["filename"] == str(tmp_path / "missing" / "x")
    from hpctrain.errors import ConfigError

    assert error_facts(ConfigError("data.path", "x", "a folder"))["origin"] == "refusal"
    try:
        policy.decide(None, SLURM, CAPS)  # type: ignore[arg-type]
    except AttributeError as own:
        facts = error_facts(own)
    assert facts["origin"] == "hpctrain" and "hpctrain/resilience/policy.py" in facts["frame"], facts


def test_a_collective_saves_failure_is_named_by_the_error_it_wraps():
    """DCP wraps a rank's failed save in a CheckpointException whose first line names only the ranks; the
    worker's record names the error inside (what attribution reads: a store that did not answer)."""
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from hpctrain.errors import underlying
    from hpctrain.rundir.objects import StoreTimeout

    try:
        raise StoreTimeout("the checkpoint store did not answer in 5 s")
    except StoreTimeout as timeout:
        inner = timeout
    wrapped = CheckpointException("save", {1: (inner, traceback.extract_tb(inner.__traceback__))})
    assert str(wrapped).startswith("CheckpointException ranks:dict_keys([1])")
    assert underlying(wrapped) is inner
    plain = ValueError("x")
    assert underlying(plain) is plain
    assert underlying(CheckpointException("save", {})).__class__ is CheckpointException
