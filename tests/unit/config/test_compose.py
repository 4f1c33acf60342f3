"""Composition (hpctrain.config.compose): ``--cfg job`` prints the resolved config and writes nothing; the
config tree ships in the package; data follows the model when the user chose none."""

from __future__ import annotations

from pathlib import Path

from tests.support import REPO


def test_cfg_job_prints_the_resolved_config(cli, tmp_path: Path):  # type: ignore[no-untyped-def]
    result = cli("--cfg", "job", "model=vit", "data=digits", "trainer.max_steps=7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "_target_: hpctrain.models.vit.ViT" in result.stdout and "max_steps: 7" in result.stdout
    assert not (tmp_path / "outputs").exists()


def test_config_tree_is_shipped_in_the_package():
    # Non-editable installs read conf/ from inside the package; the top-level conf/ is the same tree.
    import hpctrain

    shipped = Path(hpctrain.__file__).parent / "conf"
    top_level = REPO / "conf"
    assert (shipped / "config.yaml").is_file()
    assert top_level.resolve() == shipped.resolve()


def test_data_follows_the_model_when_the_user_chose_none(cli, tmp_path: Path):  # type: ignore[no-untyped-def]
    """model=vit with the default data (text: tokens) takes images: a fitting dataset is picked and said."""
    result = cli("model=vit", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "hpctrain: data=digits (model ViT takes images; choose another with data=...)" in result.stdout
    assert "name: digits" in result.stdout
    big = cli("model=vit_b16", "dry_run=true", f"hydra.run.dir={tmp_path}/r", cwd=tmp_path)
    assert "hpctrain: data=synthetic (model ViT takes images" in big.stdout, big.stderr  # 224² RGB: shaped
    chosen = cli("model=vit", "data=text", f"hydra.run.dir={tmp_path}/r", cwd=tmp_path)
    assert chosen.returncode == 2 and "data=text: gives tokens but model ViT takes images" in chosen.stderr


def test_hydras_own_multirun_composes_through_the_shared_repository():
    """A multirun composes each member twice more inside Hydra (the sweeper's check of its batch, the
    launcher's load_sweep_config): within shared_compositions, the Hydra that hydra.main creates reads the
    process's shared repository and reuses merged defaults lists, and outside it Hydra is itself again. A
    member composed that way is the member composed without it, key for key."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from hpctrain.config.compose import shared_compositions
    from hpctrain.config.overrides import CONF_DIR, CONFIG_NAME
    from hpctrain.config.repository import SharedRepository
    from hpctrain.config.schema import register_configs

    register_configs()
    original = Hydra.__dict__["create_main_hydra2"]
    search_path = create_config_search_path(str(CONF_DIR))

    def members(hydra: Hydra) -> list[str]:
        master = hydra.compose_config(
            CONFIG_NAME, ["model=vit"], run_mode=RunMode.MULTIRUN, with_log_configuration=False
        )
        loader = hydra.config_loader
        return [
            OmegaConf.to_yaml(loader.load_sweep_config(master, [f"trainer.seed={seed}", "optim.lr=0.1"]))
            for seed in (1, 2, 1)  # the third again: from what the first merged
        ]

    backup = get_gh_backup()
    try:
        GlobalHydra.instance().clear()
        with shared_compositions():
            hydra = Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
            assert isinstance(hydra.config_loader.repository, SharedRepository)  # type: ignore[attr-defined]
            shared = members(hydra)
        assert Hydra.__dict__["create_main_hydra2"] is original
        GlobalHydra.instance().clear()
        plain = Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
        assert not isinstance(plain.config_loader.repository, SharedRepository)  # type: ignore[attr-defined]
        assert shared == members(plain)
    finally:
        restore_gh_from_backup(backup)
    assert "seed: 2" in shared[1] and shared[0] == shared[2]
