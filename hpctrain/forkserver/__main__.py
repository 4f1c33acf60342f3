"""``python -m hpctrain.forkserver --socket PATH``: see :mod:`hpctrain.forkserver.serve`."""

import sys

from hpctrain.version import EXIT_UNSUPPORTED, environment_problem

if __name__ == "__main__":
    # Before the server imports torch and the worker side: an unsupported torch or Python (a Slurm node whose
    # environment differs from the submitting one's) is one line, not a traceback from deep in an import.
    problem = environment_problem()
    if problem:
        print(problem, file=sys.stderr, flush=True)
        sys.exit(EXIT_UNSUPPORTED)
    from hpctrain.forkserver.serve import main

    main(sys.argv[1:])
