"""``profkit dashboard``: a self-contained page of the history with every panel of the spec; names
from runs stay text; in headless Chromium the plots render with no console errors or requests."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from profkit.cli.main import main
from profkit.report import dashboard as dash

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces" / "engine-dep2-h200"
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = "</script><script>alert(1)</script>"


def analyze_into(capture: str, out: Path) -> Path:
    """``profkit analyze CAPTURE -o OUT``; it writes ``cause_steps.csv`` itself (checked)."""
    assert main(["analyze", str(SAMPLES / capture), "-o", str(out), "-q"]) == 0
    assert (out / "cause_steps.csv").is_file(), "profkit analyze did not write cause_steps.csv"
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Four runs: nsys clean twice, nsys fault-injected, torch clean under a hostile label."""
    base = tmp_path_factory.mktemp("dashboard")
    db = base / "runs.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROFKIT_CACHE_DIR", str(base / "cache"))
        clean = analyze_into("nsys_clean", base / "nsys_clean")
        straggler = analyze_into("nsys_straggler", base / "nsys_straggler")
        torch_clean = analyze_into("torch_clean", base / "torch_clean")
        for hour, (out, label, meta) in enumerate([
            (clean, "nightly-1", ["backend=nsys"]),
            (clean, "nightly-2", ["backend=nsys"]),
            (straggler, "nightly-3", ["backend=nsys"]),
            (torch_clean, HOSTILE, ["backend=torch", f"note={HOSTILE}"]),
        ]):
            args = ["history", "add", str(out), "--db", str(db), "--label", label, "--time", f"2026-11-29T1{hour}:00", "-q"]
            for m in meta:
                args += ["--meta", m]
            assert main(args) == 0
        yield db


class Page(HTMLParser):
    """Panels, scripts and every external reference of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.panels: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self.external: list[str] = []
        self._script: dict | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and (a.get("id") or "").startswith("panel-"):
            self.panels.append(a.get("data-title", ""))
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(a[key])
        if tag == "script":
            self._script, self._text = a, []

    def handle_data(self, data):
        if self._script is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None


def write(history: Path, out: Path, *extra: str) -> tuple[str, Page]:
    assert main(["dashboard", "--db", str(history), "-o", str(out), "-q", *extra]) == 0
    text = out.read_text(encoding="utf-8")
    page = Page()
    page.feed(text)
    return text, page


def test_dashboard_is_self_contained_with_every_panel(history, tmp_path):
    spec = dash.load_spec()
    text, page = write(history, tmp_path / "dashboard.html")
    assert page.panels == [p.title for p in spec.panels]
    assert page.external == []  # no src/href at all: nothing to fetch
    from plotly.offline import get_plotlyjs

    assert text.count(get_plotlyjs()[:200]) == 1  # plotly.js inlined once
    figures = json.loads(next(s for a, s in page.scripts if a.get("id") == "figures"))
    assert len(figures) == len(spec.panels)
    titles = [f["layout"]["title"]["text"] for f in figures]
    assert titles == [dash._t(p.title) for p in spec.panels]
    step_p50 = figures[0]
    line = next(t for t in step_p50["data"] if t.get("mode") == "lines+markers")
    assert len(line["y"]) == 4  # a point per run
    assert line["y"][0] == pytest.approx(line["y"][1])  # the same capture twice
    marks = [t for t in step_p50["data"] if t.get("name", "").endswith("regressed")]
    assert marks and marks[0]["x"] == [2]  # nightly-3 (fault injected) vs nightly-2
    causes = figures[[p.metric for p in spec.panels].index("cause:*")]
    names = {t["name"] for t in causes["data"] if t.get("mode") == "lines+markers"}
    assert "waiting for rank 1" in names
    assert "nightly-3 (#3) vs nightly-2 (#2): Step time p50 +" in text


def test_names_from_runs_are_escaped(history, tmp_path):
    text, page = write(history, tmp_path / "dashboard.html")
    assert HOSTILE not in text
    assert "alert(1)" in text  # present, as text
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # exactly the page's own scripts: plotly.js, the figures (JSON), the loader
    assert len(page.scripts) == 3
    assert [a.get("type") for a, _ in page.scripts].count("application/json") == 1


def test_filters_by_label_and_meta(history, tmp_path):
    text, _ = write(history, tmp_path / "nightly.html", "--label", "nightly-*", "--meta", "backend=nsys")
    assert "3 run(s), label nightly-*, backend=nsys" in text
    assert "alert(1)" not in text
    _, page = write(history, tmp_path / "one.html", "--label", "nightly-1")
    figures = json.loads(next(s for a, s in page.scripts if a.get("id") == "figures"))
    line = next(t for t in figures[0]["data"] if t.get("mode") == "lines+markers")
    assert len(line["y"]) == 1


def test_spec_from_a_file_and_its_errors(history, tmp_path, capsys):
    spec = tmp_path / "mine.json"
    spec.write_text(json.dumps({"title": "just p99", "x": "time", "baseline": "first",
                                "panels": [{"title": "p99", "metric": "step_ns", "aggregation": "p99", "threshold": "10%"},
                                           {"metric": "cause:waiting for rank 1"}]}))
    _, page = write(history, tmp_path / "mine.html", "--spec", str(spec))
    assert page.panels == ["p99", "waiting for rank 1"]
    spec.write_text(json.dumps({"panels": [{"metric": "step_ns"}, {"metric": "steps_ns", "aggregation": "p50"}]}))
    assert main(["dashboard", "--db", str(history), "-o", str(tmp_path / "x.html"), "--spec", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}: panel 2: unknown metric 'steps_ns'" in err
    assert main(["dashboard", "--db", str(tmp_path / "none.sqlite"), "-o", str(tmp_path / "x.html")]) == 2
    assert "no such history database" in capsys.readouterr().err
    assert main(["dashboard", "--db", str(history), "-o", str(tmp_path / "x.html"), "--label", "zzz*"]) == 1
    assert "no runs match" in capsys.readouterr().err


def test_dashboard_renders_in_headless_chromium(history, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (Debian package `chromium`)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install playwright)")
    out = tmp_path / "dashboard.html"
    write(history, out)
    n_panels = len(dash.load_spec().panels)
    console, errors, requests, dialogs = [], [], [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(out.as_uri())
            page.wait_for_function(f"document.querySelectorAll('.plot .main-svg').length >= {n_panels}", timeout=120_000)  # hang guard
            rendered = page.evaluate("Array.from(document.querySelectorAll('.plot')).map(d => d.querySelectorAll('path.js-line, .scatterlayer .trace').length)")
            body = page.evaluate("document.body.innerText")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    assert not [c for c in console if c.startswith("error")], console
    assert [u for u in requests if not u.startswith("file://")] == []
    assert len(rendered) == n_panels and all(n > 0 for n in rendered[:5]), rendered  # step, GPU, gap, causes drawn
    assert HOSTILE in body and dialogs == []  # the hostile label is shown as text, never run
