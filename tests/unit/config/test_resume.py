"""What a resume may change (hpctrain.config.resume): honoured keys, refused keys, the data's keys."""

from __future__ import annotations

from omegaconf import OmegaConf

from hpctrain.config.resume import changes_between, first_refused


def test_an_lr_change_is_honoured_and_a_seed_change_refused() -> None:
    saved = OmegaConf.create(
        {"optim": {"lr": 1e-3}, "trainer": {"seed": 1}, "data": {"name": "a", "num_workers": 0}}
    )
    lr = OmegaConf.merge(saved, {"optim": {"lr": 1e-2}, "data": {"num_workers": 2}})
    assert changes_between(saved, lr) == {"optim.lr": (1e-3, 1e-2)}  # num_workers only decides batching
    assert first_refused(changes_between(saved, lr)) is None
    seed = OmegaConf.merge(lr, {"trainer": {"seed": 7}, "data": {"name": "b"}})
    assert first_refused(changes_between(saved, seed)) == ("trainer.seed", 1, 7)
