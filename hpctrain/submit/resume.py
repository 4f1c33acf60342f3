"""``hpctrain resume [RUN_DIR] [OVERRIDES...]``: the command that continues a run, rebuilt from what the run
recorded. Torch-free.

Hydra records every run's overrides (``.hydra/overrides.yaml``), the folder the command was typed in and the
user's config directories (``.hydra/hydra.yaml``). Resuming is that command again, in that folder, with the
run's own directory (``hydra.run.dir``) and ``trainer.resume=auto``: the trainer loads the newest intact
checkpoint and goes on. Further overrides are added after the recorded ones (a longer ``trainer.max_steps``
is honoured from the resumed step on). Without RUN_DIR, the run of ``./outputs`` or ``./multirun`` that
changed last. A secret ``cluster.env`` value was never recorded (``***``, or ``${oc.env:NAME}`` for one typed
on the command line): it must be given again, or be in the environment under its name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import OmegaConf

from hpctrain.config.redact import REDACTED
from hpctrain.errors import ConfigError
from hpctrain.rundir import RunDir

# ${oc.env:NAME} without a default: the value must be in this environment again (a typed secret is recorded
# so: hpctrain.config.redact.secret_overrides).
ENV_NAME = re.compile(r"\$\{\s*oc\.env\s*:\s*([^,}\s]+)\s*\}")
DROPPED = ("run", "hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "trainer.resume")


def resume_command(run_dir: Path, extra: list[str]) -> tuple[Path, list[str]]:
    """(the folder to run in, the overrides) of the command that continues the run in ``run_dir``."""
    run = RunDir(run_dir.absolute())
    if not run.path.is_dir():
        raise ConfigError("RUN_DIR", str(run_dir), "no such directory", valid="a run directory")
    recorded = run.read_hydra_overrides()
    hydra_file = run.hydra_record
    if recorded is None or not run.config.is_file() or not hydra_file.is_file():
        raise ConfigError(
            "RUN_DIR",
            str(run_dir),
            "is not a run hpctrain started (no config.yaml and .hydra/ records)",
            valid="a run directory: outputs/NAME or outputs/DATE/TIME",
        )
    try:
        hydra = OmegaConf.load(hydra_file).hydra
        cwd = Path(str(hydra.runtime.cwd))
        sources = list(hydra.runtime.config_sources)
    except Exception as err:
        record = hydra_file.relative_to(run.path)
        raise ConfigError("RUN_DIR", str(run_dir), f"{record} cannot be read: {err}") from None
    given = {o.lstrip("+~").split("=", 1)[0] for o in extra}
    overrides = []
    for override in recorded:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in DROPPED or key in given:
            continue
        value = override.split("=", 1)[-1]
        missing = [n for n in ENV_NAME.findall(value) if n not in os.environ]
        if REDACTED in value or missing:  # a secret: recorded as *** (older runs) or where it was read from
            where = f" (nor is {missing[0]} in this environment)" if missing else ""
            raise ConfigError(
                key,
                value if missing else REDACTED,
                f"a secret the run did not record{where}: give it again",
                valid=f"hpctrain resume {run_dir} {override.split('=', 1)[0]}=VALUE, or "
                f"{missing[0] if missing else 'NAME'} in the environment",
            )
        overrides.append(override)
    config_dirs = [
        str(s.path) for s in sources if s.get("provider") == "command-line" and s.get("schema") == "file"
    ]
    if not cwd.is_dir():
        cwd = Path.cwd()
    argv = [*(f"--config-dir={d}" for d in config_dirs), *overrides, *extra]
    argv += [f"hydra.run.dir={run.path}", "trainer.resume=auto"]
    return cwd, argv
