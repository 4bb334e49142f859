"""``OUT/report.html``: rendered in headless Chromium (Debian ``chromium``, driven by Playwright),
from a real capture and from hostile and large synthetic analyses.

Checks: every plot rendered (each plotly div holds its svg), no console errors, no request but
the file itself, trace names shown as text (a kernel named ``</script><script>alert(1)</script>``
fires no dialog). Screenshots go to ``$PROFKIT_TEST_ARTIFACTS`` (default ``tests/artifacts/``).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, SAMPLE_TRACES
from profkit.align import Alignment
from profkit.analyze.pipeline import Analysis, analyze
from profkit.ingest.loader import Capture, load
from profkit.report import html_data
from profkit.report.html import render_report, write_report
from profkit.report.html_figures import unique_labels
from profkit.report.html_page import plotly_js, script_json

STRAGGLER = SAMPLE_TRACES / "engine-dep2-h200" / "torch_straggler"
HOSTILE = "</script><script>alert(1)</script>"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))


def artifacts_dir() -> Path:
    path = Path(os.environ.get("PROFKIT_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- browser -------------------------------------------------------------------------------
def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


@pytest.fixture(scope="module")
def browser():
    exe = chromium_path()
    if exe is None:
        pytest.skip("Chromium not installed (Debian: apt-get install chromium chromium-driver; .ci/run does it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python not installed (pip install playwright)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_report(browser, path: Path, shot_name: str) -> dict:
    """Load the page from its file, wait for every plot, record what a user would not see."""
    context = browser.new_context(viewport={"width": 1300, "height": 900}, offline=True)
    page = context.new_page()
    console_errors: list[str] = []
    requests: list[str] = []
    dialogs: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(f"pageerror: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
    url = path.resolve().as_uri()
    page.goto(url, wait_until="load")
    n_divs = page.locator("div.plot").count()
    page.wait_for_function(
        "n => document.querySelectorAll('.js-plotly-plot').length === n && "
        "[...document.querySelectorAll('.js-plotly-plot')].every(d => d.querySelector('svg.main-svg'))",
        arg=n_divs, timeout=120_000,  # a hang guard: it returns once every plot has drawn
    )
    shot = artifacts_dir() / shot_name
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    result = {
        "url": url,
        "n_divs": n_divs,
        "n_plots": page.locator(".js-plotly-plot").count(),
        "n_rendered": page.locator(".js-plotly-plot .main-svg").count(),
        "n_scripts": page.locator("script").count(),
        "console_errors": console_errors,
        "requests": requests,
        "dialogs": dialogs,
        "text": page.inner_text("body"),
        "verdict": page.inner_text("p.verdict"),
        "section_text": {s: page.inner_text(f"section#{s}") for s in ("stragglers", "lateness", "balance", "findings")},
    }
    context.close()
    return result


def assert_clean(r: dict) -> None:
    assert r["n_divs"] >= 5 and r["n_plots"] == r["n_divs"], r
    assert r["n_rendered"] >= r["n_plots"], "a plot has no svg"
    assert r["console_errors"] == [], r["console_errors"]
    assert r["requests"] == [r["url"]], f"unexpected requests: {r['requests']}"
    assert r["dialogs"] == [], f"a dialog fired: {r['dialogs']}"
    assert r["n_scripts"] == r["n_divs"] + 1, "scripts: plotly.js plus one per figure, nothing injected"


# ---- analyses ------------------------------------------------------------------------------
def hostile_capture() -> Capture:
    """The real capture with a host span and a kernel renamed to markup."""
    cap = load(STRAGGLER)
    ev = cap.events.copy()
    names = ev["name"].astype("object")
    names[names == "experts"] = HOSTILE
    kernels = (ev["kind"] == "kernel").to_numpy(dtype=bool)
    names[kernels & (np.arange(len(ev)) % 7 == 0)] = HOSTILE + " kernel"
    ev["name"] = names.astype(cap.events["name"].dtype)
    return replace(cap, events=ev)


def synthetic_analysis(n_ranks: int, n_steps: int, optional: bool = True, seed: int = 0) -> Analysis:
    """A DEP-N analysis with every table the report reads (plus the optional analyzers'), fast."""
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(n_ranks), n_steps)
    step = np.tile(np.arange(n_steps), n_ranks)
    busy = rng.normal(7e6, 5e5, rank.size).astype("int64")
    gap = rng.gamma(2.0, 3e6, rank.size).astype("int64") + np.where(rank == n_ranks - 1, 4_000_000, 0)
    start = 1_000_000_000 + step * 40_000_000
    steps = pd.DataFrame({
        "rank": rank, "step": step, "start_ns": start, "end_ns": start + busy + gap, "step_ns": busy + gap,
        "gpu_busy_ns": busy, "gpu_kernel_ns": busy, "gap_ns": gap, "gpu_idle_share": gap / (busy + gap),
        "num_tokens": pd.array(rng.integers(1500, 2048, rank.size), dtype="Int64"),
    })
    g = steps.groupby("rank")
    ranks = pd.DataFrame({
        "rank": np.arange(n_ranks), "n_steps": g.size().to_numpy(), "window_ns": g["step_ns"].sum().to_numpy(),
        "gpu_busy_ns": g["gpu_busy_ns"].sum().to_numpy(), "step_ns_p50": g["step_ns"].median().to_numpy(),
        "step_ns_p90": g["step_ns"].quantile(0.9).to_numpy(), "gpu_busy_ns_p50": g["gpu_busy_ns"].median().to_numpy(),
        "gap_ns_p50": g["gap_ns"].median().to_numpy(),
        "step_gpu_idle_share": (g["gap_ns"].sum() / g["step_ns"].sum()).to_numpy(),
    })
    names = [f"waiting for rank {n_ranks - 1}", HOSTILE, "Scheduler.schedule"] + [f"span_{i}" for i in range(30)]
    totals = np.sort(rng.integers(1e6, 5e8, len(names)))[::-1]
    causes = pd.DataFrame({
        "cause": names, "total_ns": totals, "per_step_ns": totals // (n_ranks * n_steps),
        "step_share": totals / steps["step_ns"].sum(), "ranks": n_ranks, "example_rank": 0,
        "example_step": 5, "example_start_ns": 1_000_000_000 + 5 * 40_000_000 + 123_456,
        "category": "span", "example_dur_ns": 2_000_000,
    })
    align_ranks = pd.DataFrame({
        "rank": np.arange(n_ranks), "method": ["reference"] + ["collective_ends"] * (n_ranks - 1),
        "offset_ns": rng.integers(-5000, 5000, n_ranks), "drift_ppm": rng.normal(0, 3, n_ranks),
        "residual_ns": rng.integers(1000, 5000, n_ranks), "error_bound_ns": rng.integers(500, 3000, n_ranks),
        "n_points": 200,
    })
    parts = pd.DataFrame({"rank": np.arange(n_ranks), "source": "kineto",
                          "path": [f"traces/rank{r}.pt.trace.json.gz" for r in range(n_ranks)], "n_events": 1000})
    empty = pd.DataFrame({"name": pd.Series(dtype="object")})
    capture = Capture(events=empty, parts=parts, meta={}, skipped=[], warnings=[])
    analysis = Analysis(
        capture=capture, events=empty, alignment=Alignment(ranks=align_ranks, sources=pd.DataFrame(), t0_ns=0),
        steps=steps, timelines=pd.DataFrame(), ranks=ranks, step_marker="engine_step", causes=causes,
    )
    if optional:
        late = np.where(rank == n_ranks - 1, rng.gamma(2.0, 2e6, rank.size), rng.gamma(1.0, 1e5, rank.size))
        analysis.lateness = pd.DataFrame({"rank": rank, "step": step, "late_ns": late.astype("int64")})
        lg = analysis.lateness.groupby("rank")["late_ns"]
        analysis.stragglers = pd.DataFrame({
            "rank": np.arange(n_ranks), "times_last": rng.integers(0, n_steps, n_ranks),
            "late_ns_p50": lg.median().to_numpy(), "late_ns_p99": lg.quantile(0.99).to_numpy(),
            "caused_wait_ns": lg.sum().to_numpy(), "score": lg.mean().to_numpy() / 1e6,
            "top_cause": [HOSTILE] * n_ranks,
        })
        analysis.straggler_ranks = [n_ranks - 1]
        layer = np.tile(np.arange(4), n_steps)
        analysis.balance = {"ep": pd.DataFrame({"step": np.repeat(np.arange(n_steps), 4), "layer": layer,
                                                "balancedness": rng.uniform(0.6, 1.0, 4 * n_steps)})}
        analysis.impact = synthetic_impact(n_ranks, n_steps, rng)
    return analysis


