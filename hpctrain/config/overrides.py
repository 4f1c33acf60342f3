"""What a command line means before Hydra reads it: overrides rewritten to the form Hydra takes, so that
what a user types works as typed. Torch-free (a user's ``_target_`` is imported only to read its signature).

- A parameter of a ``model`` / ``data`` / ``loss`` ``_target_``'s signature is a plain override, no ``+``
  (:func:`plain_parameters`), as is hpctrain's ``data.collate._target_``.
- ``task.args=[--lr,1e-3]`` reaches the script as typed, not as Hydra's numbers (:func:`literal_script_args`).
- The Optuna sweeper's documented ``hydra.sweeper.params={...}`` becomes the overrides it reads the same way
  (:func:`sweeper_params`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpctrain.config.schema import DATA_KEYS, MODEL_KEYS, TARGET_GROUPS
from hpctrain.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "config"  # hpctrain's primary config, conf/config.yaml (Hydra's config_name)

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
        key = text.lstrip("+").split("=", 1)[0]
        if key.startswith(f"{SWEEPER_PARAMS}.") and "=" in text:
            # One key of the search space (+hydra.sweeper.params.optim.lr=interval(…)): the same override,
            # which Hydra would refuse in two lines ("Sweeping over Hydra's configuration is not supported")
            out.append(f"{key.removeprefix(SWEEPER_PARAMS + '.')}={text.split('=', 1)[1]}")
            continue
        if key != SWEEPER_PARAMS:
            out.append(text)
            continue
        try:
            value = parser.parse_override(text.lstrip("+")).value()
        except Exception as err:
            reason = str(err).splitlines()[0]
            raise ConfigError("", None, f"cannot parse override '{text}': {reason}") from None
        if not isinstance(value, dict) or not value:
            raise ConfigError(
                SWEEPER_PARAMS,
                value,
                "not a mapping of keys to search spaces",
                valid="{optim.lr: 'interval(1e-4,1e-2)', trainer.seed: 'choice(1,2)'}",
            )
        typed = _mapping_texts(text.split("=", 1)[1])
        # An unquoted space (interval(1e-4,1e-2)) parses to a Sweep object whose str() is Python's repr:
        # the user's own text goes on, so the sweeper reads what they typed and a refusal shows it.
        out += [
            f"{key}={space if isinstance(space, str) else typed.get(key, space)}"
            for key, space in value.items()
        ]
    return out


def _mapping_texts(text: str) -> dict[str, str]:
    """``{a.b: interval(1, 2), c: 'x'}`` as typed: each key's value text (quotes kept), split at the commas
    and colons outside brackets and quotes."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return {}
    items, depth, quote, start = [], 0, "", 1
    for i, ch in enumerate(body[1:-1], start=1):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    items.append(body[start:-1])
    pairs = [item.split(":", 1) for item in items if ":" in item]
    return {key.strip().strip("'\""): value.strip() for key, value in pairs}


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
        parsed = parsed if parsed is not None else parse_overrides(overrides)
        dirs = [*config_dirs, *searchpath_dirs(parsed)]
        listed, target = option_keys(group, parsed, dirs)
        if name in listed and not (name == "collate" and "collate" not in yaml_keys(group, parsed, dirs)):
            continue
        if name == "collate" or (target is not None and name in (target_parameters(target) or ())):
            out[i] = f"+{text}"
    return out


def yaml_keys(group: str, parsed: dict[str, Any], dirs: Sequence[Path]) -> set[str]:
    path = option_file(group, choice(group, parsed), dirs)
    node = OmegaConf.load(path) if path is not None else None
    return {str(k) for k in node} if isinstance(node, DictConfig) else set()


def option_keys(group: str, parsed: dict[str, Any], dirs: Sequence[Path]) -> tuple[set[str], str | None]:
    """The keys the chosen option of ``group`` lists (with hpctrain's own), and its ``_target_`` (an
    override of it wins)."""
    own = set(DATA_KEYS) | {"collate"} if group == "data" else set(MODEL_KEYS) if group == "model" else set()
    path = option_file(group, choice(group, parsed), dirs)
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


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
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


def option_file(group: str, option: str | None, config_dirs: Sequence[Path] = ()) -> Path | None:
    """The yaml behind ``group=option``, searched in Hydra's order (hpctrain's conf/ first), or None."""
    if option is None:
        return None
    return next(
        (p for d in (CONF_DIR, *config_dirs) if (p := Path(d) / group / f"{option}.yaml").is_file()), None
    )


def choice(group: str, parsed: dict[str, Any]) -> str | None:
    if group in parsed:
        return str(parsed[group])
    defaults = OmegaConf.load(CONF_DIR / f"{CONFIG_NAME}.yaml").get("defaults", [])
    for entry in defaults:
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    return None


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
