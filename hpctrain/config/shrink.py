"""A run on fewer of its Slurm job's nodes than ``cluster.nodes`` (a job that lost a node and goes on without
it: ``cluster.min_nodes``, hpctrain.launch.nodes). Torch-free."""

from __future__ import annotations

import dataclasses

from hpctrain.config.schema import Config
from hpctrain.config.shape import global_batch_size, run_shape
from hpctrain.errors import ConfigError


def on_nodes(cfg: Config, nodes: int) -> Config:
    """``cfg`` run on ``nodes`` of its Slurm job's nodes instead of ``cluster.nodes`` (a job that lost a node
    and continues on fewer, ``cluster.min_nodes``): the same layout with the data-parallel size the smaller
    world gives, and the same global batch (samples per optimizer step), reached by more gradient
    accumulation. A ConfigError naming ``cluster.min_nodes`` when the layout or the batch cannot shrink so."""
    if nodes == cfg.cluster.nodes:
        return cfg
    batch = global_batch_size(cfg)
    fewer = dataclasses.replace(
        cfg,
        cluster=dataclasses.replace(cfg.cluster, nodes=nodes),
        trainer=dataclasses.replace(cfg.trainer, global_batch_size=batch),
    )
    try:
        shape = run_shape(fewer)
    except ConfigError as err:  # tensor or pipeline parallelism spanning the nodes it would lose
        raise ConfigError(
            "cluster.min_nodes",
            cfg.cluster.min_nodes,
            f"on {nodes} node{'s' * (nodes > 1)} the layout cannot run: {err.reason}",
            valid=f"{nodes + 1}..{cfg.cluster.nodes}, or a layout whose other degrees fit one node",
        ) from None
    if batch % shape.samples_per_pass:
        raise ConfigError(
            "cluster.min_nodes",
            cfg.cluster.min_nodes,
            f"on {nodes} node{'s' * (nodes > 1)} a pass is {shape.samples_per_pass} samples, which does not "
            f"divide the global batch of {batch}",
            valid=f"{nodes + 1}..{cfg.cluster.nodes}, or a global batch that every node count divides",
        )
    return fewer
