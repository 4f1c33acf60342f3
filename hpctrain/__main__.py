"""``python -m hpctrain``: see :mod:`hpctrain.cli`."""

import sys

from hpctrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
