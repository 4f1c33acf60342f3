"""The fault policy (hpctrain.resilience.policy) as a table: fault × history × caps → action. Every fault
bench/chaos.py injects has its rows (a guard reads chaos.py for what it injects), and every kind the policy
knows is in the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpctrain.resilience import policy
from hpctrain.resilience.policy import Caps, Fail, Fault, History, Past, Requeue, Restart

REPO = Path(__file__).resolve().parents[3]
CAPS = Caps(max_restarts=2, max_no_progress=3, max_requeues=2)
BUG = "failed with exit code 1: ValueError: shapes (4, 3) and (5,) do not match"
NO_STEP = Past("was killed by SIGKILL", progress=False)

KILL = Fault(policy.KILLED, "was killed by SIGKILL", 3, "node2")
STOP = Fault(policy.HUNG, "hung: rank 1 on node1 stopped in compute at step 40", 1, "node1")
NAN_STOP = Fault(
    policy.RAISED,
    "failed with exit code 1: NonFiniteStop: loss is nan",
    2,
    "node2",
    30,
    error="NonFiniteStop",
)
PREEMPT = Fault(policy.PREEMPTED, "stopped by SIGUSR2", step=50)
LOST = Fault(policy.LOST_NODE, "lost node node2", None, "node2")
RAISE = Fault(policy.RAISED, BUG, 1, "node1", 7, error="ValueError")
SLURM = History(on_slurm=True)
USED = History(restarts_done=2, on_slurm=True)  # both restarts of CAPS used

# (what happened, fault, history, the action); the first rule that applies answers (policy's docstring).
TABLE = [
    # The classes a restart would meet again stop at once, restarts and requeues left (issue 43, item 1).
    (
        "out of memory",
        Fault(policy.OOM, "was killed by SIGKILL", 1, "node1", detail="OOM killer"),
        SLURM,
        Fail,
    ),
    ("full disk", Fault(policy.STORAGE, "failed: OSError: No space left", 0, "node1"), SLURM, Fail),
    ("refused", Fault(policy.REFUSED, "failed: ConfigError: data.path", 0, "node1"), SLURM, Fail),
    ("hpctrain's bug", Fault(policy.OWN_BUG, "failed: TypeError: x", 0, "node1"), SLURM, Fail),
    # The node's view of the storage, a rendezvous that could not connect: restarted; the node goes later.
    ("stale handle, restarts left", Fault(policy.IO, "failed: OSError: Stale", 2, "node2"), SLURM, Restart()),
    (
        "stale handle, restarts used",
        Fault(policy.IO, "failed: OSError: Stale", 2, "node2"),
        USED,
        Requeue(("node2",)),
    ),
    ("store unreachable", Fault(policy.NETWORK, "failed: DistNetworkError", 0, "node1"), SLURM, Restart()),
    # chaos.py's SIGKILL: a restart inside the allocation, then a requeue without the node, then the end.
    ("kill, restarts left", KILL, SLURM, Restart()),
    ("kill, restarts used", KILL, USED, Requeue(("node2",))),
    ("kill, requeues used", KILL, History(restarts_done=2, requeues_done=2, on_slurm=True), Fail),
    ("kill, here, restarts used", KILL, History(restarts_done=2), Fail),
    (
        "kill at the same step twice: no bug of the run's",
        Fault(policy.KILLED, KILL.cause, 3, "node2", step=7),
        History((Past(KILL.cause, 7),), 1, on_slurm=True),
        Restart(),
    ),
    # chaos.py's SIGSTOP: a hang the watchdog names; its node goes when the job is requeued.
    ("hang, restarts left", STOP, SLURM, Restart()),
    # A second hang on the same node: a restart would land on it again; the job goes without it (issue 43).
    (
        "hang again on the same node",
        STOP,
        History((Past(STOP.cause, kind=policy.HUNG, host="node1"),), 1, on_slurm=True),
        Requeue(("node1",)),
    ),
    (
        "hang again, another node",
        STOP,
        History((Past(STOP.cause, kind=policy.HUNG, host="node2"),), 1, on_slurm=True),
        Restart(),
    ),
    (
        "hang again on the same node, here",
        STOP,
        History((Past(STOP.cause, kind=policy.HUNG, host="node1"),), 1),
        Restart(),
    ),
    ("hang, restarts used", STOP, USED, Requeue(("node1",))),
    # chaos.py's NaN under trainer.nonfinite=stop: final, whatever is left (under skip it is no fault).
    ("non-finite stop", NAN_STOP, SLURM, Fail),
    (
        "refused checkpoint",
        Fault(policy.RAISED, "CheckpointMismatch", error="CheckpointMismatch"),
        SLURM,
        Fail,
    ),
    # chaos.py's pre-emption: never a restart in an allocation that is going away; a requeue, no exclusion.
    ("pre-emption", PREEMPT, SLURM, Requeue()),
    ("pre-emption, requeues used", PREEMPT, History(requeues_done=2, on_slurm=True), Fail),
    (
        "pre-emptions before any step: no crash loop",
        PREEMPT,
        History((NO_STEP,) * 5, on_slurm=True),
        Requeue(),
    ),
    # chaos.py's lost node (spares: a restart that replaces it; too few nodes: a requeue without it).
    ("lost node, restarts left", LOST, SLURM, Restart()),
    ("lost node, restarts used", LOST, USED, Requeue(("node2",))),
    # Crash loops: max_no_progress attempts in a row without a new step, restarts and requeues alike.
    (
        "third attempt without a step",
        Fault(policy.KILLED, "x", progress=False),
        History((NO_STEP,) * 2),
        Fail,
    ),
    (
        "second attempt without a step",
        Fault(policy.KILLED, "x", progress=False),
        History((NO_STEP,)),
        Restart(),
    ),
    (
        "a step made in between",
        Fault(policy.KILLED, "x", progress=False),
        History((NO_STEP, Past("y"), NO_STEP)),
        Restart(),
    ),
    ("a step made now", KILL, History((NO_STEP,) * 5), Restart()),
    # The run's own bug: the same raised error at the same step again.
    ("a raised error", RAISE, SLURM, Restart()),
    ("the same error at the same step", RAISE, History((Past(BUG, 7),), 1, on_slurm=True), Fail),
    ("the same error at another step", RAISE, History((Past(BUG, 9),), 1, on_slurm=True), Restart()),
    ("another error at the same step", RAISE, History((Past("OSError", 7),), 1, on_slurm=True), Restart()),
    # The rest of the kinds: an exit with no record, a peer's symptom, a node failing its health check.
    ("exit without a record", Fault(policy.EXITED, "exited with code 1"), USED, Requeue()),
    ("peer's symptom", Fault(policy.PEER, "failed with exit code 1: Connection reset"), USED, Requeue()),
    ("unhealthy node", Fault(policy.UNHEALTHY, "nvidia-smi failed", 0, "node3"), USED, Requeue(("node3",))),
]


@pytest.mark.parametrize(
    ("fault", "history", "expected"), [row[1:] for row in TABLE], ids=[r[0] for r in TABLE]
)
def test_the_policy_answers_each_fault_by_its_table(fault: Fault, history: History, expected: object):
    action = policy.decide(fault, history, CAPS)
    if expected is Fail:
        assert isinstance(action, Fail) and action.why, action
    else:
        assert action == expected


def test_each_stop_names_its_error_and_says_why_in_one_line():
    crash = policy.decide(Fault(policy.KILLED, "x", progress=False), History((NO_STEP,) * 2), CAPS)
    assert crash == Fail(policy.CRASH_LOOP, crash.why) and crash.why.startswith(  # type: ignore[union-attr]
        "crash loop: 3 attempts in a row without a new step (cluster.max_no_progress=3); last: x"
    )
    same = policy.decide(RAISE, History((Past(BUG, 7),), 1), CAPS)
    assert isinstance(same, Fail) and same.error == policy.REPEATED
    assert same.why.startswith("not restarted: the same error at step 7 twice") and same.why.endswith(BUG)
    final = policy.decide(NAN_STOP, SLURM, CAPS)
    assert isinstance(final, Fail) and final.error == "NonFiniteStop"
    capped = policy.decide(KILL, History(restarts_done=2, requeues_done=2, on_slurm=True), CAPS)
    assert isinstance(capped, Fail) and capped.error == policy.CAPS_USED
    assert capped.why.startswith("the job was already requeued 2 times and cluster.max_requeues=2")
    here = policy.decide(KILL, History(restarts_done=2), CAPS)
    assert isinstance(here, Fail) and here.why.startswith("not restarted: 2 of cluster.max_restarts=2")
    for action in (crash, same, final, capped, here):
        assert "\n" not in action.why  # type: ignore[union-attr]


def test_every_kind_and_every_fault_chaos_injects_has_rows():
    kinds = {row[1].kind for row in TABLE}
    assert kinds == set(policy.KINDS), set(policy.KINDS) ^ kinds
    # What bench/chaos.py injects: its faults.* overrides, its signal to the job, its lost node; and its
    # failure classes (bench/chaos_classes.py).
    chaos = (REPO / "bench" / "chaos.py").read_text() + (REPO / "bench" / "chaos_classes.py").read_text()
    injected = set(re.findall(r"f?\"(faults\.\w+)=", chaos))
    injected |= {"scancel --signal"} if '"scancel", "--signal=' in chaos else set()
    injected |= {"lose_node"} if "cluster.lose_node(" in chaos else set()
    rows = {
        "faults.kill_at": "kill",
        "faults.stop_at": "hang",
        "faults.nan_at": "non-finite",
        "scancel --signal": "pre-emption",
        "lose_node": "lost node",
        "faults.oom_at": "out of memory",
    }
    assert injected == set(rows), injected ^ set(rows)  # a new fault in chaos.py needs its rows here
    names = [row[0] for row in TABLE]
    for fault, prefix in rows.items():
        assert any(name.startswith(prefix) for name in names), (fault, prefix)


def test_the_policy_is_pure():
    """No file, clock, environment, process or Slurm: its imports are the language's own."""
    tree = ast.parse((REPO / "hpctrain" / "resilience" / "policy.py").read_text())
    imported = {
        name
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert imported <= {"__future__", "dataclasses", "typing"}, imported
