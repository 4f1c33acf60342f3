"""Plan a run before it starts: memory per GPU, step time, cost, and layouts that fit. Torch-free.

- :mod:`hpctrain.plan.estimate`: pure functions of the typed config → dataclasses with the numbers.
- :mod:`hpctrain.plan.search`: other layouts of the same world size that fit, fastest first.
- :mod:`hpctrain.plan.user`: the same for a model that declares no shapes (a user's), from the facts
  :mod:`hpctrain.submit.footprint` measured (meta-device parameters, CPU-measured activations); the
  caller (:mod:`hpctrain.submit.measure`) measures, so this package stays torch-free.
- :mod:`hpctrain.cli.plan`: ``hpctrain plan OVERRIDES...`` prints them as a table.

Whether the estimate is right is checked outside this package, by ``python -m hpctrain.verify.plan_measure``
(:mod:`hpctrain.verify`: it imports torch and the trainer; nothing here imports it).
"""
