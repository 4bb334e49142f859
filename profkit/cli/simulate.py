"""``profkit simulate``: write a simulated DEP-N capture with known causes (see profkit.simulate).

The real parser lives in ``profkit.simulate.cli``; ``profkit.cli.main`` hands it argv as is.
This stub only lists the command in ``profkit --help``.
"""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("simulate", help="write simulated DEP-N traces with injected, known causes (-h for options)")
