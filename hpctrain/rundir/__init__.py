"""The run directory: every path of a run (and of a sweep) and the format of every file in it. Torch-free.

:data:`LAYOUT` is the map: every name a run or sweep directory holds, with what it is. docs/runs.md's "What a
run leaves behind" is this map (tests check it), :class:`RunDir` is the only way to a path in it, and no other
module spells one of these names in a path (tests/unit/test_rules.py checks every path expression of the
package). Writes go through :func:`hpctrain.rundir.files.atomic_write` (or an append of whole lines).

Outside the run directory, on each node: ``<checkpoint.local_path>/hpctrain-fast-<uid>/...``, the checkpoints'
node-local fast tier (:mod:`hpctrain.rundir.checkpoints` names its paths).

Over 400 lines: one class holds every path of the layout, so that no other module spells one.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.rundir.files import JsonlWriter, atomic_json, atomic_write, read_json, read_jsonl
from hpctrain.rundir.lock import LOCK_FILE, RunLock
from hpctrain.rundir.objects import ObjectDir, shared_root

RUN_CONFIG = "config.yaml"
JOB_RECORD = "job.json"
SWEEP_RECORD = "sweep.json"
METRICS_FILE = "metrics.jsonl"
RANKS_FILE = "ranks.json"
RENDEZVOUS_FILE = "rendezvous.json"
# The run's one fault log: each fault as first seen, and each answer of the fault policy ("entry": ANSWER).
FAULTS_FILE = "faults.jsonl"
ANSWER = "answer"
# Where the policy's answers went before the one fault log: read, never written (a run of an earlier version).
LEGACY_RESTARTS_FILE = "restarts.jsonl"
AGENTS_DIR = "agents"  # the restart agents' coordination: one generation file per job start, claims
CONTROL_FILE = "control.json"  # hpctrain save|stop: an operator's request to a live run
STACKS_DIR = "stacks"  # hpctrain stacks, and a hang: every live rank's Python stacks, <request>/rank<R>.txt
STACKS_REQUEST = "request.json"  # in STACKS_DIR: the newest request every rank's watchdog thread answers
# Beside a compile cache's entries (RUN_DIR/compile_cache/<key>/ or a shared <path>/<key>/): what its key was
# made of (hpctrain.parallel.compile.key_inputs), for people.
COMPILE_KEY_FILE = "key.json"
COMPILE_CACHE_DIR = "compile_cache"
EVAL_FILE = "eval.jsonl"  # hpctrain eval's results, one line per evaluated checkpoint
# The fields of an eval.jsonl record that say how it was made; every other number is a metric.
EVAL_RECORD_FIELDS = ("step", "eval_batches", "eval_s", "time", "host", "job_id", "eval_target")
# Hydra's record of a sweep's members (written by Hydra's launchers) and of each run's overrides.
MULTIRUN_RECORD = "multirun.yaml"
HYDRA_DIR = ".hydra"
HYDRA_OVERRIDES = "overrides.yaml"
# A Slurm submission over an existing run: its record as it was, for the job's rank 0 to put back when the
# workers refuse to continue the run's checkpoint (the submitting command has ended by then).
RECORD_BEFORE = ".record-before.json"
SUMMARY_CSV = "summary.csv"
# Hydra would write its .hydra/ record before hpctrain has accepted the attempt (a refused one would leave
# the refused command as the run's): hpctrain writes it itself once accepted (RunDir.write_hydra_record).
NO_HYDRA_RECORD = "hydra.output_subdir=null"
SBATCH_SCRIPT = "job.sbatch"
ARRAY_SCRIPT = "array-{}.sbatch"  # cluster.ssh sweeps: one per job array, k = 0, 1, ... (MaxArraySize splits)
REMOTE_CLI = "hpctrain.sh"  # cluster.ssh: hpctrain's commands on this run, as the laptop runs them there
EVAL_SCRIPT = "eval.sbatch"  # trainer.eval_job: the evaluation job's script, submitted once per checkpoint
EVAL_PINS_DIR = "eval_pins"  # trainer.eval_job: step_N.json per submitted evaluation, the checkpoint's pin
LOGS_DIR = "logs"
HEARTBEATS_DIR = "heartbeats"
ATTEMPTS_DIR = "attempts"  # the goodput ledger's evidence: one record per started worker of rank 0
GOODPUT_FILE = "goodput.json"
MEMORY_DIR = (
    "memory"  # trainer.memory_history: a rank's allocator snapshot and summary when it ran out of memory
)
FLIGHT_DIR = "flight"  # the NCCL flight recorder's dumps (a CUDA run's collectives timing out)
CHECKPOINTS_DIR = "checkpoints"
PROFILE_DIR = "profile"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
REPORT_DIR = "report"
CODE_DIR = "code"
PROJECT_SUBDIR = "project"  # the user's project, under CODE_DIR
SLURM_DIR = "slurm"
# Where runs go unless hydra.run.dir says otherwise (Hydra's own folders; run=NAME: RUNS_ROOT/NAME).
RUNS_ROOT, SWEEPS_ROOT = "outputs", "multirun"
SUBMIT_LOG = "hpctrain.log"  # the submitting process's log (conf/hydra/job_logging/hpctrain.yaml names it)

# Every name of a run directory (a sweep directory has the sweep's rows), in docs/runs.md's order: name →
# what.
LAYOUT: dict[str, str] = {
    RUN_CONFIG: "the resolved config every rank read (.hydra/ has Hydra's record of the overrides)",
    f"{HYDRA_DIR}/": f"Hydra's record of the run: config.yaml, hydra.yaml, {HYDRA_OVERRIDES}",
    METRICS_FILE: "one JSON object per logged step (see below)",
    f"{CHECKPOINTS_DIR}/": "step_XXXXXXXX/ directories, each committed atomically (see below); lineage.json",
    f"{LOGS_DIR}/": "every rank's log, rank<R>.log; rank<R>.error.json when a rank failed",
    SUBMIT_LOG: "the submitting command's own log",
    RANKS_FILE: "which host and pid every rank ran on",
    RENDEZVOUS_FILE: "the port rank 0 of a Slurm job start listens on, when it had to move",
    f"{HEARTBEATS_DIR}/": "the hang watchdog's heartbeats, rank<R>.json",
    f"{ATTEMPTS_DIR}/": "rank 0's timeline of each attempt (each job start and restart): <job key>.json",
    GOODPUT_FILE: "where the run's wall time went since its first submission, by bucket (hpctrain status)",
    f"{MEMORY_DIR}/": "a CUDA rank that ran out of memory: rank<R>.pickle (the allocator's snapshot) and "
    "rank<R>.json (the largest live allocations, the plan's figure)",
    f"{FLIGHT_DIR}/": "a CUDA run: the NCCL flight recorder's record of each rank's last collectives, "
    "rank<R> (on a collective's timeout) and beside a hang's stacks",
    FAULTS_FILE: "the run's fault log: every fault as first seen (which rank and node, why, what was done), "
    "and every answer of the fault policy (entry: answer; restart, requeue, stopped or used up: time, "
    "cause, failed rank and host, step resumed from, whether the attempt made progress)",
    f"{AGENTS_DIR}/": "cluster.max_restarts: the restart agents' generation of each job start, claims; "
    "with spare_nodes or min_nodes its member nodes and the agents' liveness files",
    CONTROL_FILE: "hpctrain save|stop: the operator's request to the live run, and its answer",
    f"{STACKS_DIR}/": "hpctrain stacks and every hang: each live rank's Python stacks, <request>/rank<R>.txt",
    EVAL_FILE: "hpctrain eval's results: one JSON object per evaluated checkpoint (step, val_loss, ...)",
    f"{PROFILE_DIR}/": "with trainer.profile=FIRST:LAST, a torch.profiler trace per rank",
    f"{TENSORBOARD_DIR}/": "with logger=tensorboard: event files (profiler traces under plugins/profile/)",
    f"{WANDB_DIR}/": "with logger=wandb (offline unless logger.wandb_mode=online)",
    f"{REPORT_DIR}/": "hpctrain report's PNGs",
    f"{COMPILE_CACHE_DIR}/": f"torch.compile's caches, <key>/ per graph-shaping config ({COMPILE_KEY_FILE})",
    JOB_RECORD: "Slurm runs: the job id, cluster and log paths",
    f"{CODE_DIR}/": f"Slurm runs: the code snapshot the job runs (the user's under {PROJECT_SUBDIR}/)",
    f"{SLURM_DIR}/": "Slurm runs: Slurm's output files (submitit's pickled job and script)",
    SBATCH_SCRIPT: "launcher=sbatch: the rendered script that was submitted",
    ARRAY_SCRIPT.format("K"): "a sweep directory over cluster.ssh: the script of its K-th job array",
    EVAL_SCRIPT: "trainer.eval_job: the evaluation job's script, submitted after each checkpoint",
    f"{EVAL_PINS_DIR}/": "trainer.eval_job: step_N.json per evaluation submitted (its job id), which keeps "
    "checkpoint N from pruning until the job has read it (then released, with how)",
    REMOTE_CLI: "cluster.ssh: hpctrain status, logs, save, report, ... as the laptop runs them there",
    RECORD_BEFORE: "a Slurm submission over an existing run: its record before it, put back if the job's "
    "ranks refuse to continue its checkpoint",
    LOCK_FILE: "the lock of the run using the directory",
    SWEEP_RECORD: "a sweep directory: its members (one Slurm array, or runs here)",
    MULTIRUN_RECORD: "a sweep directory: Hydra's record of the sweep",
    SUMMARY_CSV: "a sweep directory: hpctrain summary's table",
}


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    # ------------------------------------------------------------------------------------------ paths
    @property
    def config(self) -> Path:
        return self.path / RUN_CONFIG

    @property
    def job(self) -> Path:
        return self.path / JOB_RECORD

    @property
    def sweep(self) -> Path:
        return self.path / SWEEP_RECORD

    @property
    def multirun(self) -> Path:
        return self.path / MULTIRUN_RECORD

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def ranks(self) -> Path:
        return self.path / RANKS_FILE

    @property
    def logs(self) -> Path:
        return self.path / LOGS_DIR

    def log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def error_file(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def error_files(self) -> list[Path]:
        return sorted(self.logs.glob("rank*.error.json")) if self.logs.is_dir() else []

    @property
    def heartbeats(self) -> Path:
        return self.path / HEARTBEATS_DIR

    @property
    def stacks(self) -> Path:
        return self.path / STACKS_DIR

    @property
    def stacks_request(self) -> Path:
        return self.path / STACKS_DIR / STACKS_REQUEST

    def stack_dump(self, request: str, rank: int) -> Path:
        return self.path / STACKS_DIR / request / f"rank{rank}.txt"

    @property
    def attempts(self) -> Path:
        return self.path / ATTEMPTS_DIR

    def attempt(self, key: str) -> Path:
        """One attempt's record: ``key`` is its job key (``slurm:4242.0.g1``), made a file name."""
        return self.attempts / (re.sub(r"[^A-Za-z0-9.]+", "-", key).strip("-") + ".json")

    def attempt_files(self) -> list[Path]:
        return sorted(self.attempts.glob("*.json")) if self.attempts.is_dir() else []

    @property
    def memory(self) -> Path:
        return self.path / MEMORY_DIR

    def memory_snapshot(self, rank: int) -> Path:
        return self.memory / f"rank{rank}.pickle"

    def memory_summary(self, rank: int) -> Path:
        return self.memory / f"rank{rank}.json"

    @property
    def flight(self) -> Path:
        """The NCCL flight recorder's folder; torch appends the rank to ``flight/rank`` (its dump prefix)."""
        return self.path / FLIGHT_DIR

    @property
    def goodput(self) -> Path:
        return self.path / GOODPUT_FILE

    def flight_dump(self, request: str, rank: int) -> Path:
        """A hang's NCCL flight record of ``rank``, beside its stacks (plain data, pickled by torch)."""
        return self.stacks / request / f"rank{rank}.nccl.pickle"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats / f"rank{rank}.json"

    def heartbeat_files(self) -> list[Path]:
        return sorted(self.heartbeats.glob("rank*.json")) if self.heartbeats.is_dir() else []

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def shared_checkpoints(self) -> Path | ObjectDir:
        """Where the shared tier's committed checkpoints are: :attr:`checkpoints`, or the object store it
        records (``checkpoint.path``: :mod:`hpctrain.rundir.objects`)."""
        return shared_root(self.checkpoints)

    @classmethod
    def of_checkpoints(cls, root: Path) -> RunDir | None:
        """The run directory whose checkpoints folder ``root`` is; None for a folder of another name."""
        return cls(root.parent) if root.name == CHECKPOINTS_DIR else None

    @property
    def profile(self) -> Path:
        return self.path / PROFILE_DIR

    @property
    def tensorboard(self) -> Path:
        """TensorBoard's log directory: event files, and profiler traces under plugins/profile/."""
        return self.path / TENSORBOARD_DIR

    def tensorboard_profile(self, window: str) -> Path:
        """Where TensorBoard's profiler plugin finds the traces of steps ``window`` (its layout)."""
        return self.tensorboard / "plugins" / "profile" / f"steps_{window}"

    @property
    def compile_cache(self) -> Path:
        """torch.compile's caches, one folder per key (hpctrain.parallel.compile.cache_key): a requeued job
        of the same config finds its compiled graphs here, whichever node it lands on."""
        return self.path / COMPILE_CACHE_DIR

    @property
    def wandb(self) -> Path:
        return self.path / WANDB_DIR

    @property
    def report(self) -> Path:
        return self.path / REPORT_DIR

    @property
    def code(self) -> Path:
        """The code snapshot a Slurm job runs."""
        return self.path / CODE_DIR

    @property
    def code_project(self) -> Path:
        return self.code / PROJECT_SUBDIR

    @property
    def slurm(self) -> Path:
        """Slurm's output files (and submitit's pickled job)."""
        return self.path / SLURM_DIR

    @property
    def sbatch_script(self) -> Path:
        return self.path / SBATCH_SCRIPT

    def array_script(self, k: int) -> Path:
        """A sweep submitted over cluster.ssh: the script of its ``k``-th job array."""
        return self.path / ARRAY_SCRIPT.format(k)

    @property
    def eval_script(self) -> Path:
        return self.path / EVAL_SCRIPT

    @property
    def remote_cli(self) -> Path:
        return self.path / REMOTE_CLI

    @property
    def summary_csv(self) -> Path:
        return self.path / SUMMARY_CSV

    @property
    def faults(self) -> Path:
        return self.path / FAULTS_FILE

    @property
    def evals(self) -> Path:
        return self.path / EVAL_FILE

    def append_eval(self, record: dict[str, Any]) -> None:
        """One line of eval.jsonl, appended whole (readers skip a torn last line)."""
        writer = JsonlWriter(self.evals)
        try:
            writer.write(record)
        finally:
            writer.close()

    def read_evals(self) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.evals) if "step" in r]

    @property
    def eval_pins(self) -> Path:
        return self.path / EVAL_PINS_DIR

    def eval_pin(self, step: int) -> Path:
        """trainer.eval_job: the pin of the evaluation submitted for checkpoint ``step``. One file per step,
        written by the training job (before and after sbatch) and released by the evaluation job: no two
        writers share a file, on a shared file system without locks."""
        return self.eval_pins / f"step_{step:08d}.json"

    def write_eval_pin(self, step: int, job_id: str | None, released: str | None = None) -> None:
        """Pin checkpoint ``step`` for evaluation job ``job_id`` (None: being submitted), or with ``released``
        (how it ended: "read", or why it never will be) unpin it while keeping the record for status."""
        self.eval_pins.mkdir(parents=True, exist_ok=True)
        record = {"step": step, "job_id": job_id, "time": time.time(), "released": released}
        atomic_json(self.eval_pin(step), record)

    def read_eval_pins(self) -> dict[int, dict[str, Any]]:
        """Every evaluation pin by step (released ones too); a partly written one is skipped."""
        found: dict[int, dict[str, Any]] = {}
        for path in sorted(self.eval_pins.glob("step_*.json")) if self.eval_pins.is_dir() else []:
            record = read_json(path)
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                found[record["step"]] = record
        return found

    def append_answer(self, record: dict[str, Any]) -> None:
        """The fault policy's answer (a restart, a requeue, the end) as a line of the fault log."""
        self.append_fault({**record, "entry": ANSWER})

    def read_answers(self) -> list[dict[str, Any]]:
        """The fault policy's answers, oldest first: an earlier version's restarts.jsonl, then the log's."""
        legacy = [r for r in read_jsonl(self.path / LEGACY_RESTARTS_FILE) if "time" in r]
        return legacy + [r for r in read_jsonl(self.faults) if "time" in r and r.get("entry") == ANSWER]

    def read_faults(self) -> list[dict[str, Any]]:
        """The faults as first seen (the fault log's lines that are no answer), oldest first."""
        return [r for r in read_jsonl(self.faults) if "time" in r and r.get("entry") != ANSWER]

    @property
    def agents(self) -> Path:
        return self.path / AGENTS_DIR

    def agent_generation(self, job: str) -> Path:
        """The generation (0, 1, ...) of the workers of one job start: an agent that sees it move restarts."""
        return self.agents / f"{job}.generation"

    def agent_members(self, job: str) -> Path:
        """The nodes the current generation of one job start runs on (cluster.spare_nodes, min_nodes)."""
        return self.agents / f"{job}.members"

    def agent_alive(self, job: str, node: str, local: int) -> Path:
        """A file an agent touches while it lives: a node none of whose agents touch theirs is lost."""
        return self.agents / f"{job}.alive" / f"{node}.{local}"

    def agent_done(self, job: str) -> Path:
        """Written when the job start's ranks are done (finished, stopped, given up): its spares leave."""
        return self.agents / f"{job}.done"

    def agent_probe(self, host: str, pid: int) -> Path:
        """A file a node's health check writes and removes: is the run directory writable from there?

        One per process: the tasks of one node check at the same moment, and a shared name let one task's
        unlink remove the file another was about to remove (ENOENT, read as "not writable")."""
        return self.agents / f"{host}.{pid}.probe"

    def agent_claim(self, job: str, generation: int) -> Path:
        """The file whose exclusive creation claims the restart that ends ``generation``."""
        return self.agents / f"{job}.{generation}.claim"

    @property
    def control(self) -> Path:
        return self.path / CONTROL_FILE

    def write_control(self, record: dict[str, Any]) -> None:
        """hpctrain save|stop's request, or the run's answer to it (the same record with ``answered``)."""
        atomic_json(self.control, record)

    def read_control(self) -> dict[str, Any] | None:
        found = read_json(self.control)
        return found if isinstance(found, dict) else None

    def fault_claim(self, job_id: str, restart: int) -> Path:
        """The file whose exclusive creation claims the response to one job start's fault."""
        return self.path / f".fault-{job_id}-{restart}"

    @property
    def submit_log(self) -> Path:
        return self.path / SUBMIT_LOG

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def hydra(self) -> Path:
        return self.path / HYDRA_DIR

    @property
    def hydra_overrides(self) -> Path:
        return self.hydra / HYDRA_OVERRIDES

    @property
    def hydra_record(self) -> Path:
        """Hydra's record of the run's own settings (its cwd, config sources, output dir)."""
        return self.hydra / "hydra.yaml"

    def hydra_records(self) -> list[Path]:
        """Hydra's YAML records of this run (config, hydra, overrides)."""
        return sorted(self.hydra.glob("*.yaml")) if self.hydra.is_dir() else []

    def read_hydra_overrides(self) -> list[str] | None:
        """The overrides Hydra recorded for this run; None when it recorded none (or unreadably)."""
        from omegaconf import OmegaConf

        try:  # as typed: ${oc.env:NAME} (a secret's) is not resolved here
            found = OmegaConf.to_container(OmegaConf.load(self.hydra_overrides), resolve=False)
            return [str(o) for o in found] if isinstance(found, list) else None
        except Exception:  # missing, partly written or not a list: the caller goes on without
            return None

    def record_files(self) -> list[Path]:
        """What says what the run is and where it stands: config.yaml, Hydra's records (.hydra/: the command
        ``hpctrain resume`` replays) and the ranks' error records (``hpctrain status``'s FAILED)."""
        return [*self.recipe_files(), *self.error_files()]

    def snapshot_record(self) -> dict[Path, bytes | None]:
        """The run's record (:meth:`record_files`) as it is now, byte for byte (None: absent), taken before an
        attempt rewrites it, for :meth:`restore_record` when that attempt is refused."""
        found: dict[Path, bytes | None] = {}
        for path in self.record_files():
            try:
                found[path] = path.read_bytes()
            except FileNotFoundError:
                found[path] = None
        return found

    def restore_record(self, snapshot: dict[Path, bytes | None]) -> None:
        """Put the record back as :meth:`snapshot_record` found it: each file rewritten atomically, one the
        refused attempt added (an error record, a first .hydra/ file) removed."""
        for path in [*self.error_files(), *self.record_files()]:
            if path not in snapshot:
                path.unlink(missing_ok=True)
        for path, data in snapshot.items():
            if data is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, data)

    def recipe_files(self) -> list[Path]:
        """What ``hpctrain resume`` replays: config.yaml and Hydra's record (.hydra/)."""
        return [self.config, *(self.hydra / name for name in (RUN_CONFIG, "hydra.yaml", HYDRA_OVERRIDES))]

    def save_record(self, snapshot: dict[Path, bytes | None]) -> None:
        """Keep the recipe (:meth:`recipe_files`) of :meth:`snapshot_record`'s snapshot in the run directory
        (RECORD_BEFORE, plain JSON: name in the run → text, or null for absent), for
        :meth:`restore_saved_record` in the job."""
        names = set(self.recipe_files())
        kept = {
            str(p.relative_to(self.path)): None if d is None else d.decode()
            for p, d in snapshot.items()
            if p in names
        }
        atomic_json(self.path / RECORD_BEFORE, kept)

    def forget_record(self) -> None:
        (self.path / RECORD_BEFORE).unlink(missing_ok=True)

    def restore_saved_record(self) -> bool:
        """Put back the recipe :meth:`save_record` kept (only those files: any other name is ignored, never
        written), so that ``hpctrain resume`` replays what last trained; the refused job's own error records
        stay, for ``hpctrain status`` to say why. False when none was kept or it cannot be read."""
        try:
            kept = json.loads((self.path / RECORD_BEFORE).read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(kept, dict):
            return False
        for path in self.recipe_files():
            name = str(path.relative_to(self.path))
            if name not in kept or not (kept[name] is None or isinstance(kept[name], str)):
                continue
            if kept[name] is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, kept[name])
        self.forget_record()
        return True

    def write_hydra_record(self, texts: dict[str, str]) -> None:
        """Hydra's record of the run (.hydra/config.yaml, hydra.yaml, overrides.yaml: name → text), written
        by hpctrain once the attempt is accepted rather than by Hydra before it was checked."""
        self.hydra.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            atomic_write(self.hydra / name, text)

    def write_hydra_overrides(self, overrides: list[str]) -> None:
        """Record a run's overrides as Hydra does (for runs a launcher creates itself: array members)."""
        from omegaconf import OmegaConf

        self.hydra.mkdir(parents=True, exist_ok=True)
        atomic_write(self.hydra_overrides, OmegaConf.to_yaml(OmegaConf.create(list(overrides))))

    def append_fault(self, record: dict[str, Any]) -> None:
        """One line of the fault log, faults.jsonl (appended whole: readers skip a torn last line)."""
        writer = JsonlWriter(self.faults)
        try:
            writer.write(record)
        finally:
            writer.close()

    def holds_only_records(self, submission: bool = False) -> bool:
        """Whether the directory holds nothing a run made: only what Hydra writes before the task starts
        (.hydra/, hpctrain.log), the run's config and lock (a run that never started leaves these), and
        with ``submission`` what a Slurm submission that was never queued prepared (no job.json)."""
        if not self.path.is_dir():
            return False
        allowed = {HYDRA_DIR, SUBMIT_LOG, RUN_CONFIG, LOCK_FILE}
        if submission:
            allowed |= {CODE_DIR, SLURM_DIR, SBATCH_SCRIPT}
        return all(p.name in allowed for p in self.path.iterdir())

    def is_run(self) -> bool:
        """Whether this looks like a run directory (any of the files a run leaves)."""
        return any(p.is_file() for p in (self.config, self.metrics, self.job))

    # ------------------------------------------------------------------------------------------ files
    def write_config_text(self, text: str) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config, text)
        return self.config

    def restore_config(self) -> Path | None:
        """Put back config.yaml as the run's newest checkpoint saved it (a resume that was refused must not
        leave the refused command's config as the run's); the checkpoint it came from, or None."""
        from hpctrain.rundir import checkpoints as layout

        for checkpoint in layout.committed(self.shared_checkpoints):
            saved = layout.config_copy(checkpoint)
            if saved.is_file():
                text = saved.read_text()
                if not self.config.is_file() or self.config.read_text() != text:
                    atomic_write(self.config, text)
                return checkpoint
        return None

    def read_metrics(self, tail_bytes: int | None = None) -> list[dict[str, Any]]:
        """metrics.jsonl's step records (a torn or partly read line is skipped)."""
        return [r for r in read_jsonl(self.metrics, tail_bytes) if "step" in r]

    def first_metric(self) -> dict[str, Any] | None:
        """metrics.jsonl's first step record (read from the start of the file only), or None."""
        return next((r for r in read_jsonl(self.metrics, head_bytes=64 * 1024) if "step" in r), None)

    def metrics_writer(self) -> JsonlWriter:
        return JsonlWriter(self.metrics)

    def write_ranks(self, ranks: list[dict[str, object]]) -> None:
        atomic_json(self.ranks, ranks)

    def max_steps(self) -> int | None:
        """``trainer.max_steps`` of the run's config.yaml; None when missing, partly written or unreadable."""
        from hpctrain.rundir.files import load_yaml  # a plain YAML read, no resolution

        try:
            return int(load_yaml(self.config).trainer.max_steps)
        except Exception:  # missing, partly written or from another version: progress shows the step only
            return None

    @property
    def rendezvous(self) -> Path:
        return self.path / RENDEZVOUS_FILE

    def write_rendezvous(self, record: dict[str, Any]) -> None:
        atomic_json(self.rendezvous, record)

    def read_rendezvous(self) -> dict[str, Any] | None:
        found = read_json(self.rendezvous)
        return found if isinstance(found, dict) else None

    def read_ranks(self) -> list[dict[str, Any]] | None:
        found = read_json(self.ranks)
        return found if isinstance(found, list) else None


def write_compile_key(folder: Path, inputs: dict[str, Any]) -> None:
    """Record in a compile cache's folder (in a run directory or a shared path) what its key was made of,
    once."""
    if not (folder / COMPILE_KEY_FILE).is_file():
        atomic_json(folder / COMPILE_KEY_FILE, inputs)


__all__ = [
    "COMPILE_KEY_FILE",
    "HYDRA_DIR",
    "JOB_RECORD",
    "LAYOUT",
    "LOCK_FILE",
    "METRICS_FILE",
    "MULTIRUN_RECORD",
    "RANKS_FILE",
    "RUNS_ROOT",
    "RUN_CONFIG",
    "SUBMIT_LOG",
    "SWEEPS_ROOT",
    "SWEEP_RECORD",
    "RunDir",
    "RunLock",
    "atomic_json",
    "atomic_write",
    "write_compile_key",
]


def eval_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The metrics of one eval.jsonl record (the run's val_loss/val_acc, or what eval._target_ returned), in
    the order written."""
    return {
        key: float(value)
        for key, value in record.items()
        if key not in EVAL_RECORD_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
