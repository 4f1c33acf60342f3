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
