"""Watching jobs (hpctrain.slurm.watch) against fake clients: one ``squeue`` of the user's jobs per interval,
shared through the user's cache by every watcher; a job missing from it asked once; a torn, foreign or
unwritable snapshot never answers."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hpctrain.slurm import commands, watch
from tests.support.fake_slurm import FAKE, Fake

QUEUE = (
    "12_0|RUNNING|node1|1:00|None|2026-12-07T10:00:00\n"
    "12_1|PENDING||0:00|JobHeldUser|N/A\n"
    "13|RUNNING|node2|0:10|None|x\n"
)


@pytest.fixture
def clients(fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    """The fake clients of a login node: sbatch and scancel besides, and a Slurm configuration file."""
    for name in ("sbatch", "scancel"):
        path = Path(os.environ["FAKE_DIR"]) / name
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    fake.answer("squeue", QUEUE)
    return fake


def forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """As another process would start: nothing learnt in this one."""
    for name in ("_final", "_direct", "_own"):
        monkeypatch.setattr(watch, name, {})


def squeues(fake: Fake) -> list[str]:
    return [c for c in fake.calls() if c.startswith("squeue")]


def test_watchers_share_one_squeue_of_the_users_jobs_per_interval(
    clients: Fake, monkeypatch: pytest.MonkeyPatch
):
    states = watch.watched_states(["12", "13"])
    assert sorted(states) == ["12_0", "12_1", "13"]  # an array's id: its members, as job_states answers
    assert states["12_1"].reason == "JobHeldUser" and states["13"].state == "RUNNING"
    forget(monkeypatch)  # a second watcher, in another process: the snapshot file answers it
    assert watch.watched_states(["13"])["13"].state == "RUNNING"
    assert squeues(clients) == ["squeue --noheader --array --me --format %i|%T|%N|%M|%r|%S"]

    taken = json.loads(next(watch.cache_dir().glob("slurm-watch/*.json")).read_text())["taken"]
    monkeypatch.setattr(watch.time, "time", lambda: taken + watch.INTERVAL_S)  # stale: a new snapshot
    watch.watched_states(["13"])
    assert len(squeues(clients)) == 2


def test_a_job_gone_from_the_queue_is_asked_once_and_its_end_kept(
    clients: Fake, monkeypatch: pytest.MonkeyPatch
):
    clients.answer("sacct", "14|COMPLETED|0:0|node1|00:01:00\n")
    clients.answer("squeue", QUEUE)  # 14 is not in it: ended (or submitted after the snapshot)
    assert watch.watched_states(["14"])["14"].state == "COMPLETED"
    asked = len(clients.calls())
    taken = json.loads(next(watch.cache_dir().glob("slurm-watch/*.json")).read_text())["taken"]
    for later in (1.0, watch.INTERVAL_S + 1):
        monkeypatch.setattr(watch.time, "time", lambda later=later: taken + later)
        assert watch.watched_states(["14"])["14"].state == "COMPLETED"
    # The fresh snapshot answered nothing about 14 and nothing asked of it again: one squeue more, no sacct.
    assert [c.split()[0] for c in clients.calls()[asked:]] == ["squeue"]


def test_a_job_submitted_after_the_snapshot_is_asked_directly_once_per_interval(
    clients: Fake, monkeypatch: pytest.MonkeyPatch
):
    watch.watched_states(["13"])  # the snapshot: 15 is not in it yet
    clients.answer("squeue", "15|PENDING||0:00|Priority|N/A\n")
    for _ in range(3):
        assert watch.watched_states(["15"])["15"].state == "PENDING"
    direct = [c for c in squeues(clients) if "--jobs 15" in c]
    assert len(direct) == 1 and len(squeues(clients)) == 2


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{",
        '{"taken": "soon", "queue": {}}',
        '{"taken": 1e99, "queue": {}}',
        '{"taken": 0, "queue": {"1": {"x": 1}}}',
    ],
    ids=["empty", "torn", "not-a-time", "from-the-future", "another-version"],
)
def test_a_torn_foreign_or_future_snapshot_never_answers(
    clients: Fake, monkeypatch: pytest.MonkeyPatch, content: str
):
    watch.watched_states(["13"])
    (snapshot,) = watch.cache_dir().glob("slurm-watch/*.json")
    snapshot.write_text(
        content.replace('"taken": 0', f'"taken": {json.loads(snapshot.read_text())["taken"]}')
    )
    forget(monkeypatch)
    assert watch.watched_states(["13"])["13"].state == "RUNNING"
    assert len(squeues(clients)) == 2  # the bad file was not read as an answer: a new snapshot replaced it
    assert json.loads(snapshot.read_text())["queue"]["13"]["state"] == "RUNNING"


def test_a_snapshot_another_user_wrote_is_not_read(clients: Fake, monkeypatch: pytest.MonkeyPatch):
    """A cache folder others may write (HPCTRAIN_CACHE on a shared disk): their file, however fresh, could
    say a job ended (and an evaluation's checkpoint be pruned); it is never an answer."""
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root (CI runs as root)")
    watch.watched_states(["13"])
    (snapshot,) = watch.cache_dir().glob("slurm-watch/*.json")
    planted = json.loads(snapshot.read_text())
    planted["queue"] = {}  # 13 gone from the queue: "ended"
    snapshot.write_text(json.dumps(planted))
    os.chown(snapshot, 4321, -1)
    forget(monkeypatch)
    assert watch.watched_states(["13"])["13"].state == "RUNNING"
    assert len(squeues(clients)) == 2


def test_another_cluster_or_a_restarted_one_is_not_answered_from_this_snapshot(
    clients: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    watch.watched_states(["13"])
    conf = Path(os.environ["SLURM_CONF"])
    os.utime(conf, ns=(conf.stat().st_atime_ns, conf.stat().st_mtime_ns + 10**9))  # written again at start
    watch.watched_states(["13"])
    other = tmp_path / "other.conf"
    other.write_text("ClusterName=other\n")
    monkeypatch.setenv("SLURM_CONF", str(other))
    watch.watched_states(["13"])
    assert len(squeues(clients)) == 3
    assert len(list(watch.cache_dir().glob("slurm-watch/*.json"))) == 3


def test_without_a_writable_cache_a_process_keeps_its_own_snapshot(
    clients: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HPCTRAIN_CACHE", str(blocker))  # not a directory: nothing can be written under it
    for _ in range(3):
        assert watch.watched_states(["13"])["13"].state == "RUNNING"
    assert len(squeues(clients)) == 1


def test_a_failing_squeue_is_raised_to_the_watcher(clients: Fake):
    clients.answer("squeue", "slurm_load_jobs error: Unable to contact slurm controller", rc=1)
    with pytest.raises(RuntimeError, match="squeue"):
        watch.watched_states(["13"])


def test_cancel_is_two_requests_however_many_jobs(clients: Fake):
    commands.cancel([f"12_{i}" for i in range(100)] + ["13"])
    calls = clients.calls()
    assert len(calls) == 2
    assert calls[0].startswith("scontrol update JobId=12_0,12_1,") and calls[0].endswith(",13 Requeue=0")
    assert calls[1].startswith("scancel 12_0 12_1 ")
    clients.answer("scontrol", "", rc=1)  # a job that already ended: scancel still goes out
    commands.cancel(["13"])
    assert clients.calls()[-1] == "scancel 13"
