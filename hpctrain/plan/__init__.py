"""Plan a run before it starts: memory per GPU, step time, cost, and layouts that fit. Torch-free.

- :mod:`hpctrain.plan.estimate`: pure functions of the typed config → dataclasses with the numbers.
- :mod:`hpctrain.plan.search`: other layouts of the same world size that fit, fastest first.
- :mod:`hpctrain.cli.plan`: ``hpctrain plan OVERRIDES...`` prints them as a table.
- :mod:`hpctrain.plan.measure`: ``python -m hpctrain.plan.measure`` checks the estimate against the real
  tensors of parallelized models on this machine (imports torch; never on the submit path).
"""
