"""Compose a run's config from ``conf/`` + command-line overrides, turning Hydra's errors into one line.

A user's own config directories (``--config-dir DIR`` and ``hydra.searchpath=[file://DIR]``) are searched
as Hydra searches them: after hpctrain's ``conf/``, so they add groups and options (``model=cnn`` finds
``DIR/model/cnn.yaml``) and hpctrain's ``config.yaml`` stays the primary config; an option both define is
hpctrain's. :func:`config_context` builds that search path for the precheck and the single run alike.

Hydra reports a bad override over several lines (and hints at HYDRA_FULL_ERROR); here every failure becomes a
:class:`ConfigError` naming the key, the value and what would be valid. No torch on this path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpctrain.config.overrides import (
    CONF_DIR,
    CONFIG_NAME,
    literal_script_args,
    option_file,
    option_keys,
    plain_parameters,
    searchpath_dirs,
    sweeper_params,
    target_parameters,
)
from hpctrain.config.overrides import choice as _choice
from hpctrain.config.overrides import parse_overrides as _parse_overrides
from hpctrain.config.repository import remember_compositions, shared_repository
from hpctrain.config.schema import (
    DATA_KEYS,
    GROUP_SCHEMAS,
    MODEL_KEYS,
    TARGET_GROUPS,
    Config,
    register_configs,
)
from hpctrain.config.typed import to_config
from hpctrain.errors import ConfigError

GROUPS = (*TARGET_GROUPS, *GROUP_SCHEMAS)
USER_DATA_KEYS = ("num_workers", "collate", "target_key")  # hpctrain's keys that a user's dataset takes too


def user_config_dirs(given: str | None) -> list[Path]:
    """``--config-dir DIR`` (relative to the current directory) as the list compose() takes; a ConfigError
    when DIR is not a directory."""
    if given is None:
        return []
    if not Path(given).is_dir():
        raise ConfigError("", None, f"--config-dir: {given!r} is not a directory")
    return [Path(given).absolute()]


def group_options(group: str, config_dirs: Sequence[Path] = ()) -> list[str]:
    """The options of ``group`` in hpctrain's conf/ and in the user's config directories."""
    return sorted({p.stem for d in (CONF_DIR, *config_dirs) for p in (Path(d) / group).glob("*.yaml")})


def schema_of(group: str, option: str | None, config_dirs: Sequence[Path] = ()) -> type | None:
    """The dataclass behind ``group=option`` (read from the option's defaults list), or None."""
    if group in TARGET_GROUPS:
        return None
    schemas = GROUP_SCHEMAS.get(group, {})
    if len(schemas) == 1:
        return next(iter(schemas.values()))
    path = option_file(group, option, config_dirs)
    if path is None:
        return None
    for entry in OmegaConf.load(path).get("defaults", []):
        if isinstance(entry, str) and entry.startswith(f"/schema/{group}/"):
            return schemas.get(entry.split("/")[3].split("@")[0])
    return None


def nearest(key: str, names: Sequence[str] | set[str]) -> str:
    """``; did you mean NAME?`` for the closest of ``names`` to a misspelt ``key``, else nothing."""
    import difflib

    close = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def field_names(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def compose(overrides: list[str], config_dirs: Sequence[Path] = ()) -> DictConfig:
    """The composed config, ``hydra`` node included, or a ConfigError for the first bad override.

    ``config_dirs`` are the user's ``--config-dir`` directories (absolute or relative to the current one).
    A parameter of a ``_target_``'s signature needs no ``+`` (:func:`plain_parameters`)."""
    from hydra import compose as hydra_compose

    overrides = plain_parameters(literal_script_args(sweeper_params(overrides)), config_dirs)
    parsed = _parse_overrides(overrides)
    dirs = [*config_dirs, *searchpath_dirs(parsed)]
    register_configs()
    with config_context(config_dirs):
        try:
            return hydra_compose(CONFIG_NAME, overrides=overrides, return_hydra_config=True)
        except Exception as err:  # Hydra raises several unrelated types; all become one line
            raise _translate(err, parsed, dirs) from None


@contextlib.contextmanager
def config_context(config_dirs: Sequence[Path] = ()) -> Iterator[None]:
    """Hydra initialized on hpctrain's conf/ plus ``config_dirs``, placed as ``--config-dir`` places one
    (after conf/, before the structured schemas), like ``hydra.initialize_config_dir`` otherwise."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from hydra.version import setbase

    backup = get_gh_backup()
    setbase("1.3")
    search_path = create_config_search_path(str(CONF_DIR))
    for directory in config_dirs:
        search_path.prepend(
            "command-line", f"file://{Path(directory).absolute()}", anchor=SearchPathQuery(provider="schema")
        )
    try:
        GlobalHydra.instance().clear()
        _share(Hydra.create_main_hydra2(task_name="app", config_search_path=search_path), search_path)
        yield
    finally:
        restore_gh_from_backup(backup)


@contextlib.contextmanager
def shared_compositions() -> Iterator[None]:
    """Within the block, a Hydra that ``hydra.main`` creates reads its search path's files through the
    process's shared repository and reuses merged defaults lists, as :func:`config_context` does for a
    composition of ours. A multirun composes each member twice more (the sweeper's check of its batch, then
    the launcher's ``load_sweep_config``): uncached, those were ~0.3 s of a sweep's ~0.43 s per member."""
    from hydra._internal.hydra import Hydra

    original = Hydra.__dict__["create_main_hydra2"]

    def create_main_hydra2(cls: type[Hydra], task_name: str, config_search_path: Any) -> Hydra:
        return _share(original.__func__(cls, task_name, config_search_path), config_search_path)

    Hydra.create_main_hydra2 = classmethod(create_main_hydra2)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Hydra.create_main_hydra2 = original  # type: ignore[method-assign]


def _share(hydra: Any, search_path: Any) -> Any:
    """``hydra`` reading each file of its search path once per process (the shared repository), not once per
    composition, and reusing the merge of a defaults list it merged before."""
    hydra.config_loader.repository = shared_repository(search_path)
    remember_compositions(hydra.config_loader)
    return hydra


def shadowed_choices(cfg: DictConfig, config_dirs: Sequence[Path] = ()) -> list[str]:
    """The chosen options (``model=gpt``) that a user's config directory defines but hpctrain's conf/ also
    does: Hydra takes hpctrain's, and the user's file is not used."""
    dirs = [*config_dirs, *searchpath_dirs({"hydra.searchpath": list(cfg.hydra.get("searchpath") or [])})]
    shadowed = []
    for group, option in cfg.hydra.runtime.choices.items():
        builtin = CONF_DIR / group / f"{option}.yaml"
        if option is None or group.startswith("hydra/") or not builtin.is_file():
            continue
        shadowed += [str(p) for d in dirs if (p := Path(d) / group / f"{option}.yaml").is_file()]
    return shadowed


def to_typed(cfg: DictConfig) -> Config:
    """The run config (without Hydra's node) as typed dataclasses, rejecting keys added with ``+``."""
    for group in GROUPS:
        node = cfg.get(group)
        schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if schema is None or not dataclasses.is_dataclass(schema):
            continue
        known = set(field_names(schema))
        for key in node:
            if key not in known:
                raise ConfigError(
                    f"{group}.{key}",
                    node._get_node(key)._value(),
                    "unknown key" + nearest(str(key), known),
                    valid=", ".join(sorted(known)),
                )
    run_keys = {key: cfg[key] for key in cfg if key != "hydra"}
    top_level = set(field_names(Config))
    for key in run_keys:
        if key not in top_level:
            raise ConfigError(
                key, cfg._get_node(key)._value(), "unknown key", valid=", ".join(sorted(top_level))
            )
    return to_config(run_keys)


def _translate(err: Exception, parsed: dict[str, Any], dirs: Sequence[Path] = ()) -> ConfigError:
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = err.__cause__ or err
    full_key = getattr(cause, "full_key", None) or ""
    if isinstance(err, MissingConfigException):
        group, option = _missing_option(str(err))
        if group in GROUPS:
            return ConfigError(group, option, "unknown option", valid=", ".join(group_options(group, dirs)))
        return ConfigError(group or "", option, "unknown config")
    if isinstance(cause, ValidationError) and full_key:
        return ConfigError(full_key, parsed.get(full_key), f"expected {_expected_type(full_key)}")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key:
        group, _, rest = full_key.partition(".")
        if group in GROUPS and "." in rest:  # a new key inside a mapping such as cluster.env
            mapping = full_key.rsplit(".", 1)[0]
            given = next((k for k in parsed if k.startswith(mapping)), mapping)
            return ConfigError(
                full_key,
                parsed.get(given),
                f"{mapping} has no such key yet",
                valid=f"add one with +{full_key}=VALUE",
            )
        if group in GROUPS and rest:
            schema = schema_of(group, _choice(group, parsed), dirs)
            valid = ", ".join(field_names(schema)) if schema else None
            hint = nearest(rest, field_names(schema)) if schema else ""
            if group in TARGET_GROUPS:
                hint, valid = _target_hint(group, rest, parsed, dirs)
            return ConfigError(full_key, parsed.get(full_key), f"unknown key of {group}{hint}", valid=valid)
        return ConfigError(
            full_key, parsed.get(full_key), "unknown config group or key", valid="groups " + ", ".join(GROUPS)
        )
    text = str(err)
    found = re.search(r"In '([^']+)'.*?Key '([^']+)' not in .*?full_key: (\S+)", text, re.S)
    if found:  # a key of an option file (a cluster profile of the user's) that its group's schema lacks
        source, key, full_key = found.groups()
        group = full_key.split(".", 1)[0]
        schema = schema_of(group, source.split("/")[-1], dirs) if group in GROUPS else None
        names = field_names(schema) if schema else []
        path = option_file(group, source.split("/")[-1], dirs)
        value = OmegaConf.load(path).get(key) if path is not None else None
        reason = f"unknown key in {path or source}{nearest(key, names)}"
        return ConfigError(full_key, value, reason, valid=", ".join(names) or None)
    mark = getattr(err, "problem_mark", None)
    if mark is not None and getattr(mark, "name", "").endswith(".yaml"):  # a YAML file that does not parse
        group = Path(mark.name).parent.name
        key, option = (group, Path(mark.name).stem) if group in GROUPS else ("--config-dir", None)
        problem = getattr(err, "problem", None) or text.strip().splitlines()[0]
        return ConfigError(
            key,
            option,
            f"{mark.name} is not valid YAML: {problem} (line {mark.line + 1}, column {mark.column + 1})",
        )
    first_line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return ConfigError("", None, first_line)


def _target_hint(group: str, key: str, parsed: dict[str, Any], dirs: Sequence[Path]) -> tuple[str, str]:
    """("; did you mean X?", what is valid) for an unknown key of a ``_target_`` group: the parameters of
    its ``_target_`` (read from its signature; else the keys its option lists) and hpctrain's own keys."""
    listed, target = option_keys(group, parsed, dirs)
    params = target_parameters(target) if target else None
    if group == "model":
        own = list(MODEL_KEYS)
    elif group == "data":  # a dataset of the user's takes only these of hpctrain's keys
        user_data = target is not None
        own = [k for k in DATA_KEYS if k != "_target_" and (not user_data or k in USER_DATA_KEYS)]
    else:
        own = []
    yaml_keys = sorted(k for k in listed if not k.startswith("_") and k not in own)
    hint = nearest(key, sorted({*(params or []), *yaml_keys, *own}))
    parts = []
    if params is not None:
        parts.append(f"{target}'s parameters: {', '.join(params) or 'none'}")
    elif yaml_keys:
        parts.append(f"{group}={_choice(group, parsed)}'s keys: {', '.join(yaml_keys)}")
    if own:
        parts.append(f"hpctrain's: {', '.join(own)}")
    return hint, "; ".join(parts) or f"add one with +{group}.{key}=VALUE"


def _missing_option(message: str) -> tuple[str | None, str | None]:
    # "In 'config': Could not find 'model/zzz'" → ("model", "zzz"); an option of a list
    # (logger=[console,zzz]) is "Could not load 'logger/zzz'"
    marker = next((m for m in ("Could not find '", "Could not load '") if m in message), None)
    if marker is None:
        return None, None
    path = message.split(marker, 1)[1].split("'", 1)[0]
    group, _, option = path.rpartition("/")
    return group, option


def _expected_type(full_key: str) -> str:
    group, _, name = full_key.partition(".")
    schemas = GROUP_SCHEMAS.get(group, {}).values() if name else [Config]
    name = name or group
    for schema in schemas:
        for f in dataclasses.fields(schema):
            if f.name == name:
                return _TYPE_WORDS.get(str(f.type), str(f.type))
    return "a value of the declared type"


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "str | None": "a string or null",
    "int | None": "an integer or null",
    "float | None": "a number or null",
    "list[str]": "a list of strings, e.g. [a,b]",
}
