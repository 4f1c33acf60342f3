"""``python -m hpctrain.forkserver --socket PATH``: see :mod:`hpctrain.forkserver.serve`."""

import sys

from hpctrain.forkserver.serve import main

if __name__ == "__main__":
    main(sys.argv[1:])
