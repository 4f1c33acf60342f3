"""hpctrain.verify.local_group.start_ranks: the tests' own ranks, forked from the session's fork server
(each a fresh interpreter's equal), or spawned where none runs; a failed rank is named and its peers do not
outlive it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpctrain.verify.local_group import RankFailed, start_ranks


def _rank(rank: int, out: str, fail_rank: int) -> None:
    import torch  # noqa: F401 - a rank of the suite imports it; forked, it is imported already

    Path(out, f"rank{rank}").write_text(f"{os.getpid()} {os.getppid()} {os.environ.get('RANK_MARK')}")
    if rank == fail_rank:
        raise ValueError(f"rank {rank} fails on purpose")
    if fail_rank >= 0:
        time.sleep(120)  # a peer that would wait on the failed rank until the group's timeout


def test_ranks_are_forked_from_the_sessions_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hpctrain.launch.forked import persistent_server

    server = persistent_server()
    assert server is not None, "the suite's e2e tests have a persistent fork server"
    server_pid = server.pid
    server.close()
    monkeypatch.setenv("RANK_MARK", "seen")
    start_ranks(_rank, 2, str(tmp_path), -1)
    records = [(tmp_path / f"rank{r}").read_text().split() for r in (0, 1)]
    assert all(ppid == str(server_pid) and mark == "seen" for _, ppid, mark in records), records
    assert records[0][0] != records[1][0]


def test_a_failed_rank_is_named_and_its_peer_killed(tmp_path: Path, capfd: pytest.CaptureFixture[str]):
    failed = r"^rank 1 of 2 ended with exit status 1 \(its traceback is above\)$"
    with pytest.raises(RankFailed, match=failed):
        start_ranks(_rank, 2, str(tmp_path), 1)
    assert "ValueError: rank 1 fails on purpose" in capfd.readouterr().err
    peer = int((tmp_path / "rank0").read_text().split()[0])
    # Asleep for 120 s unless it was killed when its peer failed (SIGKILL lands within moments): gone, or a
    # zombie its server has yet to reap.
    deadline = time.monotonic() + 30
    while _running(peer):
        assert time.monotonic() < deadline, f"rank 0 (pid {peer}) outlived the failed rank 1"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Alive and not a zombie. Read in one go: the process may be reaped between a look at /proc/PID and a
    read of its stat (CI, 2026-12-07: ProcessLookupError on the read)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:  # gone
        return False


def test_without_a_server_the_ranks_are_spawned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPCTRAIN_FORKSERVER", "off")
    start_ranks(_rank, 2, str(tmp_path), -1)
    ppids = {(tmp_path / f"rank{r}").read_text().split()[1] for r in (0, 1)}
    assert ppids == {str(os.getpid())}, "torch.multiprocessing's children of this process"
