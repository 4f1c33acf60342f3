"""The members of a sweep, read from Hydra's override grammar before anything runs. Torch-free."""

from __future__ import annotations

import itertools

from hpctrain.errors import ConfigError


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
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            axes.append([override.input_line])
    return [list(combo) for combo in itertools.product(*axes)]


def interval_sweep(overrides: list[str]) -> bool:
    """Whether a sweeper chooses the members as it goes (``interval(...)``: Optuna and the like)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return any(parser.parse_override(o).is_interval_sweep() for o in overrides)
