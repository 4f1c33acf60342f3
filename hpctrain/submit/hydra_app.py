"""How a checked run goes through Hydra: a single run through Hydra's own ``run_job`` (output directory,
logging, .hydra/ files, callbacks) without composing again, a sweep through ``hydra.main``, the task each
run executes (write the run's config, hand it to a launcher), a dry run that writes nothing, and
``--cfg`` for a config that composes but does not validate. Torch-free."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.compose import CONF_DIR, CONFIG_NAME, compose, config_context, to_typed
from hpctrain.config.schema import Config
from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError
from hpctrain.rundir import NO_HYDRA_RECORD, RunDir
from hpctrain.rundir.records import SweepRecord

# The "array job id", cluster and job id prefix of a sweep run here in its sweep.json: hpctrain.jobs.targets'
# LOCAL, by which status, summary, cancel and report read its members' state from their run directories.
LOCAL = "local"
# run directory → the outermost folder creating it made (hpctrain.rundir.first_missing), for a single run.
_MADE: dict[Path, Path | None] = {}
# run directory → the typed config the precheck made of the very composition run_single hands Hydra: the task
# does not type it a second time (0.1-0.2 s of a submission's own time, omegaconf merging every schema).
_TYPED: dict[Path, Config] = {}
# Hydra's flags that print and run nothing: their output shows Hydra's config as composed, unchanged.
INFORMATIONAL = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc")


def _remove(run_dir: Path, made: Path | None, submission: bool = False) -> None:
    """Take away a run that never started (:func:`hpctrain.rundir.remove_unstarted`), and first the log
    file Hydra opened in it: nothing may write there again (a later line would reopen a deleted path)."""
    import logging

    from hpctrain.rundir.runs import remove_unstarted

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir:
            root.removeHandler(handler)
            handler.close()
    remove_unstarted(run_dir, made, submission)
    if not run_dir.exists():  # a member that holds a run keeps its entry: its sweep.json is put back whole
        _forget_local_member(run_dir)


def _local_sweep_dir() -> Path | None:
    """The sweep directory when this task is a member of a sweep run here (Hydra's multirun), else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir).absolute()


def _local_record(sweep_dir: Path) -> SweepRecord:
    """The sweep.json of a sweep run here; a new one when there is none. One written by a Slurm sweep in
    the same directory, or unreadable, is not ours to extend: a new one replaces it."""
    from hpctrain.rundir.records import read_sweep

    try:
        record = read_sweep(sweep_dir)
    except (OSError, ValueError, TypeError, KeyError):
        record = None
    if record is None or record.array_job_id != LOCAL:
        return SweepRecord(array_job_id=LOCAL, cluster=LOCAL, members=[])
    return record


def _record_local_member(run_dir: Path) -> None:
    """This member of a sweep run here, added to the sweep's sweep.json as it starts, as a Slurm sweep's
    members are added as their array is submitted (a sweeper such as Optuna chooses later members from
    earlier results, so the list grows member by member): ``status``, ``summary``, ``cancel`` and ``report``
    find every member by it, wherever ``hydra.sweep.subdir`` put its run directory."""
    from hydra.core.hydra_config import HydraConfig

    from hpctrain.rundir import RunDir
    from hpctrain.rundir.records import SweepMember, write_json

    sweep_dir = _local_sweep_dir()
    if sweep_dir is None:
        return
    index = int(HydraConfig.get().job.num)
    # As Hydra recorded them in .hydra/overrides.yaml, secret cluster.env values already redacted there.
    overrides = RunDir(run_dir).read_hydra_overrides() or []
    record = _local_record(sweep_dir)
    if record.command is None:  # what a later command reusing the sweep's directory must match
        from hpctrain.rundir.records import sweep_argv

        record.command = sweep_argv(sys.argv[1:])
    others = [m for m in record.members if m.index != index]  # a member run again replaces its entry
    member = SweepMember(index, overrides, str(run_dir), f"{LOCAL}:{index}")
    record.members = sorted([*others, member], key=lambda m: m.index)
    write_json(RunDir(sweep_dir).sweep, record)


def _forget_local_member(run_dir: Path) -> None:
    """Take a member that never started (its run directory removed) out of its local sweep's sweep.json."""
    from hpctrain.rundir import RunDir
    from hpctrain.rundir.records import write_json

    sweep_dir = _local_sweep_dir()
    if sweep_dir is None or not RunDir(sweep_dir).sweep.is_file():
        return
    record = _local_record(sweep_dir)
    kept = [m for m in record.members if Path(m.run_dir) != run_dir]
    if len(kept) == len(record.members):
        return
    if kept:
        record.members = kept
        write_json(RunDir(sweep_dir).sweep, record)
    else:  # no member left: no sweep to record (the directory itself goes as the run's did)
        RunDir(sweep_dir).sweep.unlink(missing_ok=True)


def _launch(typed: Config, run_dir: Path) -> int:
    """The launcher's status. A Slurm submission's stderr is held back until it is known to have worked:
    when sbatch refuses the job, submitit prints sbatch's lines before raising, and the one line that
    reports the refusal says the same."""
    import contextlib
    import io

    from hpctrain.launch import get_launcher

    if typed.cluster.kind != "slurm" or typed.dry_run:
        return int(get_launcher(typed).launch(typed, run_dir) or 0)
    held = io.StringIO()
    with contextlib.redirect_stderr(held):
        status = int(get_launcher(typed).launch(typed, run_dir) or 0)
    sys.stderr.write(held.getvalue())  # reached only when the launcher did not raise
    return status


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.filename}: {err.strerror or err}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return "; ".join(lines) or type(err).__name__


