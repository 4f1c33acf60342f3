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

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "config"  # hpctrain's primary config, conf/config.yaml (Hydra's config_name)
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


def option_file(group: str, option: str | None, config_dirs: Sequence[Path] = ()) -> Path | None:
    """The yaml behind ``group=option``, searched in Hydra's order (hpctrain's conf/ first), or None."""
    if option is None:
        return None
    return next(
        (p for d in (CONF_DIR, *config_dirs) if (p := Path(d) / group / f"{option}.yaml").is_file()), None
    )


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


SCRIPT_ARGS = "task.args"


def literal_script_args(overrides: list[str]) -> list[str]:
    """``overrides`` with ``task.args=[...]`` elements quoted, so the script gets them as typed: Hydra
    would read ``[--lr,1e-3,--tag,1.10]`` as numbers and hand the script ``0.001`` and ``1.1``."""
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        lists = _top_level(value) if key.lstrip("+") == SCRIPT_ARGS and sep else None
        if not lists or not all(v.startswith("[") and v.endswith("]") for v in lists):
            out.append(text)  # not a list, nor a sweep over lists (-m task.args='[a]','[b]')
            continue
        split = [_split_list(v[1:-1]) for v in lists]
        if any(items is None for items in split):
            out.append(text)
            continue
        out.append(f"{key}=" + ",".join(f"[{','.join(_quoted(i) for i in items or [])}]" for items in split))
    return out


def _top_level(value: str) -> list[str] | None:
    """``value`` split at the commas outside brackets and quotes (None when unbalanced)."""
    parts, current, depth, quote = [], "", 0, None
    for ch in value:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    if quote or depth:
        return None
    return [*parts, current]


def _split_list(body: str) -> list[str] | None:
    """The elements of a flat list's text, split at top-level commas (quotes kept as written); None for a
    nested or unbalanced one (Hydra's own parser reports it)."""
    items, current, quote = [], "", None
    for ch in body:
        if quote:
            current += ch
            quote = None if ch == quote else quote
        elif ch in "'\"":
            current += ch
            quote = ch
        elif ch in "[]{}":
            return None
        elif ch == ",":
            items.append(current.strip())
            current = ""
        else:
            current += ch
    if quote:
        return None
    if current.strip() or items:
        items.append(current.strip())
    return items


def _quoted(item: str) -> str:
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
        return item  # quoted already: Hydra reads it as a string
    if "'" not in item:
        return f"'{item}'"
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


SWEEPER_PARAMS = "hydra.sweeper.params"


def sweeper_params(overrides: list[str]) -> list[str]:
    """``hydra.sweeper.params={optim.lr: "interval(1e-4,1e-2)", ...}`` (the Optuna sweeper's documented form
    of a search space) as the overrides ``optim.lr=interval(1e-4,1e-2)`` the sweeper reads the same way:
    Hydra cannot merge a mapping into the sweeper's empty ``params`` from the command line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out: list[str] = []
    parser = OverridesParser.create()
    for text in overrides:
        if text.lstrip("+").split("=", 1)[0] != SWEEPER_PARAMS:
            out.append(text)
            continue
        try:
            value = parser.parse_override(text.lstrip("+")).value()
        except Exception as err:
            reason = str(err).splitlines()[0]
            raise ConfigError("", None, f"cannot parse override '{text}': {reason}") from None
        if not isinstance(value, dict) or not value:
            raise ConfigError(
                SWEEPER_PARAMS, value, "not a mapping of keys to search spaces",
                valid="{optim.lr: 'interval(1e-4,1e-2)', trainer.seed: 'choice(1,2)'}",
            )  # fmt: skip
        out += [f"{key}={space}" for key, space in value.items()]
    return out


def plain_parameters(overrides: list[str], config_dirs: Sequence[Path] = ()) -> list[str]:
    """``overrides`` with a ``+`` added to each ``model.KEY=V`` / ``data.KEY=V`` / ``loss.KEY=V`` whose KEY
    the chosen option's YAML does not list but its ``_target_``'s signature takes: any parameter of the
    user's factory is a plain override, as any key of a YAML is. Nothing else changes."""
    out = list(overrides)
    parsed: dict[str, Any] | None = None
    for i, text in enumerate(overrides):
        key = text.split("=", 1)[0]
        if key.startswith("data.collate."):  # hpctrain's own node: given whole or key by key, never with +
            key = "data.collate"
        group, _, name = key.partition(".")
        if (
            text.startswith(("+", "~"))
            or "=" not in text
            or group not in TARGET_GROUPS
            or not name.isidentifier()
        ):
            continue
        parsed = parsed if parsed is not None else _parse_overrides(overrides)
        dirs = [*config_dirs, *searchpath_dirs(parsed)]
        listed, target = _option_keys(group, parsed, dirs)
        if name in listed and not (name == "collate" and "collate" not in _yaml_keys(group, parsed, dirs)):
            continue
        if name == "collate" or (target is not None and name in (target_parameters(target) or ())):
            out[i] = f"+{text}"
    return out


