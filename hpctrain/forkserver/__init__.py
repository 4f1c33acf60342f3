"""The fork server: one process that has imported torch and the worker side, forking a rank per request.

``python -m hpctrain.forkserver --socket PATH`` serves launches that name it in ``HPCTRAIN_FORKSERVER``; the
local launcher also starts one of its own per launch (:mod:`hpctrain.launch.forked`, the client side, which
imports no torch). :mod:`.serve` is the process (imports, the socket, children's exits), :mod:`.child` turns a
fork into what ``python -m hpctrain.worker RUN_DIR`` would have been.
"""
