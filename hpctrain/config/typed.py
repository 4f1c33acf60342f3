"""A composed config (plain OmegaConf nodes) → the typed :class:`Config` every layer reads. Torch-free.

The ``model``, ``data`` and ``loss`` groups are ``_target_`` + arguments of the user's choosing, so Hydra
cannot type them: here each is split into hpctrain's own keys (typed, validated) and the arguments handed to
the target (``ModelConfig`` / ``DataConfig`` / ``LossConfig``). The other groups are dataclasses already.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError

from hpctrain.config.redact import declare_secret, env_references
from hpctrain.config.schema import (
    DATA_KEYS,
    MODEL_KEYS,
    Config,
    DataConfig,
    LoraConfig,
    LossConfig,
    ModelConfig,
)
from hpctrain.errors import ConfigError

T = TypeVar("T")
TARGET = "_target_"
HF_CONFIG = "config.json"  # a transformers save_pretrained folder's config
WHAT_TARGET_IS = {
    "model": "an importable callable returning an nn.Module, e.g. mypkg.nets.build",
    "data": "an importable callable taking split='train'|'val' and returning a map-style dataset",
    "loss": "an importable callable (outputs, batch) -> scalar tensor",
}


def to_config(run_keys: dict[str, Any] | DictConfig) -> Config:
    """Typed ``Config`` from the run's keys (``hydra`` excluded), or a ConfigError naming the bad key."""
    plain = run_keys if isinstance(run_keys, dict) else {k: run_keys[k] for k in run_keys}
    cluster = plain.get("cluster")
    if isinstance(cluster, DictConfig):  # a secret by its source: a value taken from the environment
        declare_secret(env_references(cluster.get("env")))
    groups = {"model": _model(plain.get("model")), "data": _data(plain.get("data")), "loss": _loss(plain)}
    rest = {k: v for k, v in plain.items() if k not in groups}
    rest.update(dict.fromkeys(groups))  # filled in below, once typed
    typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), rest))
    assert isinstance(typed, Config), type(typed)
    declare_secret(typed.cluster.secret_env)
    typed.cluster.resolve()
    for name, value in groups.items():
        setattr(typed, name, value)
    return typed


def _container(node: Any, group: str) -> dict[str, Any]:
    if node is None:
        return {}
    value = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(value, dict):
        raise ConfigError(group, value, "must be a mapping with a _target_", valid=WHAT_TARGET_IS[group])
    return value


def _target(value: Any, group: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{group}._target_", value, "missing or empty", valid=WHAT_TARGET_IS[group])
    parts = value.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            f"{group}._target_", value, "not a dotted import path (module.name)", valid=WHAT_TARGET_IS[group]
        )
    return value


def _model(node: Any) -> ModelConfig:
    raw = _container(node, "model")
    own = {k: raw.pop(k) for k in list(raw) if k in MODEL_KEYS}
    target = _target(raw.pop(TARGET, None), "model")
    if own.get("init_from") is not None and not isinstance(own["init_from"], str):
        raise ConfigError("model.init_from", own["init_from"], "not a path", valid="a file or directory")
    if not isinstance(own.get("init_strict", True), bool):
        raise ConfigError("model.init_strict", own["init_strict"], "expected true or false")
    if target.startswith("transformers.") and "config" not in raw:
        folder = own.get("init_from")
        if folder is not None and (Path(folder) / HF_CONFIG).is_file():
            # A save_pretrained folder alone: the model is built from its config.json (its weights follow).
            raw["config"] = {
                "_target_": "transformers.AutoConfig.from_pretrained",
                "pretrained_model_name_or_path": str(folder),
                "local_files_only": True,
            }
        elif target.endswith(".from_config"):
            raise ConfigError(
                "model.init_from",
                folder,
                f"{target} builds a model from a config, and none is given",
                valid=f"a save_pretrained folder (holding {HF_CONFIG}), or model.config={{_target_: "
                "transformers.GPT2Config, ...}",
            )
    adapters = own.get("adapters", "none")
    if not isinstance(adapters, str):
        raise ConfigError("model.adapters", adapters, "expected a string", valid="none, lora")
    lora = own.pop("lora", None) or {}
    if not isinstance(lora, dict):
        raise ConfigError("model.lora", lora, "must be a mapping", valid="rank, alpha, dropout, targets")
    for key in lora:
        if key not in MODEL_KEYS["lora"]:
            raise ConfigError(
                f"model.lora.{key}",
                lora[key],
                "unknown key of model.lora",
                valid="rank, alpha, dropout, targets",
            )
    targets = lora.get("targets", [])
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ConfigError("model.lora.targets", targets, "expected a list of module-name patterns")
    typed = typed_from(LoraConfig, {k: v for k, v in lora.items() if k != "targets"}, "model.lora")
    typed.targets = list(targets)
    return ModelConfig(target=target, args=raw, lora=typed, **own)