def _yaml_keys(group: str, parsed: dict[str, Any], dirs: Sequence[Path]) -> set[str]:
    path = option_file(group, _choice(group, parsed), dirs)
    node = OmegaConf.load(path) if path is not None else None
    return {str(k) for k in node} if isinstance(node, DictConfig) else set()


def _option_keys(group: str, parsed: dict[str, Any], dirs: Sequence[Path]) -> tuple[set[str], str | None]:
    """The keys the chosen option of ``group`` lists (with hpctrain's own), and its ``_target_`` (an
    override of it wins)."""
    own = set(DATA_KEYS) | {"collate"} if group == "data" else set(MODEL_KEYS) if group == "model" else set()
    path = option_file(group, _choice(group, parsed), dirs)
    node = OmegaConf.load(path) if path is not None else OmegaConf.create({})
    listed = {str(k) for k in node} | own if isinstance(node, DictConfig) else own
    target = parsed.get(f"{group}._target_") or (
        node.get("_target_") if isinstance(node, DictConfig) else None
    )
    return listed, str(target) if target else None


def target_parameters(target: str) -> list[str] | None:
    """The keyword parameters a ``_target_`` takes (``split`` left out: hpctrain passes it), from its
    signature; None when it cannot be imported, has none to read, or takes any keyword (``**kwargs``)."""
    import inspect

    from hpctrain.config.typed import locate

    try:
        fn = locate("_target_", target)
        signature = inspect.signature(fn)
    except Exception:  # not importable here, or a builtin: the usual errors say more, later
        return None
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name not in ("self", "split")]


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
        Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
        yield
    finally:
        restore_gh_from_backup(backup)


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


def searchpath_dirs(parsed: dict[str, Any]) -> list[Path]:
    """The file system directories of a ``hydra.searchpath=[...]`` override (``file://DIR`` or ``DIR``)."""
    entries = parsed.get("hydra.searchpath")
    if not isinstance(entries, list):
        return []
    dirs = []
    for entry in entries:
        text = str(entry)
        if "://" not in text or text.startswith("file://"):
            dirs.append(Path(text.removeprefix("file://")))
    return dirs


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


def _parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """key → value text of each override; a malformed override is reported on its own."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed: dict[str, Any] = {}
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception as err:
            reason = str(err).splitlines()[0]
            raise ConfigError("", None, f"cannot parse override '{text}': {reason}") from None
        parsed[override.key_or_group] = override.value()
    return parsed


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
    first_line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return ConfigError("", None, first_line)


def _target_hint(group: str, key: str, parsed: dict[str, Any], dirs: Sequence[Path]) -> tuple[str, str]:
    """("; did you mean X?", what is valid) for an unknown key of a ``_target_`` group: the parameters of
    its ``_target_`` (read from its signature; else the keys its option lists) and hpctrain's own keys."""
    listed, target = _option_keys(group, parsed, dirs)
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


def _choice(group: str, parsed: dict[str, Any]) -> str | None:
    if group in parsed:
        return str(parsed[group])
    defaults = OmegaConf.load(CONF_DIR / f"{CONFIG_NAME}.yaml").get("defaults", [])
    for entry in defaults:
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    return None


def _missing_option(message: str) -> tuple[str | None, str | None]:
    # "In 'config': Could not find 'model/zzz'" → ("model", "zzz")
    marker = "Could not find '"
    if marker not in message:
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