def synthetic_impact(n_ranks: int, n_steps: int, rng):
    """An impact table shaped like ``analyze.impact``'s: a cause on one rank (named as markup), a
    straggler phase, a cause on every rank and the three bounds."""
    from profkit.analyze import impact as imp

    base = 20_000_000
    rows = [(HOSTILE, imp.CAUSE, str(n_ranks - 1), 4_000_000), ("Scheduler.schedule", imp.CAUSE,
            " ".join(map(str, range(n_ranks))), 900_000), (f"{HOSTILE} on rank 3", imp.RANK_PHASE, "3", 300_000),
            (imp.GPU_ONLY, imp.BOUND, "", 13_000_000), (imp.MEDIAN_RANK, imp.BOUND, "", 4_500_000),
            (imp.MEDIAN_STEP, imp.BOUND, "", 2_000_000)]
    table = pd.DataFrame([{
        "cause": c, "ranks": len(r.split()), "impact_ns_per_step": v, "impact_p90_ns": v, "impact_share": v / 13e6,
        "charged_ns": v * n_steps * 3, "kind": k, "ranks_list": r, "impact_lo_ns": int(v * 0.9),
        "impact_hi_ns": int(v * 1.1), "step_share": v / base, "removed_ns": v * n_steps, "base_step_ns": base,
        "replayed_step_ns": base - v, "n_steps": n_steps} for c, k, r, v in rows])
    return imp.Impact(table=table, steps=pd.DataFrame(columns=imp.IMPACT_STEP_COLUMNS), base_mean_ns=base,
                      gap_ns=13e6, n_points=n_ranks * n_steps * 50)


