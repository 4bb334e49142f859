"""HTML building blocks of the report: escaping, figure embedding, tables, the page shell.

Two escaping rules keep trace names inert: HTML text goes through ``esc`` (``html.escape``),
and figure JSON inside ``<script>`` has every ``<``, ``>``, ``&`` (only ever inside JSON
strings) written as ``\\u003c``/``\\u003e``/``\\u0026``, so no name can close the script.
plotly.js is inlined once; the page fetches nothing (no CDN, fonts or images).
"""
from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

import plotly.graph_objects as go
import plotly.io as pio

PLOT_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False, "showSendToCloud": False,
               "modeBarButtonsToRemove": ["sendDataToCloud", "lasso2d", "select2d"]}

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def script_json(text: str) -> str:
    """JSON made safe to sit inside a ``<script>`` element (see the module docstring)."""
    for raw, escaped in _JSON_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def plotly_js() -> str:
    """plotly.js, inlined once per page (the report must open offline)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # would end the inline script early; never true for plotly.js
        raise RuntimeError("plotly.js contains '</script' and cannot be inlined")
    return js


class Figures:
    """Numbers the figure divs of a page and renders each with its ``Plotly.newPlot`` call."""

    def __init__(self) -> None:
        self.count = 0

    def embed(self, fig: go.Figure, caption: str = "") -> str:
        self.count += 1
        div_id = f"fig{self.count}"
        data = script_json(pio.to_json(fig, validate=False, remove_uids=True))
        config = script_json(pio.json.to_json_plotly(PLOT_CONFIG))
        cap = f'<p class="caption">{caption}</p>' if caption else ""
        return (
            f'<div class="plot" id="{div_id}"></div>{cap}\n'
            f"<script>(function(){{var f={data};"
            f'Plotly.newPlot("{div_id}",f.data,f.layout,{config});}})();</script>\n'
        )


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[bool] | None = None,
          cls: str = "") -> str:
    """A table of already-escaped cells (callers escape; numbers are right-aligned)."""
    numeric = numeric or [False] * len(headers)
    head = "".join(f'<th class="{"num" if n else ""}">{h}</th>' for h, n in zip(headers, numeric))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"num" if n else ""}">{c}</td>' for c, n in zip(row, numeric)) + "</tr>"
        for row in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def section(anchor: str, title: str, body: str, lead: str = "") -> str:
    lead_html = f'<p class="lead">{lead}</p>' if lead else ""
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{lead_html}{body}</section>\n'


def missing(text: str) -> str:
    return f'<p class="missing">{text}</p>'


def card(title: str, value: str, sub: str = "") -> str:
    sub_html = f'<div class="sub">{sub}</div>' if sub else ""
    return f'<div class="card"><div class="k">{esc(title)}</div><div class="v">{value}</div>{sub_html}</div>'


CSS = """
:root { --fg:#1d2330; --muted:#5b6474; --line:#dde2ea; --bg:#f6f7f9; --accent:#1f5fa8; --warn:#b3261e; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
       color:var(--fg); background:var(--bg); }
header { background:#1d2330; color:#fff; padding:14px 28px; }
header h1 { margin:0; font-size:18px; font-weight:600; }
header .meta { color:#b9c1cf; font-size:12px; margin-top:2px; overflow-wrap:anywhere; }
main { max-width:1280px; margin:0 auto; padding:18px 28px 40px; }
.verdict { background:#fff; border-left:5px solid var(--accent); padding:14px 18px; margin:0 0 14px;
           font-size:17px; line-height:1.5; box-shadow:0 1px 2px rgba(0,0,0,.06); }
.consistency { background:#fff4e5; border-left:5px solid #d9822b; padding:8px 14px; margin:0 0 10px; }
.verdict b { font-weight:650; }
.impact-verdict { background:#fff; border-left:5px solid #2e7d32; padding:14px 18px; margin:0 0 10px;
                  font-size:17px; line-height:1.5; box-shadow:0 1px 2px rgba(0,0,0,.06); }
.impact-verdict b { font-weight:650; }
.cards { display:flex; flex-wrap:wrap; gap:10px; margin-bottom:10px; }
.card { background:#fff; border:1px solid var(--line); border-radius:6px; padding:8px 14px; min-width:150px; }
.card .k { color:var(--muted); font-size:12px; }
.card .v { font-size:20px; font-weight:600; font-variant-numeric:tabular-nums; overflow-wrap:anywhere; }
.card .v .na { color:var(--muted); font-size:15px; font-weight:500; }
.card .sub { color:var(--muted); font-size:12px; }
nav { font-size:13px; margin:4px 0 8px; color:var(--muted); }
nav a { color:var(--accent); text-decoration:none; margin-right:14px; }
section { background:#fff; border:1px solid var(--line); border-radius:6px; padding:12px 18px 14px; margin:14px 0; }
h2 { font-size:16px; margin:2px 0 6px; }
h3 { font-size:14px; margin:12px 0 4px; }
.lead { color:var(--muted); margin:0 0 6px; }
.caption { color:var(--muted); font-size:12px; margin:2px 0 10px; }
.missing { color:var(--muted); font-style:italic; }
.plot { width:100%; }
table { border-collapse:collapse; width:100%; font-size:13px; margin:6px 0; }
th, td { border-bottom:1px solid var(--line); padding:4px 8px; text-align:left; vertical-align:top;
         overflow-wrap:anywhere; }
th { background:#f0f2f5; font-weight:600; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
code, .cmd { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:12px; }
.cmd { background:#f0f2f5; padding:2px 5px; border-radius:3px; display:inline-block; overflow-wrap:anywhere; }
details summary { cursor:pointer; color:var(--accent); margin:6px 0; }
.warn { color:var(--warn); }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px; }
"""


def page(title: str, meta: str, body: str, figures_used: bool) -> str:
    """The whole document; plotly.js only when a figure needs it."""
    js = f"<script>{plotly_js()}</script>\n" if figures_used else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # no network, even by accident: only inline scripts/styles and data: images are allowed
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src 'none'\">\n"
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n{js}</head>\n<body>\n"
        f"<header><h1>{esc(title)}</h1><div class=\"meta\">{meta}</div></header>\n"
        f"<main>\n{body}</main>\n<footer>profkit HTML report: self-contained, opens offline.</footer>\n</body></html>\n"
    )

