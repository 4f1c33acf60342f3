"""The host's count of OOM kills (hpctrain.launch.exits), read as cgroup v1, v2 and /proc/vmstat write it; the
real OOM kill under a real memory limit is tests/e2e/launch/test_attribution.py."""

from __future__ import annotations

from pathlib import Path

from hpctrain.launch import exits as oom


def test_the_count_is_read_from_each_file_the_kernel_writes(tmp_path: Path):
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n")
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 41\nnr_zone_active_anon 3\n")
    assert [oom._counter(f, "oom_kill") for f in (v1, v2, vmstat)] == [3, 2, 41]
    assert oom._counter(tmp_path / "missing", "oom_kill") is None
    (tmp_path / "torn").write_text("oom_kill \n")
    assert oom._counter(tmp_path / "torn", "oom_kill") is None


def test_this_host_says_a_count_or_nothing():
    found = oom.oom_kills()
    assert found is None or found >= 0
