"""Hydra's config files, read once per process: the repository every composition of a search path shares.

Hydra builds its repository of config sources afresh for each composition and deep-copies it (the copy guards
the repository against ``hydra.searchpath`` overrides), then loads and parses every file of the defaults
tree again: ~30 YAML files and structured schemas, 40-60 % of a composition's CPU. A process that composes
many times (the precheck and the run of one command, a sweep's members, ``plan`` searching layouts, the
test suite) pays that each time.

:class:`SharedRepository` keeps what a search path's sources loaded, keyed by config path and checked
against the file's size and modification time on every use (an edited or replaced file is read again; a
file that was absent is looked for again). A composition's own copy (what Hydra's deep copy returns,
:class:`_Composition`) reads through the shared one, except after ``hydra.searchpath`` re-initializes its
sources: from then on it owns a private copy, as Hydra's would, and caches nothing.

Hydra treats a loaded :class:`ConfigResult` as read-only within a composition (its own per-composition cache
hands the same object to every use); the shared one extends that across compositions. Only the merge of a
defaults list changes what it loaded (it pops the primary config's ``hydra`` node and merges the nodes in
without copying them), so the merge alone reads deep copies (:class:`_Copies`); building the defaults tree
(~30 loads per composition, each a deep copy before: ~15 % of a warm composition's CPU) reads the shared
configs as they are.

:func:`remember_compositions` does the same one level up: merging the loaded files of a defaults list into one
config is half of what remains of a composition, and it depends only on that list (which files, under which
packages) and on the files. The merged config of a list is kept on the shared repository, checked against
every file's size and modification time, and each composition gets a deep copy (Hydra then applies the
overrides to it in place). A composition with its own sources (``hydra.searchpath``) merges afresh.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import OrderedDict
from typing import Any

from hydra._internal.config_repository import ConfigRepository, IConfigRepository
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult, ConfigSource
from omegaconf import DictConfig

# Search paths remembered at once: a process composes with hpctrain's conf/ and a few user directories.
MAX_SEARCH_PATHS = 8
# Merged defaults lists kept per search path: one per distinct set of group choices (model=, data=, ...).
MAX_COMPOSITIONS = 64
_SHARED: OrderedDict[tuple[tuple[str, str], ...], SharedRepository] = OrderedDict()


def _stamp(result: ConfigResult, config_path: str) -> tuple[int, int] | None:
    """Size and modification time of a file source's file; None for other sources (packages, structured)."""
    if not result.path.startswith("file://"):
        return None
    name = config_path if config_path.endswith(".yaml") else f"{config_path}.yaml"
    try:
        info = os.stat(os.path.join(result.path[len("file://") :], name))
    except OSError:
        return (-1, -1)
    return (info.st_size, info.st_mtime_ns)


class SharedRepository(IConfigRepository):
    """The loaded configs of one search path's sources, shared by every composition on it."""

    def __init__(self, search_path: ConfigSearchPath) -> None:
        self.delegate = ConfigRepository(config_search_path=search_path)
        # Whether load_config hands out copies: until remember_compositions makes every merge read copies.
        self.copy_on_load = True
        self._loaded: dict[str, tuple[tuple[int, int] | None, ConfigResult]] = {}
        # defaults list → (the stamps of its files when merged, the merged config)
        self._merged: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], DictConfig]] = OrderedDict()

    def _stamps(self, paths: list[str]) -> tuple[Any, ...] | None:
        """The current stamps of ``paths`` (each loaded before), or None when one was never loaded."""
        stamps = []
        for path in paths:
            hit = self._loaded.get(path)
            if hit is None:
                return None
            stamps.append(_stamp(hit[1], path))
        return tuple(stamps)

    def merged(self, key: tuple[Any, ...], paths: list[str]) -> DictConfig | None:
        """A copy of the merged config of defaults list ``key`` (its files ``paths``), if none changed."""
        hit = self._merged.get(key)
        if hit is None or hit[0] != self._stamps(paths):
            return None
        self._merged.move_to_end(key)
        return copy.deepcopy(hit[1])

    def remember_merged(self, key: tuple[Any, ...], paths: list[str], cfg: DictConfig) -> None:
        stamps = self._stamps(paths)
        if stamps is None:
            return
        self._merged[key] = (stamps, copy.deepcopy(cfg))
        while len(self._merged) > MAX_COMPOSITIONS:
            self._merged.popitem(last=False)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Composition:
        return _Composition(self)  # Hydra's per-composition copy: a view, not a copy of every source

    def load_config(self, config_path: str) -> ConfigResult | None:
        hit = self._loaded.get(config_path)
        if hit is None or hit[0] != _stamp(hit[1], config_path):
            result = self.delegate.load_config(config_path=config_path)
            if result is None:
                return None
            hit = self._loaded[config_path] = (_stamp(result, config_path), result)
        # A result of its own (Hydra reassigns its ``config``), with the shared config unless copies are
        # wanted: a merge changes the loaded nodes in place (module docstring).
        config = copy.deepcopy(hit[1].config) if self.copy_on_load else hit[1].config
        return dataclasses.replace(hit[1], config=config)

    def get_schema_source(self) -> ConfigSource:
        return self.delegate.get_schema_source()

    def initialize_sources(self, config_search_path: ConfigSearchPath) -> None:
        raise AssertionError("a shared repository's sources are fixed; a composition re-initializes its own")

    def group_exists(self, config_path: str) -> bool:
        return self.delegate.group_exists(config_path=config_path)

    def config_exists(self, config_path: str) -> bool:
        return self.delegate.config_exists(config_path=config_path)

    def get_group_options(
        self, group_name: str, results_filter: ObjectType | None = ObjectType.CONFIG
    ) -> list[str]:
        return self.delegate.get_group_options(group_name=group_name, results_filter=results_filter)

    def get_sources(self) -> list[ConfigSource]:
        return self.delegate.get_sources()