def print_composed(overrides: list[str], config_dirs: list[Path], which: str) -> None:
    """``--cfg job|hydra|all`` for a config that composes but does not validate (nothing when it cannot
    even be composed: the error line says why)."""
    from omegaconf import OmegaConf

    try:
        cfg = compose(overrides, config_dirs)
    except ConfigError:
        return
    job = OmegaConf.create({k: cfg[k] for k in cfg if k != "hydra"})
    hydra = OmegaConf.create({"hydra": cfg.hydra})
    parts = {"job": [job], "hydra": [hydra], "all": [hydra, job]}[which]
    for part in parts:
        print(OmegaConf.to_yaml(part, resolve=False), end="", flush=True)


def run_single(cfg: DictConfig, config_dirs: list[Path], typed: Config | None = None) -> int:
    """One run from the config the precheck composed, through Hydra's own ``run_job`` (output directory,
    logging, .hydra/ files, callbacks), sparing the two further compositions ``hydra.main`` would make:
    submitting from a login node should take about a second. ``typed``: the precheck's typed config of
    ``cfg``, used as it is unless a run key interpolates (``${now:...}``, ``${hydra:...}`` resolve anew
    inside Hydra's run)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict, read_write

    try:
        from hydra._internal.callbacks import Callbacks
    except ImportError:  # Hydra moved it in 1.4
        from hydra.core.callbacks import Callbacks  # type: ignore[no-redef]

    from hpctrain.rundir.runs import first_missing

    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
        cfg.hydra.output_subdir = None  # the task writes .hydra/ once the attempt is accepted
    run_dir = Path(os.path.abspath(cfg.hydra.run.dir))  # as Hydra's run_job makes runtime.output_dir
    _MADE[run_dir] = first_missing(run_dir)  # what to take away again if the run never starts
    if typed is not None and not any(_interpolates(cfg._get_node(key)) for key in cfg if key != "hydra"):
        _TYPED[run_dir] = typed
    callbacks = Callbacks(cfg)
    with config_context(config_dirs):
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        callbacks.on_run_start(config=cfg, config_name=CONFIG_NAME)
        result = run_job(task, cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context)
        callbacks.on_run_end(config=cfg, config_name=CONFIG_NAME, job_return=result)
    _ = result.return_value  # re-raises what the task raised
    return 0


def _interpolates(node: object) -> bool:
    """Whether an OmegaConf node is, or holds, an interpolation (``${...}``) anywhere below it."""
    from omegaconf import Container, Node

    if not isinstance(node, Node):
        return False
    if node._is_interpolation():
        return True
    if isinstance(node, Container) and not node._is_none() and not node._is_missing():
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))  # type: ignore[arg-type]
        return any(_interpolates(node._get_node(key)) for key in keys)
    return False


def dry_run(typed: Config, cfg: DictConfig) -> int:
    """Print the plan and the rendered submission; create no directory and no file (Hydra's ``run_job``
    would make the run directory and its .hydra/ files)."""
    import logging

    from hydra.core.hydra_config import HydraConfig

    from hpctrain.launch import get_launcher

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # no log file either
    HydraConfig.instance().set_config(cfg)  # what the launchers read of Hydra's node; nothing written
    return int(get_launcher(typed).launch(typed, Path(cfg.hydra.run.dir).absolute()) or 0)


def run_hydra(argv: list[str]) -> int:
    import hydra

    from hpctrain.config.compose import shared_compositions
    from hpctrain.config.schema import register_configs

    register_configs()
    if not any(a.split("=", 1)[0] in INFORMATIONAL for a in argv):
        argv = [*argv, NO_HYDRA_RECORD]  # the task writes .hydra/ once the attempt is accepted
    sys.argv = [sys.argv[0] if sys.argv else "hpctrain", *argv]
    app = hydra.main(config_path=str(CONF_DIR), config_name=CONFIG_NAME, version_base="1.3")(task)
    with shared_compositions():
        app()
    return 0


def task(cfg) -> float | None:  # type: ignore[no-untyped-def]  # Hydra passes a DictConfig
    from hydra.core.hydra_config import HydraConfig

    from hpctrain.config.redact import redact_files
    from hpctrain.plan.check import check_run
    from hpctrain.rundir import RunLock
    from hpctrain.slurm.commands import SlurmUnavailable

    run_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
    made = _MADE.pop(run_dir, None)
    lock, typed = None, None
    run = RunDir(run_dir)
    # The run's record as it was (and its sweep's), put back byte for byte if this attempt is refused.
    snapshot: dict[Path, bytes | None] | None = None
    try:
        try:
            typed = _TYPED.pop(run_dir, None) or to_typed(cfg)
            check_run(typed)
            # A local run is one process tree: the launcher holds the run directory's lock for the run's
            # life (a Slurm job's rank 0 takes it in hpctrain.worker).
            lock = RunLock(run_dir).acquire() if typed.cluster.kind == "local" else None
            _check_member(run_dir, typed)
            snapshot = _snapshot(run)
            _write_record(run_dir, cfg)  # accepted here: the record is this command's from now on
            # Hydra recorded the sweep's overrides in multirun.yaml (a secret typed on the command line is
            # ${oc.env:NAME} there already: hpctrain.config.redact.secret_overrides).
            redact_files([RunDir(run_dir.parent).multirun], typed.cluster.env)
            if typed.cluster.kind == "local":  # a member of a sweep run here: in its sweep.json
                _record_local_member(run_dir)
            if typed.cluster.kind == "slurm" and snapshot.get(run.config) is not None:
                # Over an existing run: the job's rank 0 puts this back if the ranks refuse its checkpoint
                # (this command has ended by then); a later submission writes its own.
                run.save_record(snapshot)
            else:
                run.forget_record()
            status = _launch(typed, run_dir)
        finally:
            if lock is not None:
                lock.release()
    except _Refused as err:  # the member trained with other values: nothing of it or its sweep touched
        print(f"hpctrain: {err.error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG) from None
    except (ConfigError, SlurmUnavailable, OSError) as err:
        # Refused before anything started (a sweep trial the precheck could not enumerate, a run directory
        # that cannot be written): one line, the record as it was, and no run directory left behind.
        print(f"hpctrain: {_one_line(err)}", file=sys.stderr)
        if snapshot is not None:
            run.restore_record(snapshot)
        _remove(run_dir, made)
        raise SystemExit(EXIT_BAD_CONFIG if isinstance(err, ConfigError) else 1) from None
    except Exception as err:
        if typed is None or typed.cluster.kind != "slurm" or RunDir(run_dir).job.is_file():
            raise  # not a refused submission: a fault of hpctrain's, with its traceback
        # sbatch refused the job (submitit's FailedJobError, a client error): Slurm's words in one line.
        print(f"hpctrain: sbatch refused the job: {_one_line(err)}", file=sys.stderr)
        if snapshot is not None:
            run.restore_record(snapshot)
            run.forget_record()
        _remove(run_dir, made, submission=True)
        raise SystemExit(1) from None
    if status:
        if snapshot is not None and _workers_refused(run_dir):
            # The workers refused to continue (a checkpoint of another shape): the run is what it was, its
            # record included, so status reads what it read and hpctrain resume replays what last trained.
            run.restore_record(snapshot)
            raise SystemExit(EXIT_BAD_CONFIG)
        _remove(run_dir, made, submission=typed.cluster.kind == "slurm")  # refused before starting
        raise SystemExit(status)
    assert typed is not None
    if typed.cluster.kind == "local":  # a sweeper that chooses trials from results (Optuna) reads it
        from hpctrain.launch.array import final_objective

        return final_objective(run_dir)
    return None


class _Refused(Exception):
    """A refusal that leaves everything where it was (no run directory to take away)."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


