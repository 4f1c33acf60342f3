"""Before submit, checkpoint.path's store takes a write (hpctrain.submit.store), and a run continues with its
checkpoints where they are (hpctrain.submit.existing.check_same_store): each refusal one line."""

from __future__ import annotations

import dataclasses
import socket
import time
import uuid
from pathlib import Path

import pytest

from hpctrain.config.schema import CheckpointConfig, Config
from hpctrain.errors import ConfigError
from hpctrain.rundir import RunDir
from hpctrain.rundir.objects import ObjectDir, Store, record_store
from hpctrain.submit.existing import check_same_store
from hpctrain.submit.store import check_store_answers


def with_store(path: str | None, **options: object) -> Config:
    return dataclasses.replace(
        Config(), checkpoint=CheckpointConfig(path=path, storage_options=dict(options))
    )


def test_a_store_that_takes_a_write_passes_and_keeps_nothing_of_the_probe() -> None:
    url = f"memory://probe-{uuid.uuid4().hex[:8]}/runs/a"
    check_store_answers(with_store(url))
    assert list(ObjectDir.at(url).iterdir()) == []
    check_store_answers(with_store(None))  # no store: nothing asked


def test_no_credentials_and_a_store_that_does_not_answer_are_one_line_within_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.raises(
        ConfigError, match=r"s3://bucket/x: found no credentials for the store: Unable to locate"
    ):
        check_store_answers(with_store("s3://bucket/x", endpoint_url=endpoint))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "something")
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        check_store_answers(with_store("s3://bucket/x", endpoint_url=endpoint))
    line = str(refused.value)
    assert line.startswith("checkpoint.path=s3://bucket/x: the store did not answer: EndpointConnectionError")
    assert "\n" not in line and time.monotonic() - started < 30


def test_a_run_continues_only_with_its_own_store(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    record_store(run.checkpoints, Store("s3://b/a", {}))
    check_same_store(run, with_store("s3://b/a/"))
    with pytest.raises(ConfigError) as other:
        check_same_store(run, with_store("s3://b/elsewhere"))
    assert str(other.value) == (
        f"checkpoint.path=s3://b/elsewhere: {run.path}'s checkpoints are in s3://b/a "
        "(checkpoints/store.json): this run would continue without them (valid: checkpoint.path=s3://b/a, "
        "or a new run (run=NAME))"
    )
    with pytest.raises(ConfigError, match=r"checkpoint\.path=null: .* checkpoints are in s3://b/a"):
        check_same_store(run, with_store(None))

    local = RunDir(tmp_path / "local")
    (local.checkpoints / "step_00000005").mkdir(parents=True)
    with pytest.raises(ConfigError, match="checkpoints are in its folder"):
        check_same_store(local, with_store("s3://b/new"))
    check_same_store(local, with_store(None))
