"""``profkit demo``: analyze a small real capture that ships with profkit.

Needs no GPU, no network and no server. The default capture is package data
(``profkit/data/samples``), so an installed wheel runs it from anywhere; in a checkout every
folder of ``sample_traces/`` can be named. ``--live`` runs the bundled engine briefly on this
machine's CPU instead (needs torch).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from profkit.data import shipped

CHECKOUT_SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"  # exists in a checkout only
DEFAULT_SAMPLE = "engine-dep2-h200/torch_straggler"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="analyze a shipped sample capture (no GPU needed)")
    p.add_argument("--sample", default=DEFAULT_SAMPLE,
                   help="a shipped sample, or in a checkout any folder under sample_traces/ (default: %(default)s)")
    p.add_argument("--live", action="store_true", help="run the bundled engine on CPU (4 ranks) and analyze that")
    p.add_argument("-o", "--out", metavar="OUT", help="where to write summary.json / steps.csv (default: a temp dir)")
    p.set_defaults(run=run)


def sample_path(name: str) -> Path:
    """The shipped sample ``name``, else ``sample_traces/name`` of a checkout."""
    roots = [shipped("samples"), CHECKOUT_SAMPLES]
    for root in roots:
        if (root / name).is_dir():
            return root / name
    available = sorted({f"{top.name}/{sub.name}" if sub is not top else top.name
                        for root in roots if root.is_dir() for top in root.iterdir() if top.is_dir()
                        for sub in ([d for d in top.iterdir() if d.is_dir()] or [top])})
    raise SystemExit(f"profkit demo: no sample '{name}' (available: {', '.join(available) or 'none'})")


def run(args: argparse.Namespace) -> int:
    from profkit.cli.analyze import analyze_and_report

    out = args.out or tempfile.mkdtemp(prefix="profkit-demo-")
    if args.live:
        from profkit.cli.live import run_live

        paths = [run_live(Path(out) / "capture")]
    else:
        folder = sample_path(args.sample)
        readme = next((d / "README.md" for d in (folder, folder.parent) if (d / "README.md").is_file()), None)
        if readme is not None:
            first = readme.read_text().strip().splitlines()[0].lstrip("# ")
            print(f"sample: {folder.name}: {first}\n", file=sys.stderr)
        paths = [folder]
    return analyze_and_report(paths, out, None, [], False)
