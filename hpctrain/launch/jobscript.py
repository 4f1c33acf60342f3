"""The lines a Slurm job runs before its tasks, shared by the submitit launcher and the sbatch templates.

Config values reach a shell here, so every one is quoted: environment values with shlex.quote, and each
setup line is split into words and re-joined quoted, so ``module load cuda/12.4`` runs as written while
``x; touch /tmp/p`` becomes the single (failing) command ``'x;' touch /tmp/p`` — no operator is ever acted on.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpctrain.config.schema import ClusterConfig


def setup_lines(cluster: ClusterConfig, snapshot: Path) -> list[str]:
    # The snapshot goes first on the path, and PYTHONSAFEPATH (Python ≥ 3.11) keeps `python -m` from putting
    # the job's working directory — often a checkout of this package — ahead of it.
    lines = [
        f"export PYTHONPATH={shlex.quote(str(snapshot))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONSAFEPATH=1",
    ]
    lines += [f"export {name}={shlex.quote(str(value))}" for name, value in cluster.env.items()]
    lines += [shlex.join(shlex.split(line)) for line in cluster.setup]
    return lines


def container_srun_args(cluster: ClusterConfig) -> list[str]:
    """pyxis/enroot options for srun (values validated against SAFE_CONTAINER / SAFE_MOUNT)."""
    if cluster.container_image is None:
        return []
    args = [f"--container-image={cluster.container_image}"]
    if cluster.container_mounts:
        args.append(f"--container-mounts={','.join(cluster.container_mounts)}")
    return args
