"""What a run directory or an export names may be built without asking: model classes only.

``config.yaml`` and ``hpctrain.json`` can come from anywhere (a shared folder, a download), and their
``_target_`` is called to build the model. A model class (an ``nn.Module`` subclass) and the config classes
of transformers models (``PretrainedConfig`` subclasses, nested under ``config``) build a model and nothing
else; any other callable (a factory function, ``builtins.open``, ``torch.load`` of a pickle shipped beside
the weights) could do anything, so it is refused in one line unless the user opts in (``--trust-code``, as
transformers' ``trust_remote_code``). Importing the module that defines the class runs that module, as
transformers' own loaders do: the modules come from the user's path, not from the file.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from hpctrain.errors import ConfigError

CONFIG_BASES = ("PretrainedConfig", "PreTrainedConfig")  # transformers' config classes (by base name)
OPT_IN = "--trust-code"


def check_trusted(target: str, args: Mapping[str, Any], source: str, key: str = "SOURCE") -> None:
    """Refuse (one line naming ``source``) a model whose ``_target_`` or nested ``_target_``s are not
    classes that build a model: an ``nn.Module`` subclass at the top, model or config classes inside."""
    _check(f"{key}: _target_", target, source, top=True)
    for name, nested in _nested_targets(args, "model"):
        _check(f"{key}: {name}._target_", nested, source, top=False)


def _check(key: str, target: Any, source: str, top: bool) -> None:
    from torch import nn

    from hpctrain.config.typed import locate

    if not isinstance(target, str):
        raise ConfigError(key, target, f"in {source}: not a dotted import path")
    obj = locate(key, target)
    owner = getattr(obj, "__self__", None) if inspect.ismethod(obj) else None
    is_module = inspect.isclass(obj) and issubclass(obj, nn.Module)
    is_config = inspect.isclass(obj) and any(base.__name__ in CONFIG_BASES for base in inspect.getmro(obj))
    # transformers' own constructors: AutoModel*.from_config (a model from a config), and
    # AutoConfig.from_pretrained (a folder's config.json: JSON only, no code without trust_remote_code).
    is_auto = (
        inspect.isclass(owner)
        and owner.__module__.startswith("transformers.")
        and (
            obj.__name__ == "from_config"
            or (obj.__name__ == "from_pretrained" and owner.__name__ == "AutoConfig")
        )
    )
    if is_module or (is_config and not top) or is_auto:
        return
    what = "a class" if inspect.isclass(obj) else f"a {type(obj).__name__}"
    raise ConfigError(
        key,
        target,
        f"in {source} is {what}, not a model class: building it would run code the file chose",
        valid=f"a run or export of an nn.Module class, or {OPT_IN} if you trust where it came from",
    )


def _nested_targets(node: Any, path: str) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    if isinstance(node, Mapping):
        if "_target_" in node and path != "model":
            found.append((path, node["_target_"]))
        for name, value in node.items():
            if name != "_target_":
                found += _nested_targets(value, f"{path}.{name}")
    elif isinstance(node, Sequence) and not isinstance(node, (str, bytes)):
        for i, value in enumerate(node):
            found += _nested_targets(value, f"{path}[{i}]")
    return found