class _Composition(IConfigRepository):
    """One composition's repository: the shared one's configs, until ``hydra.searchpath`` changes its
    sources (then a private copy of the sources, loading afresh, as Hydra does)."""

    def __init__(self, shared: SharedRepository) -> None:
        self._shared = shared
        self._own: ConfigRepository | None = None

    def _source(self) -> IConfigRepository:
        return self._own if self._own is not None else self._shared

    def load_config(self, config_path: str) -> ConfigResult | None:
        return self._source().load_config(config_path=config_path)

    def get_schema_source(self) -> ConfigSource:
        return self._source().get_schema_source()

    def initialize_sources(self, config_search_path: ConfigSearchPath) -> None:
        self._own = copy.deepcopy(self._shared.delegate)
        self._own.initialize_sources(config_search_path)

    def group_exists(self, config_path: str) -> bool:
        return self._source().group_exists(config_path=config_path)

    def config_exists(self, config_path: str) -> bool:
        return self._source().config_exists(config_path=config_path)

    def get_group_options(
        self, group_name: str, results_filter: ObjectType | None = ObjectType.CONFIG
    ) -> list[str]:
        return self._source().get_group_options(group_name=group_name, results_filter=results_filter)

    def get_sources(self) -> list[ConfigSource]:
        return self._source().get_sources()


class _Copies(IConfigRepository):
    """A repository for one merge: ``repo``'s configs, each a deep copy (the merge changes them in place)."""

    def __init__(self, repo: IConfigRepository) -> None:
        self._repo = repo

    def load_config(self, config_path: str) -> ConfigResult | None:
        result = self._repo.load_config(config_path=config_path)
        return None if result is None else dataclasses.replace(result, config=copy.deepcopy(result.config))

    def get_schema_source(self) -> ConfigSource:
        return self._repo.get_schema_source()

    def initialize_sources(self, config_search_path: ConfigSearchPath) -> None:
        raise AssertionError("a merge does not change the search path")

    def group_exists(self, config_path: str) -> bool:
        return self._repo.group_exists(config_path=config_path)

    def config_exists(self, config_path: str) -> bool:
        return self._repo.config_exists(config_path=config_path)

    def get_group_options(
        self, group_name: str, results_filter: ObjectType | None = ObjectType.CONFIG
    ) -> list[str]:
        return self._repo.get_group_options(group_name=group_name, results_filter=results_filter)

    def get_sources(self) -> list[ConfigSource]:
        return self._repo.get_sources()


def _shared_behind(repo: IConfigRepository) -> SharedRepository | None:
    """The shared repository a composition's repository reads through (Hydra wraps it in its
    CachingConfigRepository), or None when it has sources of its own."""
    inner = getattr(repo, "delegate", repo)
    if isinstance(inner, _Composition) and inner._own is None:
        return inner._shared
    return None


def remember_compositions(loader: Any) -> None:
    """Let Hydra's config loader ``loader`` reuse the merged config of a defaults list it merged before
    (module docstring). Its ``_compose_config_from_defaults_list`` is wrapped on this instance only; a Hydra
    without that method composes as it always did."""
    merge = getattr(loader, "_compose_config_from_defaults_list", None)
    if merge is None:
        return

    def compose_from_defaults(defaults: list[Any], repo: IConfigRepository) -> DictConfig:
        shared = _shared_behind(repo)
        if shared is None:
            return merge(defaults=defaults, repo=_Copies(repo))
        key = tuple(
            (d.config_path, d.parent, d.package, d.is_self, d.primary, d.override_key) for d in defaults
        )
        paths = [d.config_path for d in defaults if d.config_path is not None]
        cfg = shared.merged(key, paths)
        if cfg is None:
            cfg = merge(defaults=defaults, repo=_Copies(repo))
            shared.remember_merged(key, paths, cfg)
        return cfg

    loader._compose_config_from_defaults_list = compose_from_defaults
    if isinstance(loader.repository, SharedRepository):
        loader.repository.copy_on_load = False  # every merge of this loader now reads copies


def shared_repository(search_path: ConfigSearchPath) -> SharedRepository:
    """The process's repository for ``search_path`` (the least recently used beyond
    :data:`MAX_SEARCH_PATHS` is forgotten)."""
    key = tuple((element.provider or "", element.path or "") for element in search_path.get_path())
    repository = _SHARED.pop(key, None) or SharedRepository(search_path)
    _SHARED[key] = repository
    while len(_SHARED) > MAX_SEARCH_PATHS:
        _SHARED.popitem(last=False)
    return repository
