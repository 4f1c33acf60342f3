"""Tied weights under pipeline parallelism (hpctrain.parallel.shared, Megatron's embedding group): found from
the whole model, kept by the stages that hold each name, saved once under the whole model's name."""

from __future__ import annotations


def test_the_tie_is_found_generically_and_saved_once():
    """The pipeline finds the tie from the whole model (one parameter under two names) and the stages that
    keep each name; the stages' copies are saved under the whole model's name."""
    import torch

    from hpctrain.checkpoint.state import ModelOptimizerState
    from hpctrain.models.builtin import GPTSpec
    from hpctrain.models.gpt import GPT
    from hpctrain.parallel.pipeline import dropped_modules, split_stage
    from hpctrain.parallel.shared import saved_names, stage_ties, tied_parameters

    model = GPT(GPTSpec(n_layers=4, d_model=16, n_heads=2, seq_len=8, vocab_size=32))
    ties = tied_parameters(model)
    assert ties == [["tok_emb.weight", "head.weight"]]
    across = stage_ties(ties, [dropped_modules(model, s, 4) for s in range(4)])
    assert [(t.names, t.holders, t.weight_stage) for t in across] == [
        (("tok_emb.weight", "head.weight"), {0: "tok_emb.weight", 3: "head.weight"}, 0)
    ]
    assert saved_names(ties, across, [3]) == {"head.weight": "tok_emb.weight"}
    last = split_stage(model, 3, 4)
    assert torch.equal(last.head.weight, model.tok_emb.weight) and last.tok_emb is None
    optimizer = torch.optim.AdamW(last.parameters())
    saved = ModelOptimizerState(last, optimizer, saved_names(ties, across, [3])).state_dict()
    assert "tok_emb.weight" in saved["model"] and "head.weight" not in saved["model"]
    whole = ModelOptimizerState(model, torch.optim.AdamW(model.parameters()), saved_names(ties, [], [0]))
    assert "head.weight" not in whole.state_dict()["model"]  # torch lists a tied parameter under both names
