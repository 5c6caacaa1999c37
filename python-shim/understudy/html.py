"""A report as one self-contained HTML page: `understudy html REPORT.json -o report.html`.

The page needs nothing but itself: styles and the roofline chart (SVG) are
written inline, there is no script, font or image to fetch, and no link
leaves the page. It shows

- the candidates' headline (S over their own keys beside production's on the
  same keys) and, where a key was measured above its roof, the flag;
- the roofline: per shape key with a timed call and a floor, achieved FLOP/s
  (mean W over the median time) against arithmetic intensity (W/Q), on log
  axes, production and candidate, under the ceilings of the hardware profile
  the key was scored against (the report's `hardware`); the heaviest keys
  named by their operator, every point named on hover (its SVG title), a
  point above its roof ringed;
- operator weights and S, per phase (an S above 1 marked);
- every shape key, whole, with its latency quantiles (`-` where none of its
  calls was timed);
- a summary per candidate (routes, verifications, rollbacks, the geometric
  mean of its speedups, its worst errors, S against production's), then its
  route cards folded under it: verdict counts, error statistics, its rollout
  timeline and, for a rollback, the evidence (the first mismatching index,
  max abs/rel and relative L2 error, non-finite counts).

Operators that saw no call are listed by name only unless asked for."""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from html import escape

from .tables import (ABOVE_ROOF_WORDS, DASH, REPORT_LEGEND, VERDICT_LEGEND,
                     above_roof_line, hidden_operators, rollback_line, score)

# Operators' colours (Tableau 10): points of one operator share one.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#393b79")  # Tableau's red left out: it marks rollbacks
ROLLED_BACK = "#d62728"
ABOVE_ROOF_COLOUR = "#e6550d"
LABELS_AT_MOST = 12  # the heaviest points named on the chart; every point is named on hover
MODE_COLOURS = {"off": "#bbbbbb", "observe": "#dddddd", "shadow": "#9ecae1", "canary": "#fdae6b", "live": "#74c476",
                "rolled_back": "#fb6a4a", "mixed": "#cccccc"}

# The chart's frame, in SVG user units (= CSS pixels: the SVG is drawn at its own size).
CHART_W, CHART_H = 900, 520
PLOT = {"left": 78, "right": 880, "top": 20, "bottom": 470}


class HtmlError(ValueError):
    """The file is not a report this page can be made of; the message says why."""


def _si(v: float, unit: str) -> str:
    if v is None:
        return DASH
    for f, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= f:
            return f"{v / f:.3g} {p}{unit}"
    return f"{v:.3g} {unit}"


def _us(ns) -> str:
    return f"{ns / 1000.0:.1f}"


def _f(v, fmt=".3f") -> str:
    return DASH if v is None else format(v, fmt)


def _s(v) -> str:
    """An S cell: marked, with the words on hover, when above 1 (above its roof)."""
    if v is None or v <= 1:
        return _f(v)
    return (f'<span class="above-roof" title="above its roof (S &gt; 1): {escape(ABOVE_ROOF_WORDS)}">'
            f'{escape(score(v))}</span>')


def _key_html(key: str) -> str:
    """A shape key, whole, with line-break opportunities after | and , (the text stays the key)."""
    return escape(key).replace("|", "|<wbr>").replace(",", ",<wbr>")


def _ops(rep: dict, all_operators: bool) -> list:
    hidden = set() if all_operators else set(hidden_operators(rep))
    return sorted((o for o in rep.get("operators", []) if o["name"] not in hidden),
                  key=lambda o: (-o.get("weight", 0), -o.get("calls", 0), o["name"]))


# ---- the roofline chart ---------------------------------------------------------------


