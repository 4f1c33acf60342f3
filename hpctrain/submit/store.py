"""Before submit: the object store ``checkpoint.path`` names takes a write from here. Torch-free.

A missing bucket, credentials the store refuses, or a server that does not answer would otherwise be found at
the first checkpoint, after a queue wait and a step interval. One object is written and removed
(``<prefix>/.hpctrain-probe-<id>``): reading alone would pass a store that refuses writes. The nodes reach
the store with the submitter's environment (Slurm exports it), so this is the same question they ask.
"""

from __future__ import annotations

import uuid
from typing import Any

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.rundir.objects import ObjectDir, scheme_of

# The probe's own patience (S3): a server that does not answer is said within seconds, not after botocore's
# default 60 s connect timeout and retries.
S3_PROBE_CONFIG = {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 1}}


def probe_options(url: str, options: dict[str, Any]) -> dict[str, Any]:
    opts = dict(options)
    if scheme_of(url) in ("s3", "s3a"):
        opts.setdefault("config_kwargs", S3_PROBE_CONFIG)
    return opts


def check_store_answers(cfg: Config) -> None:
    """``checkpoint.path``'s store takes a small write and its removal, or one line says why not."""
    c = cfg.checkpoint
    if c.path is None:
        return
    valid = "a bucket that exists, credentials that may write it (the store's environment variables)"
    try:
        root = ObjectDir.at(c.path, probe_options(c.path, dict(c.storage_options)))
        probe = root / f".hpctrain-probe-{uuid.uuid4().hex[:12]}"
        probe.write_bytes(b"")
        root.fs.rm_file(probe.key)
    except PermissionError as err:
        why = f"the store refused a write: {_line(err)}"
        raise ConfigError("checkpoint.path", c.path, why, valid=valid) from None
    except FileNotFoundError as err:
        raise ConfigError("checkpoint.path", c.path, f"no such bucket: {_line(err)}", valid=valid) from None
    except Exception as err:  # the client's own errors (no credentials, connection refused, timeouts)
        name = type(err).__name__
        if "Credentials" in name:  # botocore's NoCredentialsError, PartialCredentialsError
            why = f"found no credentials for the store: {_line(err)}"
        else:
            why = f"the store did not answer: {name}: {_line(err)}"
            valid += "; checkpoint.storage_options.endpoint_url for a site's own server"
        raise ConfigError("checkpoint.path", c.path, why, valid=valid) from None


def _line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
