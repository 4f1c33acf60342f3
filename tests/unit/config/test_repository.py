"""hpctrain.config.repository: every composition of a process shares the files its search path loaded, and
gets what a composition from cold files would: no node of one composition leaks into the next, an edited
file is read again, and ``hydra.searchpath`` still adds its directories."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from hpctrain.config import repository
from hpctrain.config.compose import compose


def _cold(overrides: list[str], config_dirs: list[Path] | None = None) -> str:
    repository._SHARED.clear()
    return OmegaConf.to_yaml(compose(overrides, config_dirs or []))


def test_a_warm_composition_is_the_cold_one() -> None:
    cases = [
        ["model=gpt"],
        ["model=vit", "parallel=3d"],
        ["parallel=fsdp", "cluster=slurm_test"],
        ["model=gpt"],
    ]
    cold = [_cold(c) for c in cases]
    repository._SHARED.clear()
    warm = [OmegaConf.to_yaml(compose(c)) for c in cases]  # each after the others, on the same loaded files
    assert warm == cold
    assert len(repository._SHARED) == 1


def test_a_merged_defaults_list_is_reused_and_no_composition_changes_the_next() -> None:
    repository._SHARED.clear()
    first = compose(["model=gpt", "model.d_model=32"])
    (shared,) = repository._SHARED.values()
    assert len(shared._merged) == 1  # the merge of this defaults list, kept
    first.model.n_layers = 99  # a composition's result is its own to change
    second = compose(["model=gpt", "trainer.max_steps=3"])  # the same group choices: the kept merge
    assert len(shared._merged) == 1
    assert second.model.n_layers != 99 and second.model.d_model != 32 and second.trainer.max_steps == 3
    assert OmegaConf.to_yaml(second) == _cold(["model=gpt", "trainer.max_steps=3"])


def test_an_edited_file_is_read_again_and_searchpath_adds_its_directory(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    option = conf / "model" / "mine.yaml"
    option.write_text("_target_: builtins.dict\nwidth: 8\n")
    assert compose(["model=mine"], [conf]).model.width == 8
    option.write_text("_target_: builtins.dict\nwidth: 16\n")  # same size: the modification time tells
    assert compose(["model=mine"], [conf]).model.width == 16
    other = tmp_path / "other"
    (other / "model").mkdir(parents=True)
    (other / "model" / "theirs.yaml").write_text("_target_: builtins.dict\ndepth: 3\n")
    assert compose(["model=theirs", f"hydra.searchpath=[file://{other}]"], [conf]).model.depth == 3
    assert compose(["model=mine"], [conf]).model.width == 16  # the shared sources are conf's alone again


def test_the_loaded_files_stay_as_read_while_their_merges_change_copies() -> None:
    # Building a defaults tree reads the shared configs as they are; a merge pops the primary config's hydra
    # node and merges nodes in place, so it must read copies: after merges of several defaults lists, every
    # loaded config still equals the file read afresh.
    repository._SHARED.clear()
    for overrides in (["model=gpt"], ["model=vit", "parallel=3d"], ["parallel=fsdp", "cluster=slurm_test"]):
        compose(overrides)
    (shared,) = repository._SHARED.values()
    assert not shared.copy_on_load and len(shared._merged) == 3
    assert len(shared._loaded) > 20
    for path, (_, result) in shared._loaded.items():
        fresh = shared.delegate.load_config(config_path=path)
        assert fresh is not None
        assert OmegaConf.to_yaml(result.config) == OmegaConf.to_yaml(fresh.config), path