class _LogAxis:
    """Decades lo..hi (integers) onto pixels a..b."""

    def __init__(self, lo: int, hi: int, a: float, b: float):
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        return self.a + (math.log10(v) - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _decades(values, min_span=2) -> tuple:
    """The decades that hold every value, at least min_span of them."""
    lo = math.floor(math.log10(min(values)))
    hi = math.ceil(math.log10(max(values)))
    return lo, max(hi, lo + min_span)


def chart_points(rep: dict, ops: list) -> tuple:
    """(points, left out): a point per shape key and series (production,
    candidate) that has an intensity and an achieved rate; the keys left out
    by why."""
    # W and Q are evaluated for timed calls only, so an untimed key has neither
    points, out = [], {"without a timed call": [],
                       "without a floor (no hardware profile, or a dtype without a peak)": [],
                       "with W = 0 (data movement: no place on a FLOP/s axis)": []}
    untimed, no_floor, no_flops = out
    colour = {o["name"]: PALETTE[i % len(PALETTE)] for i, o in enumerate(ops)}
    for o in ops:
        for s in o.get("shapes", []):
            rf = s.get("roofline") or {}
            if not s.get("timed") or not rf.get("achieved_flops_s") and rf.get("flops_mean"):
                out[untimed].append(s["key"])
            elif not rf.get("work_calls"):
                out[no_floor].append(s["key"])
            elif not rf.get("flops_mean") or not rf.get("intensity"):
                out[no_flops].append(s["key"])
            else:
                base = {"key": s["key"], "op": o["name"], "colour": colour[o["name"]], "hardware": rf.get("hardware"),
                        "intensity": rf["intensity"], "S": rf.get("S"), "mode": s.get("mode"),
                        "weight": s.get("weight") or 0.0}
                points.append(dict(base, series="production", flops_s=rf["achieved_flops_s"]))
                if rf.get("candidate_achieved_flops_s"):
                    points.append(dict(base, series="candidate", flops_s=rf["candidate_achieved_flops_s"],
                                       S=rf.get("S_candidate"), rolled_back=s.get("mode") == "rolled_back",
                                       candidate=o.get("candidate", {}).get("name")))
    return points, out


def roofline_svg(rep: dict, ops: list) -> tuple:
    """The chart (SVG text) and a sentence on the keys it leaves out."""
    points, out = chart_points(rep, ops)
    profiles = [h for h in rep.get("hardware", []) if h.get("b_peak")]
    used = {p["hardware"] for p in points}
    profiles = [h for h in profiles if h["name"] in used] or profiles
    missing = sorted(n for n in used if n and n not in {h["name"] for h in profiles})
    notes = [f"{len(v)} shape key{'s' if len(v) > 1 else ''} {why}" for why, v in out.items() if v]
    if missing:
        notes.append("no ceilings in the report for " + ", ".join(missing))
    if not points:
        return ('<p class="empty">No shape key has a timed call and a roofline floor: nothing to chart. '
                "(Scoring needs a hardware profile for the device: see <code>hardware</code> in the config, "
                "or <code>understudy calibrate</code>.)</p>", "; ".join(notes))
    xs = [p["intensity"] for p in points] + [p_ / h["b_peak"] for h in profiles for p_ in h["p_peak"].values()]
    ys = [p["flops_s"] for p in points] + [p_ for h in profiles for p_ in h["p_peak"].values()]
    xlo, xhi = _decades(xs)
    ylo, yhi = _decades(ys)
    X = _LogAxis(xlo, xhi, PLOT["left"], PLOT["right"])
    Y = _LogAxis(ylo, yhi, PLOT["bottom"], PLOT["top"])
    e = []
    e.append(f'<svg id="roofline" width="{CHART_W}" height="{CHART_H}" '
             f'viewBox="0 0 {CHART_W} {CHART_H}" role="img" aria-label="roofline chart" '
             f'font-family="system-ui, sans-serif" font-size="12">')
    e.append(f'<rect x="{PLOT["left"]}" y="{PLOT["top"]}" width="{PLOT["right"] - PLOT["left"]}" '
             f'height="{PLOT["bottom"] - PLOT["top"]}" fill="#ffffff" stroke="#999999"/>')
    for k in range(xlo, xhi + 1):
        x = X(10.0 ** k)
        e.append(f'<g class="tick x" data-log10="{k}"><line x1="{x:.2f}" y1="{PLOT["top"]}" x2="{x:.2f}" '
                 f'y2="{PLOT["bottom"]}" stroke="#eeeeee"/><text x="{x:.2f}" y="{PLOT["bottom"] + 16}" '
                 f'text-anchor="middle">10<tspan dy="-5" font-size="9">{k}</tspan></text></g>')
    for k in range(ylo, yhi + 1):
        y = Y(10.0 ** k)
        e.append(f'<g class="tick y" data-log10="{k}"><line x1="{PLOT["left"]}" y1="{y:.2f}" x2="{PLOT["right"]}" '
                 f'y2="{y:.2f}" stroke="#eeeeee"/><text x="{PLOT["left"] - 6}" y="{y + 4:.2f}" '
                 f'text-anchor="end">10<tspan dy="-5" font-size="9">{k}</tspan></text></g>')
    e.append(f'<text x="{(PLOT["left"] + PLOT["right"]) / 2}" y="{CHART_H - 12}" text-anchor="middle">'
             f'arithmetic intensity W/Q (FLOP per byte)</text>')
    e.append(f'<text transform="translate(16 {(PLOT["top"] + PLOT["bottom"]) / 2}) rotate(-90)" '
             f'text-anchor="middle">achieved FLOP/s (mean W / median time)</text>')
    e.append(f'<clipPath id="plotarea"><rect x="{PLOT["left"]}" y="{PLOT["top"]}" '
             f'width="{PLOT["right"] - PLOT["left"]}" height="{PLOT["bottom"] - PLOT["top"]}"/></clipPath>')
    x0, x1 = 10.0 ** xlo, 10.0 ** xhi
    for hi, h in enumerate(profiles):
        dash = "" if hi == 0 else ' stroke-dasharray="6 3"'
        b = h["b_peak"]
        top = max(h["p_peak"].values())
        # memory roof up to the highest compute roof, then each compute roof from its ridge
        e.append(f'<g class="ceiling" data-profile="{escape(h["name"])}" clip-path="url(#plotarea)">')
        e.append(f'<line class="bandwidth" data-bytes-s="{b!r}" x1="{X(x0):.2f}" y1="{Y(x0 * b):.2f}" '
                 f'x2="{X(top / b):.2f}" y2="{Y(top):.2f}" stroke="#333333" stroke-width="1.5"{dash}/>')
        for path, p in sorted(h["p_peak"].items(), key=lambda kv: -kv[1]):
            e.append(f'<line class="compute" data-path="{escape(path)}" data-flops-s="{p!r}" x1="{X(p / b):.2f}" '
                     f'y1="{Y(p):.2f}" x2="{X(x1):.2f}" y2="{Y(p):.2f}" stroke="#333333" stroke-width="1"{dash}/>')
        e.append("</g>")
        # labels above their roofs, pushed apart where roofs lie close together
        ly = -1e9
        for path, p in sorted(h["p_peak"].items(), key=lambda kv: -kv[1]):
            ly = max(Y(p) - 4, ly + 13)
            e.append(f'<text x="{PLOT["right"] - 4}" y="{ly:.2f}" text-anchor="end" fill="#333333">'
                     f'{escape(path)} {_si(p, "FLOP/s")}{"" if len(profiles) == 1 else " (" + escape(h["name"]) + ")"}'
                     f'</text>')
        # the bandwidth label along the diagonal, where it is inside the plot
        lx = max(x0 * 3, 10.0 ** (xlo + 0.3))
        if Y(lx * b) > PLOT["top"] + 10:
            ang = math.degrees(math.atan2(Y(lx * 10 * b) - Y(lx * b), X(lx * 10) - X(lx)))
            e.append(f'<text transform="translate({X(lx):.2f} {Y(lx * b) - 6:.2f}) rotate({ang:.2f})" '
                     f'fill="#333333">{_si(b, "B/s")}{"" if len(profiles) == 1 else " (" + escape(h["name"]) + ")"}'
                     f'</text>')
    # a candidate and production of one key share the intensity: a line joins them
    by_key = {}
    for p in points:
        by_key.setdefault(p["key"], {})[p["series"]] = p
    for k, pair in by_key.items():
        if len(pair) == 2:
            x = X(pair["production"]["intensity"])
            e.append(f'<line class="pair" x1="{x:.2f}" y1="{Y(pair["production"]["flops_s"]):.2f}" x2="{x:.2f}" '
                     f'y2="{Y(pair["candidate"]["flops_s"]):.2f}" stroke="#aaaaaa" stroke-dasharray="2 2"/>')
    # the heaviest keys named beside their points (drawn under every mark); a
    # label that would overlap one already placed is left to the hover
    placed = []
    for p in sorted((p for p in points if p["series"] == "production"), key=lambda p: -p["weight"]):
        if len(placed) >= LABELS_AT_MOST:
            break
        x, y = X(p["intensity"]), Y(p["flops_s"])
        w = 6.5 * len(p["op"])
        box = (x + 8, y - 14, x + 8 + w, y - 2) if x + 8 + w < PLOT["right"] else (x - 8 - w, y - 14, x - 8, y - 2)
        if any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
            continue
        placed.append(box)
        e.append(f'<text class="label" data-key="{escape(p["key"])}" x="{box[0]:.2f}" y="{box[3] - 2:.2f}" '
                 f'font-size="11" fill="{p["colour"]}">{escape(p["op"])}</text>')
    for p in points:  # a point above its roof: a ring, and the words on hover
        if p["S"] is not None and p["S"] > 1:
            e.append(f'<circle class="above-roof-ring" data-key="{escape(p["key"])}" data-series="{p["series"]}" '
                     f'cx="{X(p["intensity"]):.2f}" cy="{Y(p["flops_s"]):.2f}" r="9" fill="none" '
                     f'stroke="{ABOVE_ROOF_COLOUR}" stroke-width="1.5" stroke-dasharray="3 2"/>')
    for p in sorted(points, key=lambda p: p["series"] != "candidate"):  # production drawn last, on top
        x, y = X(p["intensity"]), Y(p["flops_s"])
        above = p["S"] is not None and p["S"] > 1
        tip = (f'{p["op"]}: {p["key"]}\n{p["series"]}{" (" + p["candidate"] + ")" if p.get("candidate") else ""}: '
               f'{_si(p["flops_s"], "FLOP/s")} at {p["intensity"]:.3g} FLOP/B, S {score(p["S"])}'
               f'{", rolled back" if p.get("rolled_back") else ""}'
               f'{"; above its roof (S > 1): " + ABOVE_ROOF_WORDS if above else ""}')
        attrs = (f'class="point {p["series"]}" data-key="{escape(p["key"])}" data-op="{escape(p["op"])}" '
                 f'data-series="{p["series"]}" data-intensity="{p["intensity"]!r}" data-flops-s="{p["flops_s"]!r}"'
                 + (' data-above-roof="1"' if above else ""))
        if p["series"] == "production":
            e.append(f'<circle {attrs} cx="{x:.2f}" cy="{y:.2f}" r="5" fill="{p["colour"]}" stroke="#ffffff" '
                     f'stroke-width="1"><title>{escape(tip)}</title></circle>')
        elif p.get("rolled_back"):
            e.append(f'<path {attrs} data-rolled-back="1" d="M{x - 5:.2f} {y - 5:.2f}L{x + 5:.2f} {y + 5:.2f}'
                     f'M{x - 5:.2f} {y + 5:.2f}L{x + 5:.2f} {y - 5:.2f}" stroke="{ROLLED_BACK}" stroke-width="2.5">'
                     f'<title>{escape(tip)}</title></path>')
        else:
            e.append(f'<path {attrs} d="M{x:.2f} {y - 6:.2f}L{x + 6:.2f} {y:.2f}L{x:.2f} {y + 6:.2f}L{x - 6:.2f} '
                     f'{y:.2f}Z" fill="#ffffff" stroke="{p["colour"]}" stroke-width="2"><title>{escape(tip)}</title>'
                     f'</path>')
    e.append("</svg>")
    return "\n".join(e), "; ".join(notes)


def chart_legend(ops: list, rep: dict) -> str:
    pts, _ = chart_points(rep, ops)
    shown = []
    for o in ops:
        c = next((p["colour"] for p in pts if p["op"] == o["name"]), None)
        if c:
            shown.append(f'<span class="sw" style="background:{c}"></span>{escape(o["name"])}')
    marks = ('<span class="mk">&#9679;</span> production (its median) &nbsp; '
             '<span class="mk">&#9671;</span> candidate (its median over verified calls) &nbsp; '
             f'<span class="mk" style="color:{ROLLED_BACK}">&#10005;</span> candidate, rolled back &nbsp; '
             f'<span class="mk" style="color:{ABOVE_ROOF_COLOUR}">&#9711;</span> above its roof (S &gt; 1): '
             f'{escape(ABOVE_ROOF_WORDS)} &nbsp; '
             'the heaviest keys are named beside their points, every point on hover &nbsp; '
             'solid lines: the profile&#8217;s roofs (memory bandwidth &#215; intensity, and each path&#8217;s peak); '
             'a key&#8217;s S is the factor by which it lies below its dtype&#8217;s roof at its intensity')
    return f'<p class="legend">{" &nbsp; ".join(shown)}</p><p class="legend">{marks}</p>'


# ---- tables -----------------------------------------------------------------------


def _phase_names(rep: dict) -> list:
    order = ["prefill", "decode", "unknown"]
    have = set(rep.get("totals", {}).get("phases", {}))
    return [p for p in order if p in have] + sorted(have - set(order))


def operators_table(rep: dict, ops: list) -> str:
    phases = _phase_names(rep)
    head = ("<tr><th rowspan=2>operator</th><th rowspan=2>mode</th><th rowspan=2>calls</th><th rowspan=2>timed</th>"
            "<th rowspan=2>weight</th><th rowspan=2>S</th><th rowspan=2>S candidate</th>"
            + "".join(f'<th colspan=2 class="ph">{escape(p)}</th>' for p in phases) + "</tr><tr>"
            + "<th>weight</th><th>S</th>" * len(phases) + "</tr>")
    rows = []
    for o in ops:
        roof = o.get("roofline", {})
        scored_in = {s.get("phase") for s in o.get("shapes", []) if (s.get("roofline") or {}).get("S") is not None}
        cells = [f'<td class="name">{escape(o["name"])}</td>', f'<td>{escape(o["mode"])}</td>',
                 f'<td class="n">{int(o["calls"])}</td>', f'<td class="n">{int(o.get("timed", 0))}</td>',
                 f'<td class="n">{_weight_bar(o["weight"]) if o.get("timed") else DASH}</td>',
                 f'<td class="n">{_s(roof["S"]) if roof.get("scored_shapes") else DASH}</td>',
                 f'<td class="n">{_s(roof.get("S_candidate")) if "coverage" in roof and roof["coverage"] else DASH}'
                 f'</td>']
        for p in phases:
            ph = o.get("phases", {}).get(p)
            cells.append(f'<td class="n">{_f(ph["weight"]) if ph and ph.get("est_device_time_ns") else DASH}</td>')
            cells.append(f'<td class="n">{_s(ph["S"]) if ph and p in scored_in else DASH}</td>')
        rows.append(f'<tr data-op="{escape(o["name"])}">{"".join(cells)}</tr>')
    tp = rep.get("totals", {}).get("phases", {})
    foot = ('<tr class="total"><td>S_agg</td><td></td><td></td><td></td><td></td>'
            f'<td class="n">{_s(rep.get("totals", {}).get("S_agg"))}</td>'
            # not S_agg_candidate: it counts 0 for every operator without a
            # candidate; the headline above the page compares the arms
            '<td></td>'
            + "".join(f'<td></td><td class="n">{_s(tp[p].get("S_agg"))}</td>' for p in phases) + "</tr>")
    return f'<table class="ops">{head}{"".join(rows)}{foot}</table>'


def _weight_bar(w: float) -> str:
    return (f'<span class="bar"><span style="width:{max(0.0, min(1.0, w)) * 100:.1f}%"></span></span>'
            f'{w:.3f}')


def shapes_table(ops: list) -> str:
    head = ("<tr><th>shape key</th><th>phase</th><th>mode</th><th>calls</th><th>timed</th><th>capt</th>"
            "<th>p50 us</th><th>p90 us</th><th>p99 us</th><th>weight</th><th>S</th><th>W/Q FLOP/B</th>"
            "<th>achieved</th></tr>")
    rows = []
    for o in ops:
        rows.append(f'<tr class="opgroup"><td colspan=13>{escape(o["name"])}</td></tr>')
        for s in sorted(o.get("shapes", []), key=lambda s: (-s.get("weight", 0), -s.get("calls", 0), s["key"])):
            lat, rf, timed = s["latency_ns"], s.get("roofline") or {}, bool(s.get("timed"))
            q = [_us(lat[k]) if timed else DASH for k in ("p50", "p90", "p99")]
            rows.append(
                f'<tr class="shape" data-key="{escape(s["key"])}"><td class="key">{_key_html(s["key"])}</td>'
                f'<td>{escape(s.get("phase", ""))}</td><td>{escape(s.get("mode", ""))}</td>'
                f'<td class="n">{int(s["calls"])}</td><td class="n">{int(s.get("timed", 0))}</td>'
                f'<td class="n">{int(s.get("captured", 0))}</td>'
                + "".join(f'<td class="n q">{v}</td>' for v in q)
                + f'<td class="n">{_f(s["weight"]) if timed else DASH}</td><td class="n">{_s(rf.get("S"))}</td>'
                f'<td class="n">{_f(rf.get("intensity"), ".3g")}</td>'
                f'<td class="n">{_si(rf.get("achieved_flops_s"), "FLOP/s")}</td></tr>')
    return f'<table class="shapes">{head}{"".join(rows)}</table>'


# ---- candidate routes: verdicts, timeline, evidence ----------------------------------------


def _ms(ms, t0) -> str:
    return f"+{(ms - t0) / 1000.0:.3f} s"


def timeline_svg(rep: dict, s: dict) -> str:
    """The route's modes over the report's time span: the mode before the last
    transition, the transition (by whom, why), the mode after; a rollback's
    evidence where it happened. Earlier transitions are counted, not timed,
    by the report."""
    ro = s.get("rollout") or {}
    t0, t1 = rep.get("started_unix_ms", 0), rep.get("generated_unix_ms", 0)
    last = ro.get("last_transition")
    ev = (s.get("shadow") or {}).get("rollback")
    w, left, right = 640, 10, 630
    span = max(t1 - t0, 1)

    def x(t):
        return left + (min(max(t, t0), t1) - t0) / span * (right - left)

    n = int(ro.get("transitions", 0))
    if last:
        # before the last transition: its "from" mode, since an earlier transition the report does not time
        before = last["from"] if n <= 1 else f"{n - 1} earlier, then {last['from']}"
        segs = [(t0, last["unix_ms"], last["from"], before), (last["unix_ms"], t1, last["to"], last["to"])]
    else:
        m = ro.get("mode", s.get("mode", "?"))
        segs = [(t0, t1, m, m)]
    e = [f'<svg class="timeline" width="{w}" height="58" viewBox="0 0 {w} 58" '
         f'font-family="system-ui, sans-serif" font-size="11">']
    for a, b, m, label in segs:
        e.append(f'<rect class="seg" data-mode="{escape(m)}" x="{x(a):.2f}" y="14" width="{max(x(b) - x(a), 1):.2f}" '
                 f'height="16" fill="{MODE_COLOURS.get(m, "#cccccc")}"><title>{escape(label)}</title></rect>')
        if x(b) - x(a) > 7 * len(label):
            e.append(f'<text x="{(x(a) + x(b)) / 2:.2f}" y="26" text-anchor="middle">{escape(label)}</text>')
    if last:
        xt = x(last["unix_ms"])
        e.append(f'<line x1="{xt:.2f}" y1="8" x2="{xt:.2f}" y2="36" stroke="#333333"/>')
        e.append(f'<text x="{min(xt, right - 150):.2f}" y="48">{escape(last["from"])} &#8594; '
                 f'{escape(last["to"])} by {escape(last["by"])} at {_ms(last["unix_ms"], t0)}</text>')
    if ev:
        xe = x(ev["unix_ms"])
        e.append(f'<path d="M{xe - 4:.2f} 4L{xe + 4:.2f} 12M{xe - 4:.2f} 12L{xe + 4:.2f} 4" stroke="{ROLLED_BACK}" '
                 f'stroke-width="2"><title>failing verification at {_ms(ev["unix_ms"], t0)}</title></path>')
    e.append(f'<text x="{left}" y="10">{_ms(t0, t0)}</text><text x="{right}" y="10" text-anchor="end">'
             f'{_ms(t1, t0)} (report)</text>')
    e.append("</svg>")
    return "".join(e)


def _dl(pairs) -> str:
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def evidence_html(ev: dict) -> str:
    fm = ev.get("first_mismatch") or {}
    pairs = [("reason", escape(str(ev.get("reason", "")))), ("output", escape(str(ev.get("output") or DASH))),
             ("failing shadow call", str(int(ev.get("shadow_call", 0))))]
    if ev.get("message"):
        pairs.append(("message", escape(ev["message"])))
    if "mismatches" in ev:
        pairs += [("shape", escape(str(ev.get("shape")))),
                  ("tolerance", f'atol {ev["atol"]:g}, rtol {ev["rtol"]:g}'),
                  ("mismatching elements", f'{int(ev["mismatches"])} of {int(ev["elements"])}'),
                  ("first mismatch", f'index <code class="idx">{escape(str(fm.get("index")))}</code> '
                                     f'(flat {int(fm["flat_index"])})' if fm else DASH),
                  ("max abs error", f'{ev["max_abs_err"]:.4g}'), ("max rel error", f'{ev["max_rel_err"]:.4g}'),
                  ("relative L2 error", f'{ev["rel_l2_err"]:.4g}'),
                  ("non-finite", f'production {int(ev.get("nonfinite_production", 0))}, candidate '
                                 f'{int(ev.get("nonfinite_candidate", 0))} ('
                                 f'{int(ev.get("nonfinite_where_production_finite", 0))} where production is finite)')]
    if ev.get("while_serving"):
        pairs.append(("while serving", f'{int(ev.get("served_before_verdict", 0))} calls served by the candidate '
                                       f'from the failing one until the verdict'))
    return _dl(pairs)


def candidate_summaries(ops: list) -> list:
    """Per operator with a candidate route, the candidate's figures over its
    routes (shape keys with a shadow): routes, verifications passed and
    failed, routes rolled back, the geometric mean of the routes' speedups
    (production p50 / candidate p50, over the routes that have one), the
    worst errors of its verifications (the passing ones' max abs and rel
    errors, and a rollback's failing one), and the candidates' headline S
    beside production's on the same keys (the report's
    roofline.candidate_routes)."""
    out = []
    for o in ops:
        shadows = [(s, s["shadow"]) for s in o.get("shapes", []) if s.get("shadow") is not None]
        if not shadows:
            continue
        speedups = [sh["speedup"] for _, sh in shadows if sh.get("speedup")]
        abs_errs = [sh.get("max_abs_err") or 0.0 for _, sh in shadows]
        rel_errs = [sh.get("max_rel_err") or 0.0 for _, sh in shadows]
        for _, sh in shadows:
            ev = sh.get("rollback") or {}
            if "max_abs_err" in ev:
                abs_errs.append(ev["max_abs_err"])
                rel_errs.append(ev["max_rel_err"])
        cand = o.get("candidate") or {}
        cr = (o.get("roofline") or {}).get("candidate_routes") or {}
        out.append({"operator": o["name"], "candidate": cand.get("name", "?"), "kind": cand.get("kind", "?"),
                    "routes": len(shadows),
                    "verified": sum(int(sh["verified"]) for _, sh in shadows),
                    "passed": sum(int(sh["passed"]) for _, sh in shadows),
                    "failed": sum(int(sh["failed"]) for _, sh in shadows),
                    "rolled_back": sum(1 for s, sh in shadows if sh.get("rollback") or s.get("mode") == "rolled_back"),
                    "speedup_routes": len(speedups),
                    "speedup_geomean": math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None,
                    "worst_abs_err": max(abs_errs), "worst_rel_err": max(rel_errs),
                    "S_candidate": cr.get("S_candidate"), "S_production": cr.get("S_production"),
                    "scored_routes": int(cr.get("routes") or 0), "device_share": cr.get("device_share")})
    return out


SUMMARY_LEGEND = (
    ("routes", "shape keys where the candidate ran beside production"),
    ("pass / fail", "verifications (outputs compared) that passed and failed, over its routes"),
    ("rolled back", "routes rolled back to production"),
    ("speedup (geomean)", "geometric mean over its routes of production's median latency / the candidate's"),
    ("worst abs / rel error", "the largest max abs and max rel error of its verifications: the passing ones, "
                              "and the failing one of each rollback"),
    ("S candidate / S production", "S over the candidate's scored shape keys, and production's S over the same "
                                   "keys, each weighted by the keys' device time"),
    ("time share", "those keys' share of the estimated device time"),
)


def summary_html(ops: list) -> str:
    """The per-candidate summary table."""
    rows = []
    for c in candidate_summaries(ops):
        cells = [("candidate", f'{escape(c["candidate"])} <span class="kind">({escape(c["kind"])})</span>'),
                 ("operator", escape(c["operator"])), ("routes", str(c["routes"])), ("passed", str(c["passed"])),
                 ("failed", str(c["failed"])), ("rolled_back", str(c["rolled_back"])),
                 ("speedup_geomean", f'{c["speedup_geomean"]:.3f}x' if c["speedup_geomean"] is not None else DASH),
                 ("worst_abs_err", f'{c["worst_abs_err"]:.3g}'), ("worst_rel_err", f'{c["worst_rel_err"]:.3g}'),
                 ("S_candidate", _s(c["S_candidate"])), ("S_production", _s(c["S_production"])),
                 ("device_share", f'{100 * c["device_share"]:.1f} %' if c["scored_routes"] else DASH)]
        rows.append(f'<tr class="candidate" data-candidate="{escape(c["candidate"])}" '
                    f'data-op="{escape(c["operator"])}">'
                    + "".join(f'<td class="{"name" if k in ("candidate", "operator") else "n"}" data-field="{k}">{v}'
                              f'</td>' for k, v in cells) + "</tr>")
    if not rows:
        return ""
    head = ("<tr><th>candidate</th><th>operator</th><th>routes</th><th>pass</th><th>fail</th><th>rolled back</th>"
            "<th>speedup (geomean)</th><th>worst abs error</th><th>worst rel error</th><th>S candidate</th>"
            "<th>S production</th><th>time share</th></tr>")
    return f'<table class="candidates">{head}{"".join(rows)}</table>' + _legend_html(SUMMARY_LEGEND)


def routes_html(rep: dict, ops: list) -> str:
    """Each candidate route's card, folded by candidate (a candidate with a
    rollback unfolded: its evidence is what a kernel author needs first)."""
    out = []
    summaries = {c["operator"]: c for c in candidate_summaries(ops)}
    for o in ops:
        cand = o.get("candidate") or {}
        c = summaries.get(o["name"])
        if c is None:
            continue
        out.append(f'<details class="candidate" data-candidate="{escape(c["candidate"])}" '
                   f'data-op="{escape(o["name"])}"{" open" if c["rolled_back"] else ""}><summary>'
                   f'{escape(c["candidate"])} for {escape(o["name"])}: {c["routes"]} route'
                   f'{"s" if c["routes"] > 1 else ""}, {c["passed"]} verifications passed, {c["failed"]} failed'
                   + (f', {c["rolled_back"]} rolled back' if c["rolled_back"] else "") + "</summary>")
        for s in o.get("shapes", []):
            sh = s.get("shadow")
            if sh is None:
                continue
            ro = s.get("rollout") or {}
            ev = sh.get("rollback")
            sv = ro.get("served", {})
            pr = ro.get("promotion")
            verdict = ("rolled back" if ev else f'{int(sh["passed"])} of {int(sh["verified"])} verifications passed')
            facts = [("candidate", f'{escape(cand.get("name", "?"))} ({escape(cand.get("kind", "?"))}'
                                   + (f', sha256 <code>{escape(cand["sha256"][:16])}&#8230;</code>'
                                      if cand.get("sha256") else "") + ")"),
                     ("mode", escape(s.get("mode", "?")) + (f' (canary share {ro["canary"]:g})'
                                                           if ro.get("canary") else "")),
                     ("shadowed calls", f'{int(sh["calls"])}: verified {int(sh["verified"])} '
                                        f'(pass {int(sh["passed"])}, fail {int(sh["failed"])}), '
                                        f'skipped {int(sh["skipped"])}, unverifiable {int(sh.get("unverifiable", 0))}'),
                     ("error over passing verifications", f'max abs {sh.get("max_abs_err", 0):.3g}, max rel '
                                                          f'{sh.get("max_rel_err", 0):.3g}'),
                     ("speedup", f'{sh["speedup"]:.2f}x (production p50 / candidate p50)' if sh.get("speedup")
                      else DASH)]
            aa = sh.get("aa") or {}
            if aa.get("runs"):
                facts.append(("production against itself", f'{int(aa["runs"])} runs, {int(aa["mismatching"])} '
                                                           f'mismatching, max abs {aa["max_abs_err"]:.3g}'))
            if sv:
                facts.append(("served", f'candidate {int(sv.get("candidate", 0))} '
                                        f'({int(sv.get("candidate_verified", 0))} verified), production '
                                        f'{int(sv.get("production", 0))}'))
            if ro:
                last = ro.get("last_transition")
                tr = f'{int(ro.get("transitions", 0))}'
                if last:
                    tr += (f'; last {escape(last["from"])} &#8594; {escape(last["to"])} by {escape(last["by"])}'
                           + (f' ({escape(last["reason"])})' if last.get("reason") else ""))
                    if ro.get("transitions", 0) > 1:
                        tr += f'; the {int(ro["transitions"]) - 1} before it are counted, not timed, by the report'
                facts.append(("transitions", tr))
            if pr:
                aa = pr.get("aa_spread") or {}
                facts.append(("promotion", f'{escape(pr["state"])}: {int(pr.get("passes_in_stage", 0))} of '
                                           f'{int(pr.get("needed", 0))} passes in the stage, min speedup '
                                           f'{pr.get("min_speedup", 0):g}, delta {pr.get("delta_used", 0):.3g}'
                                           + (f' (A/A spread {aa["median"]:.3g} of {int(aa.get("checks", 0))} '
                                              f'pairs)' if aa.get("median") is not None else "")
                                           + (f' ({escape(pr["note"])})' if pr.get("note") else "")))
            cls = "route rolled-back" if ev else "route"
            out.append(f'<section class="{cls}" data-key="{escape(s["key"])}"><h3><code class="key">'
                       f'{_key_html(s["key"])}</code> <span class="verdict">{verdict}</span></h3>'
                       f'{timeline_svg(rep, s) if ro else ""}{_dl(facts)}')
            if ev:
                out.append(f'<h4>rollback evidence: {escape(rollback_line(ev))}</h4>{evidence_html(ev)}')
            out.append("</section>")
        out.append("</details>")
    return "\n".join(out) or "<p>No route ran a candidate.</p>"


def _legend_html(rows) -> str:
    return "<dl class=\"legend\">" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in rows) + "</dl>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 14px; margin: 6px 0; } h4 { font-size: 13px; margin: 8px 0 4px; color: #b22; }
