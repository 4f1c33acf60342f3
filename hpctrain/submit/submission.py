"""A submission: every run a command would start, composed once, its implied overrides resolved in one
explicit phase, then checked by one ordered table before Hydra creates a directory or any process starts.

    submission = Submission.compose(overrides, multirun, config_dirs)   # phases 1 and 2
    submission.check()                                                   # phase 3: STAGES, then WHOLE

1. The overrides as typed become what Hydra gets: ``run=NAME`` alone continues that run's recipe, a typed
   secret goes into the environment (Hydra gets ``${oc.env:NAME}``), a parameter of a user's factory needs
   no ``+``.
2. What the first run implies is added once, each said or silent as before: ``run=NAME``'s stable
   directory, and the data that feeds the model when none was chosen (said once every check passed: a
   refused command prints its one line and nothing else). Then every member is composed.
3. :data:`STAGES` check each member in order, then :data:`WHOLE` the submission. The order is what a user
   sees as "the one line" when several things are wrong: the first stage that refuses speaks.
   tests/unit/submit/test_submission.py holds it.

No torch here: the probe of a user's code runs in a child of the fork server or imports torch where it is
needed (:mod:`hpctrain.submit.torchside`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.errors import ConfigError
from hpctrain.submit import precheck as rooms


@dataclass
class Member:
    """One run of the submission: its overrides, as Hydra composed them, typed."""

    index: int
    overrides: list[str]
    composed: DictConfig
    cfg: Config
    shape: RunShape | None = None  # once the config stage passed

    @property
    def first(self) -> bool:
        return self.index == 0


@dataclass
class Submission:
    overrides: list[str]  # what Hydra's own run or sweep gets: the caller's list, updated in place
    multirun: bool
    config_dirs: list[Path]
    members: list[Member] = field(default_factory=list)
    said: list[str] = field(default_factory=list)  # lines printed once every check passed
    probed: set[str] = field(default_factory=set)  # the torch side checked once per distinct combination
    warned: set[str] = field(default_factory=set)

    @classmethod
    def compose(cls, overrides: list[str], multirun: bool, config_dirs: list[Path]) -> Submission:
        """Phases 1 and 2: the overrides Hydra gets, what the first run implies, every member composed."""
        from hpctrain.config.compose import literal_script_args, plain_parameters, sweeper_params
        from hpctrain.config.redact import secret_overrides
        from hpctrain.plan.check import data_for_model
        from hpctrain.submit.existing import named_run_overrides, own_recipe

        overrides[:] = secret_overrides(own_recipe(overrides, multirun))
        overrides[:] = plain_parameters(literal_script_args(sweeper_params(overrides)), config_dirs)
        sub = cls(overrides, multirun, config_dirs)
        first = sub._member(0, sub._member_overrides()[0])
        named = named_run_overrides(first.cfg.run, overrides, multirun)
        if named:  # run=NAME: its stable directory, for these checks and for Hydra's own run alike
            overrides.extend(named)
            first = sub._member(0, sub._member_overrides()[0])
        choice = data_for_model(first.cfg, first.overrides)
        if choice is not None:  # the data follows the model the user chose: said once all passed
            sub.said.append(rooms.data_choice_line(first.cfg, choice))
            overrides.append(choice)
            first = sub._member(0, sub._member_overrides()[0])
        sub.members = [first]
        for i, member in enumerate(sub._member_overrides()[1:], 1):
            sub.members.append(sub._member(i, member))
        return sub

    def _member_overrides(self) -> list[list[str]]:
        from hpctrain.submit.sweep import sweep_members

        return sweep_members(self.overrides) if self.multirun else [self.overrides]

    def _member(self, index: int, overrides: list[str]) -> Member:
        from hpctrain.config.compose import compose, to_typed
        from hpctrain.submit.sweep import chosen_sweeper, require_sweeper

        try:
            composed = compose(overrides, self.config_dirs)
        except ConfigError as err:
            if err.key == "hydra/sweeper":  # Hydra knows a sweeper's config only once its plugin is installed
                require_sweeper(str(err.value))
            raise
        require_sweeper(chosen_sweeper(composed))  # the plugin installed, the library it drives perhaps not
        return Member(index, list(overrides), composed, to_typed(composed))

    @property
    def first(self) -> tuple[Config, DictConfig]:
        return self.members[0].cfg, self.members[0].composed

    def check(self) -> None:
        """Phase 3: every member through :data:`STAGES`, then the submission through :data:`WHOLE`; the
        first refusal raises its ConfigError. Then the lines phase 2 had to say."""
        for member in self.members:
            for stage in STAGES:
                stage.check(self, member)
        for whole in WHOLE:
            whole.check(self)
        for line in self.said:
            print(line)

    def run_dir(self, member: Member) -> Path | None:
        """Where a single run is written (None for a sweep's members: their folder is the sweep's)."""
        return None if self.multirun else rooms.resolved_dir(member.composed, "hydra.run.dir")


# --- the table ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    check: Callable[[Submission, Member], None]


@dataclass(frozen=True)
class Whole:
    name: str
    what: str
    check: Callable[[Submission], None]


def _config(sub: Submission, m: Member) -> None:
    from hpctrain.config.validate import validate

    m.shape = validate(m.cfg)


def _model_and_data(sub: Submission, m: Member) -> None:
    from hpctrain.models.builtin import model_spec
    from hpctrain.plan.check import check_model

    assert m.shape is not None, "the config stage comes first"
    check_model(m.cfg, model_spec(m.cfg.model), m.shape)


def _precision(sub: Submission, m: Member) -> None:
    from hpctrain.errors import require_package

    if m.cfg.trainer.precision == "fp8":
        # The package first, wherever the run goes (a Slurm job runs this Python's packages): its pip line is
        # the one fix on any machine, the GPU the next. A Slurm job's device is known only on its node.
        require_package("trainer.precision", "fp8", "torchao")
        if m.cfg.cluster.kind == "local":
            rooms.check_float8_here()


def _this_shell(sub: Submission, m: Member) -> None:
    if m.first and m.cfg.cluster.kind == "local":
        rooms.check_slurm_counts()  # read by every rank of a local run too (requeues, the checkpoint's job)
        if m.cfg.cluster.fork_server:
            from hpctrain.launch.forked import check_server_env

            check_server_env()  # a HPCTRAIN_FORKSERVER that names no running server


def _probe_and_fits(sub: Submission, m: Member) -> None:
    # The user's model, data and loss on the meta device, init_from's names and shapes, and whether the run
    # fits: torch's side, in one pass (in a child of a persistent fork server, when one serves).
    from hpctrain.submit.torchside import check_torch_side_where_cheapest

    check_torch_side_where_cheapest(m.cfg, m.composed, sub.run_dir(m), sub.probed)


def _site(sub: Submission, m: Member) -> None:
    # What the config itself cannot do is said first (above), then where it cannot be submitted from.
    if m.first and m.cfg.cluster.kind == "slurm" and not m.cfg.dry_run:
        rooms.check_ssh_sweep(m.cfg, sub.multirun, m.composed)
        rooms.check_slurm_here(m.cfg)
        rooms.check_not_example(m.cfg)


def _shadowed(sub: Submission, m: Member) -> None:
    from hpctrain.config.compose import shadowed_choices

    for path in shadowed_choices(m.composed, sub.config_dirs):
        if path not in sub.warned:  # Hydra finds hpctrain's conf/ first
            sub.warned.add(path)
            print(f"hpctrain: warning: {path} is not used: hpctrain has an option so named", file=sys.stderr)


def _run_directory(sub: Submission, m: Member) -> None:
    from hpctrain.config.validate import check_writable_dir
    from hpctrain.submit.existing import check_existing, check_not_in_checkpoint
    from hpctrain.submit.store import check_store_answers

    run_dir = sub.run_dir(m)
    if run_dir is None:  # a sweep member
        sweep_dir = rooms.resolved_dir(m.composed, "hydra.sweep.dir")
        check_not_in_checkpoint("hydra.sweep.dir", sweep_dir)
        check_writable_dir("hydra.sweep.dir", sweep_dir)
        check_store_answers(m.cfg)
        return
    check_not_in_checkpoint("hydra.run.dir", run_dir)
    check_writable_dir("hydra.run.dir", run_dir)
    rooms.check_unlocked(run_dir)
    check_store_answers(m.cfg)  # checkpoint.path: the store takes a write (before its listing is read)
    check_existing(run_dir, m.cfg, m.composed)  # new, empty, or a run this one continues


def _sweep_name(sub: Submission) -> None:
    from hpctrain.submit.existing import check_sweep_reuse

    if sub.multirun:
        # checkpoint.path: one store prefix per member (in one, each would move the others' aside).
        paths = [m.cfg.checkpoint.path.rstrip("/") for m in sub.members if m.cfg.checkpoint.path]
        shared = next((p for p in paths if paths.count(p) > 1), None)
        if shared is not None:
            raise ConfigError(
                "checkpoint.path",
                shared,
                f"shared by {paths.count(shared)} members of the sweep: each run needs its own prefix",
                valid="a swept value, e.g. checkpoint.path=s3://bucket/sweep/a,s3://bucket/sweep/b",
            )
        # A sweep's name reused with other values would relabel its results.
        first = sub.members[0]
        sweep_dir = rooms.resolved_dir(first.composed, "hydra.sweep.dir").absolute()
        check_sweep_reuse(sweep_dir, sub.overrides, first.cfg.run)


def _pack(sub: Submission) -> None:
    rooms.check_pack(sub.members[0].cfg, len(sub.members), sub.multirun)


def _eval_jobs(sub: Submission) -> None:
    rooms.check_eval_job(sub.members[0].cfg, sub.config_dirs)


def _snapshot(sub: Submission) -> None:
    cfg = sub.members[0].cfg
    if cfg.cluster.kind == "slurm":  # a project too big to snapshot is refused before anything is written
        from hpctrain.launch.project import project_dir
        from hpctrain.launch.snapshot import plan_project

        plan_project(project_dir(), cfg.cluster.snapshot_paths)


def _partitions(sub: Submission) -> None:
    cfg = sub.members[0].cfg
    if cfg.cluster.kind == "slurm":
        from hpctrain.slurm.commands import use_remote
        from hpctrain.slurm.remote import Remote

        remote = Remote(cfg.cluster.ssh, cfg.cluster.ssh_config) if cfg.cluster.ssh else None
        with use_remote(remote):
            rooms.check_partitions(cfg)


# Each member, in this order: the first refusal is the one line the user sees.
STAGES = (
    Stage("config", "its own rules: types, ranges, degrees, batch arithmetic", _config),
    Stage("model and data", "the model's declared rules; the data that feeds it", _model_and_data),
    Stage("precision", "fp8: torchao installed; a local run's GPUs", _precision),
    Stage("this shell", "a local run: Slurm counts in it, HPCTRAIN_FORKSERVER", _this_shell),
    Stage("probe and fits", "the user's code on the meta device, init_from, the memory fit", _probe_and_fits),
    Stage("site", "a Slurm run: ssh, a Slurm client here, not an example profile", _site),
    Stage("shadowed options", "a warning for a --config-dir file an option of hpctrain hides", _shadowed),
    Stage(
        "run directory",
        "not in a checkpoint, writable, not held, its checkpoint store answers, new or continued",
        _run_directory,
    ),
)
# Then the submission as a whole.
WHOLE = (
    Whole("sweep name", "a sweep's folder reused with other values", _sweep_name),
    Whole("pack", "cluster.pack: no more than the sweep's members", _pack),
    Whole("evaluation jobs", "trainer.eval_job: a Slurm profile, for a Slurm run", _eval_jobs),
    Whole("snapshot", "a Slurm run: the project small enough to snapshot", _snapshot),
    Whole("partitions", "a Slurm run: every partition exists", _partitions),
)


def precheck(
    overrides: list[str], multirun: bool, config_dirs: list[Path] | None = None
) -> tuple[Config, DictConfig]:
    """Compose and check every run the command would start (:class:`Submission`); raise ConfigError for the
    first refusal. Returns the first run's config, typed and as composed (with Hydra's node).
    ``overrides``: the caller's list, updated in place with what Hydra's own run gets."""
    submission = Submission.compose(overrides, multirun, config_dirs or [])
    submission.check()
    return submission.first