def _loss(plain: dict[str, Any]) -> LossConfig:
    raw = _container(plain.get("loss"), "loss")
    target = _target(raw.pop(TARGET, None), "loss")
    return LossConfig(target=target, args=raw)


def _data(node: Any) -> DataConfig:
    raw = _container(node, "data")
    own = {k: raw.pop(k) for k in list(raw) if k in DATA_KEYS and k != TARGET}
    target = raw.pop(TARGET, None)
    if target is not None:
        target = _target(target, "data")
    elif raw:  # arguments without a callable to take them
        key = next(iter(raw))
        raise ConfigError(f"data.{key}", raw[key], "unknown key of data", valid=", ".join(DATA_KEYS))
    elif own.get("name") is None:
        raise ConfigError(
            "data", None, "no dataset: give data=<option> or data._target_", valid=WHAT_TARGET_IS["data"]
        )
    out = typed_from(DataConfig, own, "data")
    out.target, out.args = target, raw
    return out


def typed_from(schema: type[T], values: dict[str, Any], group: str) -> T:
    """``schema`` filled with ``values``, each checked against its field's type (a ConfigError naming
    ``group.key`` otherwise); the caller has checked that every key is a field."""
    fields = {f.name: f.type for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
    nested = _nested_values(schema, values, group)
    if nested:  # a mapping for a field that is a dataclass itself (model.moe): typed on its own first
        values = {**values, **nested}
    plain = _plain_values(fields, values)
    if plain is not None:  # the planner's search builds thousands of specs: skip OmegaConf when it can
        return schema(**plain)
    node = OmegaConf.structured(schema)
    for key, value in values.items():
        try:
            node[key] = value
        except ValidationError:
            raise ConfigError(f"{group}.{key}", value, f"expected {fields[key]}") from None
    out = OmegaConf.to_object(node)
    assert isinstance(out, schema)
    return out


def _nested_values(schema: type, values: dict[str, Any], group: str) -> dict[str, Any]:
    """The values given as mappings for fields whose type is a dataclass, each typed as that dataclass."""
    import typing

    hints = typing.get_type_hints(schema)
    out = {}
    for key, value in values.items():
        kind = hints.get(key)
        if isinstance(value, dict) and dataclasses.is_dataclass(kind) and isinstance(kind, type):
            known = {f.name for f in dataclasses.fields(kind)}
            for name in value:
                if name not in known:
                    raise ConfigError(
                        f"{group}.{key}.{name}",
                        value[name],
                        f"unknown key of {group}.{key}",
                        valid=", ".join(sorted(known)),
                    )
            out[key] = typed_from(kind, value, f"{group}.{key}")
    return out


_PLAIN = {"int": (int,), "float": (float, int), "bool": (bool,), "str": (str,)}


def _plain_values(fields: dict[str, Any], values: dict[str, Any]) -> dict[str, Any] | None:
    """``values`` as the fields' types when each is already one of them (an int for a float field becomes
    a float, as OmegaConf would make it), else None: OmegaConf checks and converts the rest."""
    out = {}
    for key, value in values.items():
        annotation = str(fields[key])
        optional = annotation.endswith(" | None")
        kinds = _PLAIN.get(annotation.removesuffix(" | None"))
        if kinds is None or (value is None and not optional):
            return None
        if value is not None and (
            not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
        ):
            return None
        out[key] = float(value) if kinds[0] is float and value is not None else value
    return out


def _frames(err: BaseException) -> list[Any]:
    import traceback

    return list(traceback.extract_tb(err.__traceback__))


def locate(key: str, target: str) -> Any:
    """The object ``target`` (``package.module.name``) names, or a ConfigError for ``key`` saying why it
    cannot be imported: a missing optional package with its pip line, an exception the user's module raised
    while importing as a UserCodeError (their frames, then one line)."""
    import importlib

    from hpctrain.errors import EXTRAS, MissingPackage, UserCodeError, is_user_file

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and module_name.startswith(err.name):
                if err.name in EXTRAS:  # an optional package hpctrain knows is missing: its pip line
                    raise MissingPackage(key, target, err.name) from None
                continue  # this prefix is not a module: try a shorter one (the rest are attributes)
            if err.name is not None and err.name.split(".")[0] in EXTRAS:
                raise MissingPackage(key, target, err.name) from None
            raise UserCodeError(key, target, err) from None
        except Exception as err:  # the module itself raised while importing (SyntaxError, ImportError, ...)
            if isinstance(err, SyntaxError) or any(is_user_file(frame.filename) for frame in _frames(err)):
                raise UserCodeError(key, target, err) from None
            raise ConfigError(key, target, f"cannot be imported: {type(err).__name__}: {err}") from None
        for i, attr in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, attr):
                raise ConfigError(
                    key, target, f"cannot be imported: {'.'.join(parts[:i])} has no attribute {attr!r}"
                ) from None
            obj = getattr(obj, attr)
        return obj
    raise ConfigError(
        key, target, f"cannot be imported: no module named {parts[0]!r} (is its folder on the path?)"
    )
