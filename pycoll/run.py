"""``python -m pycoll.run -n N script.py [args]``: the same launcher as ``pycoll run``."""

from __future__ import annotations

import sys

from pycoll.cli.run import main

if __name__ == "__main__":
    sys.exit(main())
