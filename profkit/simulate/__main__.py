"""``python -m profkit.simulate ...`` (same as ``profkit simulate ...``)."""
from __future__ import annotations

import sys

from profkit.simulate.cli import main

if __name__ == "__main__":
    sys.exit(main())
