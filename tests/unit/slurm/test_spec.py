"""The pure Slurm helpers (hpctrain.slurm.spec): time limits, node lists, a job's rendezvous port."""

from __future__ import annotations

import pytest

from hpctrain.slurm.spec import expand_nodelist, parse_time_limit, rendezvous_port


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("30", 30), ("5:30", 6), ("01:00:00", 60), ("2-00", 2880), ("1-02:30", 1590), ("0-00:00:59", 1)],
)
def test_time_limits(text: str, minutes: int):
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["1h", "", "1:2:3:4", "0", "a-01", "-1"])
def test_bad_time_limits(text: str):
    with pytest.raises(ValueError, match="time limit"):
        parse_time_limit(text)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[07-09,12],login1", ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]),
        ("a[1,3]-ib,b2", ["a1-ib", "a3-ib", "b2"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]):
    assert expand_nodelist(nodelist) == hosts


def test_array_tasks_get_distinct_ports():
    assert rendezvous_port("100") != rendezvous_port("101")
    assert 20000 <= rendezvous_port("123456789") < 40000


def test_job_ids_20000_apart_get_different_ports() -> None:
    # ``20000 + id % 20000`` gave these the same port: two such jobs on one node could not both start.
    assert rendezvous_port("100") != rendezvous_port("20100") != rendezvous_port("40100")
    assert rendezvous_port("100", restart="0") != rendezvous_port("100", restart="1")
    assert rendezvous_port("100", array_task="3") != rendezvous_port("100", array_task="4")
    ports = {rendezvous_port(str(i)) for i in range(2000)}
    assert all(20000 <= p < 40000 for p in ports) and len(ports) > 1800