p.meta { color: #555; margin: 0 0 8px; } .figures span { margin-right: 18px; }
table { border-collapse: collapse; font-size: 13px; } th, td { padding: 3px 8px; border-bottom: 1px solid #eee; }
th { background: #f4f4f4; text-align: left; white-space: nowrap; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.key, code.key { font-family: ui-monospace, monospace; font-size: 12px; overflow-wrap: anywhere; }
tr.opgroup td { font-weight: 600; background: #fafafa; padding-top: 8px; } tr.total td { font-weight: 600; }
tr.shape:hover td, tr.shape.hl td { background: #fff6d5; }
.bar { display: inline-block; width: 60px; height: 8px; background: #eee; margin-right: 6px; }
.bar span { display: block; height: 8px; background: #1f77b4; }
.legend { font-size: 12px; color: #444; } .sw { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; font-size: 13px; margin: 6px 0; }
dt { color: #555; } dd { margin: 0; } dl.legend { font-size: 12px; }
section.route { border: 1px solid #ddd; border-left: 4px solid #74c476; padding: 6px 12px; margin: 10px 0; }
section.route.rolled-back { border-left-color: #d62728; } .verdict { font-weight: 400; color: #555; }
p.empty { color: #a60; } details summary { cursor: pointer; color: #555; font-size: 13px; }
.above-roof { color: #e6550d; font-weight: 600; } p.headline { margin: 4px 0; }
details.candidate { margin: 8px 0; } details.candidate > summary { font-size: 14px; color: #222; }
span.kind { color: #777; } table.candidates th { white-space: normal; }
table.candidates td[data-field="candidate"] { overflow-wrap: anywhere; }
"""


def headline_html(rep: dict) -> str:
    """The candidates against production where both ran (the report's
    totals.candidate_routes), or nothing when no operator has a candidate."""
    c = rep.get("totals", {}).get("candidate_routes")
    if not c:
        return ""
    if not c.get("routes"):
        return '<p class="headline">candidates: no shape key with a verified, scored candidate yet</p>'
    return (f'<p class="headline">candidates on their own routes: S <b data-field="S_candidate">'
            f'{_s(c["S_candidate"])}</b> against production&#8217;s <b data-field="S_production">'
            f'{_s(c["S_production"])}</b> on the same {int(c["routes"])} shape key{"s" if c["routes"] > 1 else ""} '
            f'({100 * c["device_share"]:.1f} % of the device time)</p>')


def above_roof_html(rep: dict) -> str:
    """The report's above-roof flag as a line of its own, or nothing."""
    line = above_roof_line(rep)
    if not line:
        return ""
    return (f'<p class="above-roof-flag" data-count="{int(rep["totals"]["above_roof"])}">'
            f'<span class="above-roof">{escape(line)}</span></p>')


def render(rep: dict, *, all_operators: bool = False, title: str = None) -> str:
    """The page for a report (a dict as the library writes it)."""
    if rep.get("schema") != "understudy.report":
        raise HtmlError("not an understudy report (schema is not understudy.report)")
    ops = _ops(rep, all_operators)
    hidden = [] if all_operators else hidden_operators(rep)
    tot = rep.get("totals", {})
    if title is None and rep.get("merged_from"):
        title = f"understudy report: {int(rep['merged_from'])} reports of {', '.join(rep.get('hosts', [])) or '?'}"
    title = title or f"understudy report: {rep.get('host', '?')} pid {rep.get('pid', '?')}"
    chart, chart_note = roofline_svg(rep, ops)
    span_s = (rep.get("generated_unix_ms", 0) - rep.get("started_unix_ms", 0)) / 1000.0
    figures = [("calls", int(tot.get("calls", 0))), ("timed", int(tot.get("timed", 0))),
               ("captured", int(tot.get("captured", 0))), ("shape keys", int(tot.get("routes", 0))),
               ("device time", f'{tot.get("est_device_time_ns", 0) / 1e6:.3f} ms'),
               ("S_agg", score(tot.get("S_agg"))),
               ("verified", int(tot.get("verified", 0))), ("failed", int(tot.get("failed", 0))),
               ("rollbacks", int(tot.get("rollbacks", 0))), ("internal errors", int(tot.get("internal_errors", 0)))]
    hw = ", ".join(escape(h["name"]) for h in rep.get("hardware", [])) or "none"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">schema {escape(str(rep.get("schema")))} v{escape(str(rep.get("version")))}, library '
        f'{escape(str(rep.get("library_version")))}, torch {escape(str(rep.get("torch_version")))}, '
        f'{span_s:.1f} s of traffic'
        + (f', merged from {int(rep["merged_from"])} reports' if rep.get("merged_from") else "")
        + f'; hardware profiles: {hw}</p>',
        '<p class="figures">' + "".join(f"<span>{escape(k)} <b>{escape(str(v))}</b></span>" for k, v in figures)
        + "</p>", headline_html(rep), above_roof_html(rep),
        "<h2>Roofline</h2>", chart, chart_legend(ops, rep) if "<svg" in chart else "",
        f'<p class="legend">{escape(chart_note)}</p>' if chart_note else "",
        "<h2>Operators: weight and S, per phase</h2>", operators_table(rep, ops),
        '<p class="legend">weight: share of the estimated device time (of the phase, in a phase&#8217;s column); '
        "S: the median over the operator&#8217;s scored shape keys of T_SOL / median time; S_agg = &#931; weight "
        "&#183; S; - : not timed or not scored.</p>",
    ]
    if hidden:
        parts.append(f'<details class="hidden-ops"><summary>{len(hidden)} operators without calls not shown '
                     f'(understudy html --all shows them)</summary><p>{escape(", ".join(hidden))}</p></details>')
    parts += ["<h2>Candidates: verdicts and rollouts</h2>", summary_html(ops), routes_html(rep, ops),
              _legend_html(VERDICT_LEGEND)]
    parts += ["<h2>Shape keys</h2>", shapes_table(ops), _legend_html(REPORT_LEGEND + (
        ("W/Q", "arithmetic intensity: FLOPs per byte moved, as the operator's definition counts them"),
        ("achieved", "mean W over the median time")))]
    parts.append("</body></html>")
    return "\n".join(parts)


def main(report_path: str, out_path: str, *, all_operators: bool = False) -> int:
    try:
        with open(report_path) as f:
            rep = json.load(f)
        page = render(rep, all_operators=all_operators)
    except (OSError, ValueError) as e:
        print(f"understudy: html: cannot make a page of '{report_path}': {e}", file=sys.stderr)
        return 2
    d = os.path.dirname(os.path.abspath(out_path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".html-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # a page to share, not mkstemp's 0600
        os.replace(tmp, out_path)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        print(f"understudy: html: cannot write '{out_path}': {e}", file=sys.stderr)
        return 2
    pts, _ = chart_points(rep, _ops(rep, all_operators))
    print(f"wrote {out_path}: {sum(1 for p in pts if p['series'] == 'production')} shape keys on the roofline, "
          f"{sum(1 for o in rep.get('operators', []) for s in o.get('shapes', []) if 'shadow' in s)} candidate routes")
    return 0
