"""Measured facts once per process (hpctrain.submit.measure): none for a built-in (which declares its shapes,
and torch stays unimported: a fresh interpreter), the same facts again for the same user model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hpctrain.config.compose import compose, to_typed, user_config_dirs
from hpctrain.submit.measure import measured_for
from tests.support import REPO


def test_a_builtin_is_not_measured_and_a_users_model_once(in_project: Path) -> None:
    code = (
        "import sys; from hpctrain.config.compose import compose, to_typed; "
        "from hpctrain.submit.measure import measured_for; "
        "assert measured_for(to_typed(compose(['model=gpt']))) is None; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    cfg = to_typed(compose(["model=cnn", "data=digits8"], user_config_dirs("conf")))
    facts = measured_for(cfg)
    assert facts is not None and facts.target == cfg.model.target and facts.n_params > 0
    assert measured_for(cfg) is facts  # once per process
