"""The members of a sweep, read from Hydra's override grammar before anything runs. Torch-free."""

from __future__ import annotations

import itertools
from typing import Any

from hpctrain.errors import ConfigError, require_package

MAX_MEMBERS = 10_000  # a sweep larger than this is a typo (Slurm's own MaxArraySize defaults to 1001)


def sweep_members(overrides: list[str]) -> list[list[str]]:
    """The override lists of a basic-sweeper grid. Interval sweeps (Optuna & co) cannot be enumerated ahead:
    they are left out here and each trial is validated when it starts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    axes: list[list[str]] = []
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception as err:  # Hydra's grammar errors: one line, like compose's
            reason = str(err).splitlines()[0]
            raise ConfigError("", None, f"cannot parse override '{text}': {reason}") from None
        key = override.get_key_element()
        if override.is_interval_sweep():
            continue
        if override.is_sweep_override():
            try:  # a range is expanded lazily: a step of 0 or a huge range is found here, not later
                values = list(itertools.islice(override.sweep_string_iterator(), MAX_MEMBERS + 1))
            except Exception as err:
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ConfigError(key, text.split("=", 1)[-1], f"not a valid sweep: {reason}") from None
            if not values:
                raise ConfigError(
                    key,
                    text.split("=", 1)[-1],
                    "sweeps over no value",
                    valid="e.g. 1,2,3 or range(0,10,2) (from below to above the stop)",
                )
            axes.append([f"{key}={value}" for value in values])
        else:
            axes.append([override.input_line])
    total = 1
    for axis in axes:
        total *= len(axis)
    if total > MAX_MEMBERS:
        count = total if all(len(a) <= MAX_MEMBERS for a in axes) else f"more than {MAX_MEMBERS}"
        raise ConfigError(
            "-m",
            " ".join(overrides),
            f"would start {count} runs",
            valid=f"at most {MAX_MEMBERS} members in one sweep",
        )
    return [list(combo) for combo in itertools.product(*axes)]


def interval_sweep(overrides: list[str]) -> bool:
    """Whether a sweeper chooses the members as it goes (``interval(...)``: Optuna and the like)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return any(parser.parse_override(o).is_interval_sweep() for o in overrides)


def chosen_sweeper(composed: Any) -> str:
    """The sweeper a command chose (Hydra's ``basic`` grid unless ``hydra/sweeper=...``)."""
    return str(composed.hydra.runtime.choices.get("hydra/sweeper") or "basic")


# The sweepers an extra of hpctrain installs: Hydra's plugin (without it Hydra knows no such config and says
# "unknown config") and the library the plugin drives (without it Hydra fails as it builds the sampler).
SWEEPER_PACKAGES = {"optuna": ("hydra_plugins.hydra_optuna_sweeper", "optuna")}


def require_sweeper(name: str) -> None:
    """A MissingPackage naming the pip line when ``hydra/sweeper=name`` needs a package not installed here."""
    for package in SWEEPER_PACKAGES.get(name, ()):
        require_package("hydra/sweeper", name, package)


def sampler_sweep(overrides: list[str], composed: Any) -> bool:
    """Whether a sweeper chooses the members from results as it goes (Optuna and the like): they cannot be
    listed ahead."""
    return interval_sweep(overrides) or chosen_sweeper(composed) != "basic"


def describe_sampler_sweep(overrides: list[str], composed: Any, where: str) -> list[str]:
    """What a dry run of a sampler-driven sweep says: the sweeper, how many trials, the search space."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    space = [o for o in overrides if parser.parse_override(o).is_sweep_override()]
    params = composed.hydra.sweeper.get("params") or {}
    space += [f"{key}={value}" for key, value in params.items()]
    trials = composed.hydra.sweeper.get("n_trials")
    count = f"{trials} trials" if trials is not None else "its trials"
    return [
        f"Dry run: nothing started. hydra/sweeper={chosen_sweeper(composed)} would run {count} ({where}), "
        f"each chosen from the results before it, in {composed.hydra.sweep.dir}",
        f"  search space: {' '.join(space) or '(none given)'}",
    ]
