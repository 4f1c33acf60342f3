"""Issue 29, item 4: a ``cluster.env`` value is secret by where it comes from (``${oc.env:NAME}``) or
because ``cluster.secret_env`` lists it, whatever its name (``DB_PASSWD`` matches none of the usual
patterns): never in config.yaml, and the file says which names are secret."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import run_config_text
from hpctrain.config.redact import secret_env


def test_a_value_from_the_environment_and_a_listed_one_are_never_written(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPCT_TEST_DB_PASSWD", "hunter2-by-source")
    cfg = compose(
        [
            "++cluster.env.DB_PASSWD=${oc.env:HPCT_TEST_DB_PASSWD}",
            "++cluster.env.OTHER_CRED=literal-listed",
            "++cluster.env.PLAIN=visible",
            "cluster.secret_env=[OTHER_CRED]",
        ]
    )
    typed = to_typed(cfg)
    assert typed.cluster.env["DB_PASSWD"] == "hunter2-by-source"  # the workers get the real value
    text = run_config_text(cfg)
    assert "hunter2-by-source" not in text and "literal-listed" not in text
    written = OmegaConf.create(text).cluster
    assert (
        written.env.DB_PASSWD == "***" and written.env.OTHER_CRED == "***" and written.env.PLAIN == "visible"
    )
    assert sorted(written.secret_env) == ["DB_PASSWD", "OTHER_CRED"]
    # What the submitter exports for the job (sbatch propagates it), and redacts in Hydra's records.
    assert secret_env(typed.cluster.env) == {"DB_PASSWD": "hunter2-by-source", "OTHER_CRED": "literal-listed"}
