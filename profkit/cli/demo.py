"""``profkit demo``: analyze the small real captures that ship in ``sample_traces/``.

Needs no GPU, no network and no server. ``--live`` runs the bundled engine briefly on
this machine's CPU instead (needs torch).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

SAMPLE_TRACES = Path(__file__).resolve().parents[2] / "sample_traces"
DEFAULT_SAMPLE = "engine-dep2-h200/torch_straggler"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="analyze the shipped sample traces (no GPU needed)")
    p.add_argument("--sample", default=DEFAULT_SAMPLE, help="folder under sample_traces/ (default: %(default)s)")
    p.add_argument("--live", action="store_true", help="run the bundled engine on CPU (4 ranks) and analyze that")
    p.add_argument("-o", "--out", metavar="OUT", help="where to write summary.json / steps.csv (default: a temp dir)")
    p.set_defaults(run=run)


def sample_path(name: str) -> Path:
    folder = SAMPLE_TRACES / name
    if not folder.is_dir():
        available = sorted(p.name for p in SAMPLE_TRACES.iterdir() if p.is_dir()) if SAMPLE_TRACES.is_dir() else []
        raise SystemExit(f"profkit demo: no sample '{name}' in {SAMPLE_TRACES} (available: {', '.join(available) or 'none'})")
    return folder


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
