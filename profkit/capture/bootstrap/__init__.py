"""The folder ``profkit capture`` puts first on ``PYTHONPATH``; a package so it ships in the wheel."""
from __future__ import annotations

import os


def bootstrap_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))
