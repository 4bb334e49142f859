"""The folder ``profkit capture`` puts first on ``PYTHONPATH`` (its ``sitecustomize`` instruments
every Python process of the command). A package only so that it ships in the wheel."""
from __future__ import annotations

import os


def bootstrap_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))