# ---- tests in the browser ------------------------------------------------------------------
def test_report_from_real_capture_renders_offline(browser, tmp_path):
    analysis = analyze(load(STRAGGLER))
    path = write_report(analysis, tmp_path / "out")
    assert path == tmp_path / "out" / "report.html"
    r = open_report(browser, path, "report_torch_straggler.png")
    assert_clean(r)
    assert r["verdict"].startswith("Serving steps take ")
    assert " ms (median) against " in r["verdict"] and "of step time" in r["verdict"]
    top = analysis.causes.sort_values("total_ns", ascending=False)["cause"].iloc[0]
    assert f"the top cause is {top}" in r["verdict"]
    assert "--steps " in r["section_text"]["findings"]


def test_hostile_trace_names_render_as_text(browser, tmp_path):
    analysis = analyze(hostile_capture())
    assert HOSTILE in set(analysis.causes["cause"]), "the renamed span must become a cause"
    path = write_report(analysis, tmp_path / "out")
    raw = path.read_text()
    assert HOSTILE not in raw and "<script>alert" not in raw
    r = open_report(browser, path, "report_hostile.png")
    assert_clean(r)
    assert HOSTILE in r["text"]


def test_large_synthetic_report_with_every_section(browser, tmp_path):
    analysis = synthetic_analysis(256, 1000)
    path = write_report(analysis, tmp_path / "out")
    own_bytes = len(path.read_text()) - len(plotly_js())
    print(f"256 ranks x 1000 steps: {own_bytes / 1e6:.2f} MB besides plotly.js")
    assert own_bytes < 2_000_000
    r = open_report(browser, path, "report_synthetic_256x1000.png")
    assert_clean(r)
    assert "straggler: rank 255" in r["verdict"]
    assert "Not computed" not in r["text"] and "not computed" not in r["verdict"]
    assert "binned" in r["section_text"]["lateness"] and "Lateness at sync points" in r["section_text"]["lateness"]
    assert "Stragglers at their latest step" in r["section_text"]["findings"]
    assert r["text"].count(HOSTILE) >= 2  # a cause and a straggler's top cause
    # the page leads with impact: what removing the cause would save, before anything else
    lead = r["text"].index("would cut the mean serving step by")
    assert lead < r["text"].index("Serving steps take ") and HOSTILE in r["text"][:lead + 200]


