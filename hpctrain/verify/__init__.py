"""Tools that check hpctrain against itself on this machine's devices, outside the training path.

- :mod:`hpctrain.verify.parity`: ``python -m hpctrain.verify.parity``: does every parallel layout train like
  one process?
- :mod:`hpctrain.verify.plan_measure`: ``python -m hpctrain.verify.plan_measure``: is ``hpctrain plan``'s
  memory estimate right, against the real tensors?
- :mod:`hpctrain.verify.local_group`: runs one function on N local processes joined into one group (also
  used by ``bench/parallel.py``).

Nothing of the training path (nor ``plan``) imports this package: it sits at the top of the layers, beside
``cli``.
"""
