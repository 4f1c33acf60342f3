"""Plan a run before it starts: memory per GPU, step time, cost, and layouts that fit. Torch-free.

- :mod:`hpctrain.plan.estimate`: pure functions of the typed config and the model's fact sheet
  (:class:`hpctrain.models.facts.ModelFacts`: declared by a built-in's spec, or measured of a user's model
  by :mod:`hpctrain.submit.footprint`, whose caller measures, so this package stays torch-free) →
  dataclasses with the numbers: :mod:`~hpctrain.plan.layout` (the config's numbers, where each tensor
  lives), :mod:`~hpctrain.plan.memory` (memory per rank), :mod:`~hpctrain.plan.activations` (what the
  sheet's activation source says a rank keeps), :mod:`~hpctrain.plan.time` (time per step).
- :mod:`hpctrain.plan.search`: other layouts of the same world size that fit, fastest first.
- :mod:`hpctrain.plan.text`: the plan as text.
- :mod:`hpctrain.cli.plan`: ``hpctrain plan OVERRIDES...`` prints them as a table.

Whether the estimate is right is checked outside this package, by ``python -m hpctrain.verify.plan_measure``
(:mod:`hpctrain.verify`: it imports torch and the trainer; nothing here imports it).
"""
