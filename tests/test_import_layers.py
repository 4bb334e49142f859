"""The import graph follows the pipeline: no stage imports a later one, and stages form no cycle.

Every module of ``profkit/`` is parsed with ``ast`` (nothing is imported or run); every import
counts, also those inside functions (a lazy import is still a dependency, only a later one) and
under ``TYPE_CHECKING``. A module's stage is its subpackage (``profkit.analyze.steps`` is in
``analyze``); the modules at the top (``profkit.errors``, ``profkit.schema``, the package itself)
and ``profkit.data`` are the base every stage may use.

Where the code still breaks the order, the edge is listed in ``ALLOWED`` with why; the test also
fails when a listed edge no longer occurs, so the list can only shrink (issue #15).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "profkit"

# stage -> its place in the pipeline; a module may import its own stage and earlier ones only.
# Equal places are peers that must not import each other.
ORDER = {
    "base": 0,        # profkit (facade), .arrowfiles, .distinct, .errors, .flags, .intervals, .keys, .layers, .names, .native, .robust, .schema, .data
    "engine": 1,      # the bundled serving engine: a program profkit observes; imports no stage
    "simulate": 1,    # writes the traces a DEP-N deployment would: a program too; imports no stage
    "instrument": 2,  # inside every rank
    "capture": 3,     # the launcher, which switches instrument on
    "ingest": 4,      # readers -> events
    "collectives": 5,  # collectives and sync points per rank, matched across ranks (align and analyze read them)
    "align": 6,       # one clock
    "analyze": 7,     # pure tables in, tables out
    "export": 8,      # merged traces
    "history": 8,     # the regression database of analysis runs
    "report": 9,      # terminal, files, HTML, dashboards (over the history)
    "scale": 10,      # runs the stages as a map over ranks
    "cli": 11,        # commands (and profkit.__main__)
}
BASE_MODULES = {"profkit", "profkit.arrowfiles", "profkit.distinct", "profkit.errors", "profkit.flags", "profkit.intervals",
                "profkit.keys", "profkit.layers", "profkit.names", "profkit.native", "profkit.robust", "profkit.schema"}

# (importer, imported) edges that break ORDER today. Each says why it is here; remove an entry
# when the edge is gone (the test fails while a listed edge no longer occurs).
ALLOWED: dict[tuple[str, str], str] = {
    # the package's lazy facade: ``profkit.span`` and ``profkit.load`` for users, imported inside
    # ``__getattr__`` so ``import profkit`` stays light inside every rank (by design, not a debt)
    ("profkit", "profkit.instrument"): "facade: profkit.span",
    ("profkit", "profkit.analyze.capture"): "facade: profkit.load / profkit.Capture (and under TYPE_CHECKING)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The deepest known module a dotted name lies in (``profkit.a.b.func`` -> ``profkit.a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def import_edges(known: dict[str, Path] | None = None) -> dict[tuple[str, str], list[int]]:
    """(importer, imported module) -> line numbers, over every import statement of profkit/."""
    known = known or _modules()
    edges: dict[tuple[str, str], list[int]] = defaultdict(list)
    for mod, path in known.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
            for target in targets:
                if target.split(".")[0] != "profkit":
                    continue
                resolved = _resolve(target, known)
                if resolved and resolved != mod:
                    edges[(mod, resolved)].append(node.lineno)
    return edges


def stage_of(module: str) -> str:
    if module in BASE_MODULES or module.startswith("profkit.data"):
        return "base"
    if module == "profkit.__main__":
        return "cli"
    return module.split(".")[1]


def test_every_stage_is_in_the_order_table():
    stages = {stage_of(m) for m in _modules()}
    assert stages <= set(ORDER), f"add {sorted(stages - set(ORDER))} to ORDER (where in the pipeline?)"


def _violations(edges) -> dict[tuple[str, str], list[int]]:
    return {(a, b): lines for (a, b), lines in edges.items()
            if stage_of(a) != stage_of(b) and ORDER[stage_of(b)] >= ORDER[stage_of(a)]}


def test_no_stage_imports_a_later_one():
    bad = {e: lines for e, lines in _violations(import_edges()).items() if e not in ALLOWED}
    listing = "\n".join(f"  {a} (line {', '.join(map(str, lines))}) -> {b}: {stage_of(a)} imports "
                        f"{stage_of(b)}" for (a, b), lines in sorted(bad.items()))
    assert not bad, "imports against the pipeline order (move the code down, or the import up):\n" + listing


def test_the_allow_list_is_not_stale():
    edges = import_edges()
    stale = [e for e in ALLOWED if e not in edges]
    assert not stale, f"these allowed edges no longer occur; delete them from ALLOWED: {stale}"
    fine = [e for e in ALLOWED if e not in _violations(edges)]
    assert not fine, f"these allowed edges follow the order now; delete them from ALLOWED: {fine}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_cycle_between_stages():
    graph: dict[str, set[str]] = defaultdict(set)
    for (a, b) in import_edges():
        if (a, b) not in ALLOWED and stage_of(a) != stage_of(b):
            graph[stage_of(a)].add(stage_of(b))
    assert not _cycles(graph), f"stages import each other: {_cycles(graph)}"


def test_the_walk_sees_what_it_must():
    """The check can fail: the walk finds known edges of every import form, lazy ones included."""
    edges = import_edges()
    assert ("profkit.cli.analyze", "profkit.report.files") in edges  # inside a function
    assert ("profkit.analyze.steps", "profkit.schema") in edges  # ``from profkit import schema``
    assert ("profkit.history", "profkit.history.db") in edges  # a package's own module
    assert _violations({("profkit.ingest.loader", "profkit.analyze.steps"): [1]})
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