# ---- tests without a browser ---------------------------------------------------------------
def test_absent_analyzers_say_not_computed():
    html = render_report(synthetic_analysis(2, 10, optional=False))
    assert "stragglers not computed" in html
    assert "Not computed: this analysis has no straggler table" in html
    assert "Fallback: lateness was not computed" in html
    assert "EP balancedness" in html and "Not computed: this analysis has no balance table" in html
    assert "Not computed: this analysis has no impact table" in html and '<p class="impact-verdict">' not in html


def test_no_steps_still_renders():
    analysis = synthetic_analysis(2, 10, optional=False)
    analysis.steps = analysis.steps.iloc[0:0]
    html = render_report(analysis)
    assert "No serving steps were found" in html


def test_figure_json_cannot_close_the_script():
    import plotly.graph_objects as go
    import plotly.io as pio

    text = script_json(pio.to_json(go.Figure(go.Bar(x=[HOSTILE, "a & b > c"], y=[1, 2]))))
    assert "</" not in text and "<" not in text and ">" not in text and "&" not in text


def test_page_references_nothing_external():
    html = render_report(synthetic_analysis(4, 20))
    own = html.replace(plotly_js(), "")
    assert html.count(plotly_js()) == 1
    for needle in ("<link", " src=", "@import", "url(", "http://", "https://"):
        assert needle not in own, needle


def test_lateness_read_from_long_or_wide_tables():
    analysis = synthetic_analysis(3, 4, optional=False)
    wide = pd.DataFrame({"rank": [0, 1, 2], 0: [0.0, 1e6, 0.0], 1: [0.0, 2e6, 5e5], 2: [0.0, 3e6, 0.0], 3: [0, 0, 0]})
    analysis.lateness = wide
    m = html_data.lateness_matrix(analysis)
    assert m.title.startswith("Lateness") and m.z.shape == (3, 4)
    assert m.z[1, 2] == pytest.approx(3.0)
    analysis.lateness = wide.set_index("rank").stack().rename("late_ns").rename_axis(["rank", "step"]).reset_index()
    assert np.array_equal(html_data.lateness_matrix(analysis).z, m.z)


def test_heatmap_binning_keeps_spikes():
    long = pd.DataFrame({"rank": np.repeat(np.arange(300), 450), "step": np.tile(np.arange(450), 300), "v": 0.0})
    long.loc[(long["rank"] == 299) & (long["step"] == 449), "v"] = 7e6
    m = html_data.matrix(long, "v", "t")
    assert m.z.shape[0] <= html_data.MAX_HEATMAP_RANKS and m.z.shape[1] <= html_data.MAX_HEATMAP_STEPS
    assert float(np.nanmax(m.z)) == pytest.approx(7.0) and m.ranks[-1].endswith("299") and "binned" in m.note


def test_long_cause_names_stay_distinct_on_the_axis():
    a, b = "x" * 60 + "A", "x" * 60 + "B"
    labels = unique_labels([a, b, HOSTILE])
    assert len(set(labels)) == 3 and "<" not in labels[2]