def _check_member(run_dir: Path, typed: Config) -> None:
    """A member of a sweep run here whose directory holds a member trained with other values (a sampler that
    chose other trials this time): refused before anything is written."""
    from hydra.core.hydra_config import HydraConfig

    from hpctrain.submit.existing import check_member_reuse

    sweep_dir = _local_sweep_dir()
    if sweep_dir is None:
        return
    try:
        check_member_reuse(run_dir, sweep_dir, [str(o) for o in HydraConfig.get().overrides.task], typed.run)
    except ConfigError as err:
        raise _Refused(err) from None


def _snapshot(run: RunDir) -> dict[Path, bytes | None]:
    """The run's record (:meth:`hpctrain.rundir.RunDir.snapshot_record`) and, for a member of a sweep run
    here, the sweep's sweep.json."""
    found = run.snapshot_record()
    sweep_dir = _local_sweep_dir()
    if sweep_dir is not None:
        sweep = RunDir(sweep_dir).sweep
        found[sweep] = sweep.read_bytes() if sweep.is_file() else None
    return found


def _workers_refused(run_dir: Path) -> bool:
    """Whether the ranks ended because they refused to continue the run's checkpoint (CheckpointMismatch:
    nothing was loaded, trained or deleted), rather than failing while they trained."""
    from hpctrain.rundir.records import first_error

    found = first_error(run_dir)
    return found is not None and found[1].get("type") == "CheckpointMismatch"


