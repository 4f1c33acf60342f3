"""Checkpoints in an object store (``checkpoint.path=s3://bucket/prefix``): where they are, read as a folder.
No torch: the submit side and ``hpctrain status`` read this too.

The shared tier's checkpoints can live in any store fsspec reaches (``s3://`` through s3fs, ``gs://``
through gcsfs, …) instead of ``<run>/checkpoints``; the run directory, its logs and metrics stay on a file
system. The run directory records where (``checkpoints/store.json``: the URL and the non-secret options,
never credentials), so every reader of the run (resume, ``status``, ``export``, the restart policy's
progress) finds them, and a resume that names another store is refused instead of starting over unseen.

:class:`ObjectDir` is the read-only part of ``pathlib.Path`` that :mod:`hpctrain.rundir.checkpoints` uses
to find the newest committed checkpoint and verify one (``name``, ``/``, ``iterdir``, ``is_dir``,
``is_file``, ``stat().st_size``, ``read_text``, ``open``), over an fsspec file system. Writing is the
object tier's (``hpctrain.checkpoint.objects``): a store has no rename, so a checkpoint is committed by
writing its ``manifest.json`` last, and a prefix without one is never a committed checkpoint.

Credentials come from the environment as the store's own client reads them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, …; a Slurm job inherits the submitter's); an endpoint (a site's
own S3-compatible server) is ``checkpoint.storage_options.endpoint_url`` or ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpctrain.rundir.files import atomic_json, read_json

STORE_RECORD = "store.json"  # in <run>/checkpoints: where the shared tier's checkpoints are
STORE_TIMEOUT_S = 300.0  # a call of the store that takes longer failed (checkpoint.store_timeout_s)
# Options that carry a secret: refused in checkpoint.storage_options (they would be recorded in config.yaml,
# .hydra/ and store.json); the store's client reads them from the environment instead.
SECRET_OPTIONS = ("key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key")


def quiet_clients() -> None:
    """A store's client says at INFO where it found credentials, once per process: not the user's news."""
    import logging

    for chatty in ("botocore", "aiobotocore", "s3fs", "fsspec"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def is_url(text: str | os.PathLike[str] | None) -> bool:
    return isinstance(text, str) and "://" in text


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0]


def filesystem(url: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path inside it. Listings are never cached: other ranks and
    other processes write the store, and a stale listing would hide a committed checkpoint."""
    import fsspec

    quiet_clients()
    opts = dict(options or {})
    if scheme_of(url) == "s3" and "endpoint_url" not in opts and os.environ.get("AWS_ENDPOINT_URL"):
        opts["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    fs, path = fsspec.core.url_to_fs(url, use_listings_cache=False, skip_instance_cache=True, **opts)
    return fs, path.rstrip("/")


class StoreTimeout(TimeoutError):
    """A store's call that did not return within ``checkpoint.store_timeout_s``."""


def within(timeout_s: float, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` (``what``: its name for the error), or :class:`StoreTimeout` after
    ``timeout_s``. Why a thread: a store's
    client times out connecting and reading (botocore's ``connect_timeout``, ``read_timeout``) but not
    sending; a store that stops reading mid-upload blocked a save forever (seen here: a stopped S3 server,
    240 s and counting), and the hang watchdog never times a save (a slow save is not a hang). The call's
    thread is left to the client (a daemon; the failed rank exits)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call(*args, **kwargs)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name="hpctrain-store-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise StoreTimeout(
            f"the store did not finish {what} within {timeout_s:g} s (checkpoint.store_timeout_s)"
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


class Patient:
    """An fsspec file system (and the files it opens) whose every call returns within ``timeout_s``."""

    def __init__(self, fs: Any, timeout_s: float) -> None:
        self._fs, self._timeout_s = fs, timeout_s

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = within(self._timeout_s, name, attr, *args, **kwargs)
            return Patient(result, self._timeout_s) if name == "open" else result

        return call


@dataclass(frozen=True)
class _Stat:
    st_size: int


class ObjectDir:
    """A key prefix (or one object) of an object store, read like a ``Path``. ``str()`` is its URL."""

    def __init__(self, fs: Any, key: str, scheme: str) -> None:
        self.fs, self.key, self.scheme = fs, key.rstrip("/"), scheme

    @classmethod
    def at(
        cls, url: str, options: Mapping[str, Any] | None = None, timeout_s: float = STORE_TIMEOUT_S
    ) -> ObjectDir:
        fs, key = filesystem(url, options)
        return cls(Patient(fs, timeout_s), key, scheme_of(url))

    # -- names
    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectDir:
        return ObjectDir(self.fs, self.key.rsplit("/", 1)[0], self.scheme)

    def __truediv__(self, part: str) -> ObjectDir:
        return ObjectDir(self.fs, f"{self.key}/{part}", self.scheme)

    def with_name(self, name: str) -> ObjectDir:
        return self.parent / name

    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"ObjectDir({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectDir) and (other.key, other.scheme) == (self.key, self.scheme)

    def __hash__(self) -> int:
        return hash((self.scheme, self.key))

    # -- reading
    def _info(self) -> dict[str, Any] | None:
        try:
            return dict(self.fs.info(self.key))
        except FileNotFoundError:
            return None

    def exists(self) -> bool:
        return self._info() is not None

    def is_dir(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "directory"

    def is_file(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "file"

    def is_symlink(self) -> bool:
        return False  # a store has none: nothing can point out of the run's prefix

    def stat(self) -> _Stat:
        info = self._info()
        if info is None or info.get("type") != "file":
            raise FileNotFoundError(str(self))
        return _Stat(int(info.get("size") or 0))

    def iterdir(self) -> Iterator[ObjectDir]:
        try:
            names = self.fs.ls(self.key, detail=False)
        except FileNotFoundError:
            return iter(())
        return iter(ObjectDir(self.fs, str(n), self.scheme) for n in names if str(n).rstrip("/") != self.key)

    def glob(self, pattern: str) -> list[ObjectDir]:
        """The objects under this prefix matching ``pattern`` (``*`` within one level), in one listing."""
        return [ObjectDir(self.fs, str(k), self.scheme) for k in self.fs.glob(f"{self.key}/{pattern}")]

    def read_bytes(self) -> bytes:
        return bytes(self.fs.cat_file(self.key))

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """One object, whole or not at all (a single PUT): the object tier's writes."""
        self.fs.pipe_file(self.key, data)

    def open(self, mode: str = "rb") -> IO[Any]:
        if mode not in ("r", "rb"):
            raise ValueError("an ObjectDir is read here; the object tier writes")
        data = self.read_bytes()
        return io.StringIO(data.decode()) if mode == "r" else io.BytesIO(data)


# ----------------------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Store:
    """Where a run's shared checkpoints are: ``url`` and the options its file system is opened with."""

    url: str
    options: dict[str, Any]
    timeout_s: float = STORE_TIMEOUT_S

    def root(self) -> ObjectDir:
        return ObjectDir.at(self.url, self.options, self.timeout_s)


def recorded_store(checkpoints: Path) -> Store | None:
    """The store ``<run>/checkpoints/store.json`` names; None: the run's checkpoints are in that folder."""
    record = read_json(checkpoints / STORE_RECORD)
    if not isinstance(record, dict) or not isinstance(record.get("url"), str):
        return None
    options = record.get("options")
    timeout_s = record.get("timeout_s")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0:
        timeout_s = STORE_TIMEOUT_S
    return Store(record["url"], dict(options) if isinstance(options, dict) else {}, float(timeout_s))


def record_store(checkpoints: Path, store: Store) -> None:
    checkpoints.mkdir(parents=True, exist_ok=True)
    atomic_json(
        checkpoints / STORE_RECORD, {"url": store.url, "options": store.options, "timeout_s": store.timeout_s}
    )


def shared_root(checkpoints: Path) -> Path | ObjectDir:
    """Where the committed checkpoints of the run whose checkpoints folder is ``checkpoints`` are."""
    store = recorded_store(checkpoints)
    return checkpoints if store is None else store.root()
