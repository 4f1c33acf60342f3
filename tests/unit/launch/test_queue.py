"""Where and when a profile's job can start (hpctrain.launch.queue): the sbatch options that decide it."""

from __future__ import annotations

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch.queue import resource_options


def test_the_options_are_the_profiles_resources_and_nothing_unset() -> None:
    c = to_typed(compose(["cluster=a100x32", "cluster.qos=high", "cluster.exclusive=true"])).cluster
    options = resource_options(c)
    assert options[:3] == [
        f"--nodes={c.nodes}",
        f"--ntasks-per-node={c.tasks_per_node}",
        f"--cpus-per-task={c.cpus_per_task}",
    ]
    assert f"--gpus-per-node={c.gpus_per_node}" in options
    assert "--qos=high" in options and "--exclusive" in options
    assert not any(o.startswith(("--account=", "--reservation=", "--time-min=")) for o in options)  # unset


def test_a_flexible_walltime_is_asked_of_the_estimate_too() -> None:
    c = to_typed(compose(["cluster=a100x32", "cluster.time=4:00:00", "cluster.time_min=30"])).cluster
    assert {"--time=240", "--time-min=30"} <= set(resource_options(c))
