"""Each room of config/rules/ on its own: a composed default passes, one bad value is a ConfigError naming
its key (validate.py runs them in order; tests/unit/config/test_validate.py tries them through the CLI)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.rules.checkpoint import check_checkpoint
from hpctrain.config.rules.cluster import check_cluster
from hpctrain.config.rules.parallel import check_parallel
from hpctrain.config.rules.run import check_batch, check_optim, check_trainer
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError

CASES: list[tuple[Callable[[Config], None], list[str], str]] = [
    (check_cluster, ["cluster.nproc=0"], "cluster.nproc"),
    (check_parallel, ["parallel=tp", "parallel.tp=3", "cluster.nproc=2"], "parallel"),
    (check_checkpoint, ["checkpoint.local_every=0"], "checkpoint.local_every"),
    (check_optim, ["optim.lr=-1"], "optim.lr"),
    # issue 41: a warmup longer than the run never reaches optim.lr
    (check_optim, ["optim.warmup_steps=500", "trainer.max_steps=5"], "optim.warmup_steps=500: longer than"),
    (check_trainer, ["trainer.max_steps=0"], "trainer.max_steps"),
    (check_batch, ["trainer.global_batch_size=32", "trainer.micro_batch_size=5"], "trainer."),
]


@pytest.mark.parametrize(("check", "overrides", "key"), CASES, ids=[f"{c[0].__name__}-{c[2]}" for c in CASES])
def test_each_rule_passes_the_default_and_names_the_key_it_refuses(
    check: Callable[[Config], None], overrides: list[str], key: str
) -> None:
    check(to_typed(compose([])))
    with pytest.raises(ConfigError) as refused:
        check(to_typed(compose(overrides)))
    assert str(refused.value).startswith(key), str(refused.value)
    assert "\n" not in str(refused.value)
