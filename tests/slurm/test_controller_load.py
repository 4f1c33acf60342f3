"""Issue 44, item 4 on the real test cluster: what a sweep asks of slurmctld does not grow with its members.

A sweep of 4 members and one of 16, submitted held (none runs), then ``status``, ``summary`` and ``cancel``
of each: slurmctld's request count for this user (sdiag, reset before each command) and the Slurm client
commands hpctrain started (a PATH shim: sacct's go to slurmdbd, which sdiag does not count) are the same for
both sizes. And watchers share one ``squeue`` per interval (hpctrain.slurm.watch): three
``hpctrain logs RUN -f`` of three members ask as much for their first answers as one does.
``python bench/rpc.py`` prints the figures at 10, 100 and 1,000 members.
"""

from __future__ import annotations

import os
from pathlib import Path

from rpc import SWEEP, phase, shim, watchers

from tests.support import REPO, this_checkout_first


def test_a_sweeps_requests_are_flat_in_its_members_and_watchers_share_a_query(
    slurm_cluster, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{shim(tmp_path / 'bin', calls)}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": this_checkout_first(),
    }
    env.pop("HPCTRAIN_FORKSERVER", None)  # nothing local runs: no fork server to prestart
    counts: dict[int, dict[str, tuple[int, dict[str, int]]]] = {}
    for members in (4, 16):
        sweep = tmp_path / f"sweep{members}"
        argv = ["-m", *SWEEP, f"trainer.seed=range(0,{members})", f"hydra.sweep.dir={sweep}"]
        counts[members] = {"submit": phase(env, calls, argv, REPO)[:2]}
        runs = sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        assert len(runs) == members
        for command in ("status", "summary"):
            counts[members][command] = phase(env, calls, [command, str(sweep)], REPO)[:2]
        if members == 16:  # each group of watchers with a cache of its own: no snapshot of the other's
            one = watchers({**env, "HPCTRAIN_CACHE": str(tmp_path / "c1")}, calls, runs[:1], 60, True)
            three = watchers({**env, "HPCTRAIN_CACHE": str(tmp_path / "c3")}, calls, runs[1:4], 60, True)
        counts[members]["cancel"] = phase(env, calls, ["cancel", str(sweep)], REPO)[:2]
    print(counts, one, three)
    for command in ("submit", "status", "summary", "cancel"):
        assert counts[4][command] == counts[16][command], (command, counts)
    # Three watchers' first answers: the one squeue snapshot they share, as one watcher's.
    assert three[1].get("squeue") == one[1].get("squeue") == 1, (one, three)
    assert three[0] == one[0], (one, three)