def _write_record(run_dir: Path, cfg: DictConfig) -> None:
    """What Hydra's run_job would have written into .hydra/ (config.yaml as composed, hydra.yaml, the
    overrides), and the run's config.yaml; every secret cluster.env value as ***, whatever its source."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict, read_write

    from hpctrain.config.redact import REDACTED, is_secret
    from hpctrain.launch import write_run_config
    from hpctrain.rundir import HYDRA_DIR, HYDRA_OVERRIDES, RUN_CONFIG

    composed = copy.deepcopy(cfg)
    env = OmegaConf.select(composed, "cluster.env")
    if isinstance(env, DictConfig):
        with read_write(env), open_dict(env):
            for name in list(env):
                raw = env._get_node(name)._value()  # type: ignore[union-attr]
                # ${oc.env:NAME} names where the value is, not the value: kept, so the record says so.
                if is_secret(name) and not (isinstance(raw, str) and raw.lstrip().startswith("${oc.env:")):
                    env[name] = REDACTED
    hydra = copy.deepcopy(HydraConfig.instance().cfg)
    assert isinstance(hydra, DictConfig)
    with read_write(hydra.hydra), open_dict(hydra.hydra):
        hydra.hydra.output_subdir = HYDRA_DIR  # as Hydra would have recorded it
    texts = {
        RUN_CONFIG: OmegaConf.to_yaml(composed),
        "hydra.yaml": OmegaConf.to_yaml(hydra),
        HYDRA_OVERRIDES: OmegaConf.to_yaml(hydra.hydra.overrides.task),
    }
    # No value is searched for and replaced in these texts: a typed secret never reached Hydra
    # (hpctrain.config.redact.secret_overrides), one from a file is redacted above, and a short value ("x")
    # would be replaced inside other words.
    RunDir(run_dir).write_hydra_record(texts)
    write_run_config(run_dir, cfg)
