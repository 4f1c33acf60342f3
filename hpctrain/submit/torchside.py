"""The checks of a run that import torch, and where they run: the user's model, data and loss tried on the
meta device (:mod:`hpctrain.submit.probe`), ``model.init_from``'s fit, whether a measured model fits in
memory (:mod:`hpctrain.submit.footprint`), and with ``rehearse=true`` every distinct rank's start-up
(:mod:`hpctrain.plan.rehearsal`).

They run in this process, or, for a local run while a persistent fork server answers at
``HPCTRAIN_FORKSERVER`` (:mod:`hpctrain.forkserver`), in a child forked from it: the server imported torch,
hpctrain's training stack and its ``--import`` modules once, so the child imports nothing (a user's
transformers model: ~7 CPU-s of torch and transformers imports in this process, ~0.3 in the child). The
child reads the member's config from a file and answers in a JSON file, a refusal as its key, value, reason,
valid values and the user's traceback: plain data only, nothing unpickled. A server that cannot serve (gone,
another checkout's, a child that answered nothing) leaves the checks to this process, as without a server,
and so does a server this command prestarted (still importing: importing here overlaps it).

``python -m hpctrain.submit.torchside CONFIG RUN_DIR OUT`` is the child (RUN_DIR empty for a sweep member).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError

MODULE = "hpctrain.submit.torchside"


def check_torch_side(cfg: Config, run_dir: Path | None, probed: set[str]) -> None:
    """The three checks in this process (``run_dir``: a single run's directory, None for a sweep member:
    ``init_from`` is checked for single runs only). ``probed``: what was checked already (a sweep's members
    share a model)."""
    _probe_once(cfg, probed)
    if run_dir is not None and cfg.model.init_from is not None:
        _check_init_from(cfg, run_dir, probed)
    if cfg.plan_check and (cfg.cluster.gpus_per_node > 0 or cfg.cluster.kind == "local"):
        # A user's model (no declared shapes) is measured first: imports torch, once per distinct model.
        from hpctrain.submit.fits import check_fits, check_fits_here
        from hpctrain.submit.measure import measured_for

        measured = measured_for(cfg)
        if cfg.cluster.gpus_per_node > 0:
            check_fits(cfg, measured)  # the memory per GPU must fit
        else:
            check_fits_here(cfg, measured)  # the processes must fit in this machine's memory
    if cfg.rehearse:
        _rehearse_once(cfg, probed)


def _rehearse_once(cfg: Config, probed: set[str]) -> None:
    """``rehearse=true``: every distinct rank's start-up, here (:mod:`hpctrain.plan.rehearsal`), once per
    distinct plan of a sweep; a rank that would fail is refused in its one line."""
    from hpctrain.plan.rehearsal import RehearsalRefused, fingerprint, rehearse_and_record
    from hpctrain.task.rehearse import StartupFailure

    key = "rehearsed " + fingerprint(cfg)
    if key in probed:
        return
    try:
        rehearse_and_record(cfg)
    except (StartupFailure, RehearsalRefused, ValueError) as err:
        raise ConfigError(
            "rehearse", "true", str(err), valid="a plan whose every rank starts, or rehearse=false"
        ) from None
    probed.add(key)


def check_torch_side_where_cheapest(
    cfg: Config, composed: Any, run_dir: Path | None, probed: set[str]
) -> None:
    """:func:`check_torch_side`, in a child of a persistent fork server when one serves a local run whose
    checks import torch, else here."""
    from hpctrain.launch import forked
    from hpctrain.models.builtin import model_spec
    from hpctrain.submit.probe import needs_probe

    measures = cfg.plan_check and not model_spec(cfg.model).transformer  # a user's model: measured
    imports_torch = needs_probe(cfg) or cfg.model.init_from is not None or measures or cfg.rehearse
    key = repr(("forked", cfg.model, cfg.data, cfg.loss, cfg.trainer, cfg.parallel, cfg.cluster, run_dir))
    if key in probed:
        return
    local = cfg.cluster.kind == "local" and cfg.cluster.fork_server
    server = forked.persistent_server() if imports_torch and local else None
    if server is None:
        check_torch_side(cfg, run_dir, probed)
        return
    try:
        answer = _in_child(server, composed, run_dir)
    finally:
        server.close()
    if answer is None:  # the child said nothing (it could not start, or died): checked here, as without it
        check_torch_side(cfg, run_dir, probed)
        return
    error = answer.get("error")
    if error is not None:
        raised = ConfigError(error["key"], error["value"], error["reason"], valid=error["valid"])
        if error.get("user_traceback"):
            raised.user_traceback = error["user_traceback"]  # type: ignore[attr-defined]
        raise raised
    probed.add(key)


def _in_child(server: Any, composed: Any, run_dir: Path | None) -> dict[str, Any] | None:
    """Run the checks in a child of ``server``; its answer, or None when it gave none. What the child
    printed (a user's warnings) is shown on this process's stderr once it answered, as if run here."""
    from hpctrain.config.io import run_config_text
    from hpctrain.launch.forkwire import ForkServerError

    try:
        text = run_config_text(composed)
    except Exception:  # a config only Hydra's own run resolves: the checks run here instead
        return None
    with tempfile.TemporaryDirectory(prefix="hpctrain-check-") as tmp:
        config, out, log = Path(tmp) / "member.yaml", Path(tmp) / "answer.json", Path(tmp) / "child.log"
        config.write_text(text)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            child = server.spawn(MODULE, [str(config), str(run_dir or ""), str(out)], dict(os.environ), fd)
            child.wait()
        except (ConfigError, ForkServerError):  # the server went away: nothing answered
            return None
        finally:
            os.close(fd)
        try:
            answer = json.loads(out.read_text())
        except (OSError, ValueError):
            return None
        printed = log.read_text(errors="replace")
        if printed:
            sys.stderr.write(printed)
            sys.stderr.flush()
        return answer if isinstance(answer, dict) else None


def _probe_once(cfg: Config, probed: set[str]) -> None:
    """Try the user's model, data and loss on the meta device (hpctrain.submit.probe), once per distinct
    combination of a sweep. Imports torch, but only for runs that bring their own code."""
    from hpctrain.submit.probe import needs_probe

    key = repr((cfg.model, cfg.data, cfg.loss, cfg.trainer.seed))
    if not needs_probe(cfg) or key in probed:
        return
    from hpctrain.submit.probe import probe

    probe(cfg)
    probed.add(key)


def _check_init_from(cfg: Config, run_dir: Path, probed: set[str]) -> None:
    """``model.init_from`` fits the model (names and shapes, from the weights' headers), unless this run
    continues a checkpoint of its own, where init_from is ignored. Imports torch (only for init_from)."""
    from hpctrain.rundir import RunDir
    from hpctrain.rundir import checkpoints as layout

    key = repr(("init_from", cfg.model, cfg.data))
    own = cfg.trainer.resume != "never" and layout.committed(RunDir(run_dir).shared_checkpoints)
    if key in probed or own or cfg.trainer.resume not in ("auto", "never"):
        return
    from hpctrain.submit.probe import check_init_from_fits

    check_init_from_fits(cfg)
    probed.add(key)


def main(argv: list[str]) -> int:
    """The child: check the config in ``argv[0]`` and write the answer to ``argv[2]``."""
    from hpctrain.config.io import load_run_config

    config, run_dir, out = argv
    answer: dict[str, Any] = {"error": None}
    try:
        check_torch_side(load_run_config(Path(config)), Path(run_dir) if run_dir else None, set())
    except ConfigError as err:
        plain = isinstance(err.value, (str, int, float, bool, type(None)))
        answer["error"] = {
            "key": err.key,
            "value": err.value if plain else str(err.value),  # shown as text in the one line either way
            "reason": err.reason,
            "valid": err.valid,
            "user_traceback": getattr(err, "user_traceback", None),
        }
    Path(out).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
