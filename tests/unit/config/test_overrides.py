"""What the command line means before Hydra reads it (hpctrain.config.overrides)."""

from __future__ import annotations

from hpctrain.config.overrides import literal_script_args, sweeper_params, target_parameters


def test_script_args_reach_the_script_as_typed() -> None:
    got = literal_script_args(["task.args=[--lr,1e-3,--tag,1.10]", "optim.lr=1e-3"])
    assert got == ["task.args=['--lr','1e-3','--tag','1.10']", "optim.lr=1e-3"]  # the rest untouched
    assert literal_script_args(["task.args=not-a-list"]) == ["task.args=not-a-list"]


def test_the_sweepers_params_mapping_becomes_overrides() -> None:
    got = sweeper_params(['hydra.sweeper.params={optim.lr: "interval(1e-4,1e-2)"}', "model=gpt"])
    assert got == ["optim.lr=interval(1e-4,1e-2)", "model=gpt"]


def test_an_unquoted_search_space_goes_on_as_typed() -> None:
    """Issue 41: an unquoted space parsed to IntervalSweep(tags=set(), …), whose repr reached the sweeper and
    the refusal; one key typed as +hydra.sweeper.params.KEY was Hydra's two-line error."""
    got = sweeper_params(["hydra.sweeper.params={optim.lr:interval(1e-4,1e-2), trainer.seed: choice(1,2)}"])
    assert got == ["optim.lr=interval(1e-4,1e-2)", "trainer.seed=choice(1,2)"]
    got = sweeper_params(["+hydra.sweeper.params.optim.lr=interval(1e-4,1e-2)", "model=gpt"])
    assert got == ["optim.lr=interval(1e-4,1e-2)", "model=gpt"]


def test_a_targets_parameters_are_its_signatures() -> None:
    assert target_parameters("hpctrain.jobs.logs.tail") == ["path", "n"]
    assert target_parameters("no.such.module.Thing") is None
