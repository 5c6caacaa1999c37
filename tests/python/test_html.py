"""The report for people: the roofline figures it draws, the HTML page
(rendered by headless Chromium) and the text tables.

Ground truth: W and Q evaluated here from the operator definitions' own
text (conftest's evaluator) over the arguments the tests hand in, the
hardware profile the tests write, and the report's own figures where the
page is checked against the report it was made from."""
import json
import math
import os
import pathlib
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import zlib
from html.parser import HTMLParser

import pytest
import torch

from conftest import _dim, _expr, ROOT, need
from test_shadow import _import_example, candidate_op, native, routes, rms_inputs, run_rms_norm

PROFILE = {"schema_version": 1, "name": "test ceilings", "match": ["no such device"],
           "p_peak": {"fp32": 2e12, "bf16": 8e12}, "b_peak": 5e10, "source": "a test's made-up figures"}


def work_of(definition, op, args):
    """(W, Q) of one call, from problems/<definition>.json's text for op."""
    d = json.loads((ROOT / "problems" / f"{definition}.json").read_text())
    (rl,) = [b["roofline"] for b in d["bindings"] if b["op"] == op]
    env = {k: _dim(v, args) for k, v in rl["vars"].items()}
    return _expr(rl["W"], env), _expr(rl["Q_read"], env) + _expr(rl["Q_write"], env)


@pytest.fixture
def hw_dir(tmp_path):
    d = tmp_path / "hardware"
    d.mkdir()
    (d / "test.json").write_text(json.dumps(PROFILE))
    return d


def test_report_carries_w_q_intensity_and_achieved_rate(us, hw_dir):
    """Per shape key the report sums W and Q over the calls whose floor it
    evaluated; M=7 and M=8 share the pow2 bucket M=8, so the sums are of two
    different calls. intensity = W/Q, achieved = mean W / median time, and
    (one W path, one profile) achieved / roof(intensity) = S."""
    inputs = rms_inputs(shapes=((7, 128), (8, 128), (64, 256)))
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}},
               "hardware": {"dir": str(hw_dir), "profile": PROFILE["name"]}})
    run_rms_norm(inputs, repeat=3)
    rep = us.report()
    us.disable()
    want = {}
    for x, w in inputs:
        m = 1 << (x.shape[0] - 1).bit_length()
        wq = work_of("rms_norm", "_C::rms_norm", {"out": x, "input": x, "weight": w, "eps": 1e-6})
        acc = want.setdefault((m, x.shape[1]), [0, 0.0, 0.0])
        acc[0] += 3
        acc[1] += 3 * wq[0]
        acc[2] += 3 * wq[1]
    got = {(r["dims"]["M"], r["dims"]["N"]): r for r in routes(rep, "_C::rms_norm")}
    assert set(got) == set(want) == {(8, 128), (64, 256)}
    assert rep["hardware"] == [{k: PROFILE[k] for k in ("name", "p_peak", "b_peak", "source")}]
    for k, (n, flops, nbytes) in want.items():
        rf, p50 = got[k]["roofline"], got[k]["latency_ns"]["p50"]
        assert (rf["work_calls"], rf["flops_sum"], rf["bytes_sum"]) == (n, flops, nbytes), k
        assert rf["intensity"] == pytest.approx(flops / nbytes, rel=1e-12)
        assert rf["achieved_flops_s"] == pytest.approx(flops / n / p50 * 1e9, rel=1e-12)
        roof = min(PROFILE["p_peak"]["fp32"], rf["intensity"] * PROFILE["b_peak"])
        assert rf["achieved_flops_s"] / roof == pytest.approx(rf["S"], rel=1e-9), k
    assert got[(8, 128)]["roofline"]["flops_sum"] == 3 * (3 * 7 * 128 + 7) + 3 * (3 * 8 * 128 + 8)


# ---- a report with every kind of row ----------------------------------------------------

SDPA_SHAPES = ((2, 4, 16, 32), (2, 4, 48, 32))  # keys alike in their first 60 characters


def _workload():
    torch.manual_seed(0)
    run_rms_norm(rms_inputs(shapes=((8, 128), (64, 256), (3, 5, 64))), repeat=3)
    for n, k, m in ((16, 64, 32), (128, 256, 64)):
        a, b = torch.randn(n, k), torch.randn(k, m)
        for _ in range(3):
            torch.mm(a, b)
    for shape in SDPA_SHAPES:
        q = torch.randn(*shape)
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    for _ in range(3):
        torch.topk(torch.randn(4, 1000), 10)
    torch.nn.functional.silu(torch.randn(6, 100))


@pytest.fixture
def report_file(us, hw_dir, tmp_path):
    """A real report: rms_norm shadowed by the native candidate (passes), silu
    by a candidate wrong in its last element (rolled back), gemm and SDPA
    observed with every call timed, topk with none timed, two operators that
    see no call; scored against the test's profile."""
    wrong_silu = _import_example("wrong_silu")
    wrong = candidate_op(wrong_silu.WRONG_TAIL_NAME, wrong_silu.silu_wrong_tail, wrong_silu.TARGET)
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": wrong, "target": "aten::silu"}},
                             "gemm": {"sample": 1.0}, "sdpa": {"sample": 1.0}, "topk": {"sample": 0.0},
                             "layer_norm": "observe", "fused_moe": "observe"},
               "hardware": {"dir": str(hw_dir), "profile": PROFILE["name"]}})
    _workload()
    rep = us.report()
    us.disable()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(rep))
    return path



def _cli(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    return subprocess.run([sys.executable, "-m", "understudy", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _all_shapes(rep):
    return [(o, s) for o in rep["operators"] for s in o["shapes"]]


# ---- text tables --------------------------------------------------------------------------


def test_text_tables_hide_idle_operators_print_whole_keys_dashes_and_a_legend(report_file):
    rep = json.loads(report_file.read_text())
    out = _cli("report", report_file)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    idle = {o["name"] for o in rep["operators"] if o["calls"] == 0}
    assert idle == {"layer_norm", "fused_moe"}
    names = {ln.split()[0] for ln in lines if ln and not ln.startswith(" ") and len(ln.split()) > 3}
    assert not idle & names
    assert "2 operators without calls not shown (--all shows them)" in lines
    rows = {}
    for ln in lines:
        if ln.startswith("  ") and "|" in ln:
            key, *cells = ln.split()
            rows[key] = cells
    keys = [s["key"] for _, s in _all_shapes(rep)]
    assert set(rows) == set(keys)  # every key whole: the two SDPA keys alike in 60 characters are two rows
    sdpa = [k for k in keys if "scaled_dot_product" in k]
    assert len(sdpa) == 2 and sdpa[0][:60] == sdpa[1][:60]
    for o, s in _all_shapes(rep):
        calls, capt, p50, p90, p99, weight, s_ = rows[s["key"]]
        assert (int(calls), int(capt)) == (s["calls"], s["captured"]), s["key"]
        if s["timed"] == 0:
            assert (p50, p90, p99, weight) == ("-",) * 4, s["key"]
        else:
            lat = s["latency_ns"]
            assert (p50, p90, p99) == tuple(f"{lat[q] / 1000:.1f}" for q in ("p50", "p90", "p99")), s["key"]
            assert weight == f"{s['weight']:.3f}"
        assert s_ == ("-" if s["roofline"]["S"] is None else f"{s['roofline']['S']:.3f}"), s["key"]
    assert any(s["timed"] == 0 for _, s in _all_shapes(rep))
    # the legend names every column of both tables
    legend = out.stdout[out.stdout.index("legend:"):]
    for col in ("mode", "calls", "capt", "p50/p90/p99 us", "weight", "S", "-", "verif", "skip", "speedup"):
        assert any(ln.split()[:len(col.split())] == col.split() for ln in legend.splitlines()[1:]), col
    # the verdicts: whole key and candidate, and the rollback's first mismatch
    (silu,) = routes(rep, "aten::silu")
    ev = silu["shadow"]["rollback"]
    assert any(ln.startswith(silu["key"] + " ") and "understudy_examples::silu_wrong_tail" in ln for ln in lines)
    assert f"first at {ev['first_mismatch']['index']}" in out.stdout
    everything = _cli("report", report_file, "--all")
    assert everything.returncode == 0
    assert {ln.split()[0] for ln in everything.stdout.splitlines() if ln and not ln.startswith(" ")} >= idle
    assert "not shown" not in everything.stdout


# ---- the page in a browser ----------------------------------------------------------------

CHROMIUM_FLAGS = ("--headless", "--disable-gpu", "--no-first-run", "--hide-scrollbars", "--force-device-scale-factor=1",
                  "--force-color-profile=srgb", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps")


def chromium(tmp_path, *args, timeout=120):
    """Headless Chromium (the Debian package, installed by ./run.sh test) on
    args; its stdout. The sanitizer runtime the ASan test run preloads is
    kept out of its environment."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    need(exe is not None, "chromium is not installed: ./run.sh test installs it (apt-get install chromium)")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    profile = tempfile.mkdtemp(dir=tmp_path, prefix="chromium-")
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], []

    def classes(self):
        return set((self.attrs.get("class") or "").split())

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, tag=None, cls=None):
        return [n for n in self.walk() if (tag is None or n.tag == tag) and (cls is None or cls in n.classes())]

    def all_text(self):
        return "".join(t if isinstance(t, str) else t.all_text() for t in self.text)


VOID = {"meta", "link", "br", "wbr", "img", "input", "hr", "col", "area", "base", "source"}


class Tree(HTMLParser):
    """The DOM Chromium dumped, as a tree of Nodes."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#root", {}, None)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        self.cur.text.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        self.cur.text.append(n)

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text.append(data)


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA PNG, decoded here."""
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, hdr
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


# The test's own probe, added to a copy of the page: where the browser laid
# out each chart mark and axis tick (CSS pixels of the viewport).
PROBE = """<script>
for (const el of document.querySelectorAll('#roofline .point, #roofline .tick line, #roofline')) {
  const r = el.getBoundingClientRect();
  el.setAttribute('data-page-x', r.left + r.width / 2);
  el.setAttribute('data-page-y', r.top + r.height / 2);
}
</script>"""


def _axis(ticks, coord):
    """{decade: pixel} of an axis from its rendered ticks, checked evenly spaced (a log axis)."""
    at = sorted((int(t.attrs["data-log10"]), float(t.find("line")[0].attrs[coord])) for t in ticks)
    assert len(at) >= 3
    step = (at[-1][1] - at[0][1]) / (at[-1][0] - at[0][0])
    for k, px in at:
        assert px == pytest.approx(at[0][1] + (k - at[0][0]) * step, abs=0.5), (k, px)
    return at[0][0], at[0][1], step


def _log_at(axis, px):
    k0, px0, step = axis
    return k0 + (px - px0) / step


def test_html_page_renders_in_chromium_with_the_report_figures(report_file, tmp_path):
    rep = json.loads(report_file.read_text())
    page = tmp_path / "report.html"
    out = _cli("html", report_file, "-o", page)
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    dom = Tree(chromium(tmp_path, "--window-size=1280,1400", "--dump-dom", probed.as_uri())).root
    (svg,) = [n for n in dom.find("svg") if n.attrs.get("id") == "roofline"]
    assert "data-page-x" in svg.attrs, "the probe did not run: the page did not load"
    xaxis = _axis(svg.find("g", "x"), "data-page-x")
    yaxis = _axis(svg.find("g", "y"), "data-page-y")
    assert xaxis[2] > 0 > yaxis[2]  # intensity grows rightwards, FLOP/s upwards

    # one point per shape key with a timed call and a floor, production and
    # candidate, where the report's sums put it: intensity = W/Q, achieved =
    # mean W / median time (the candidate's median for its point)
    want = {}
    for o, s in _all_shapes(rep):
        rf = s["roofline"]
        if not rf["work_calls"] or not s["timed"]:
            continue
        w_mean = rf["flops_sum"] / rf["work_calls"]
        want[(s["key"], "production")] = (rf["flops_sum"] / rf["bytes_sum"], w_mean / s["latency_ns"]["p50"] * 1e9)
        cand = s.get("shadow", {}).get("candidate_latency_ns", {})
        if cand.get("count"):
            want[(s["key"], "candidate")] = (rf["flops_sum"] / rf["bytes_sum"], w_mean / cand["p50"] * 1e9)
    points = svg.find(cls="point")
    got = {(p.attrs["data-key"], p.attrs["data-series"]): p for p in points}
    assert len(got) == len(points) and set(got) == set(want)
    assert {k for k, _ in want} == {s["key"] for _, s in _all_shapes(rep) if s["timed"]}  # every timed key scored
    assert sum(1 for _, series in want if series == "candidate") == 4  # rms_norm's three keys and silu's
    px_per_decade = (xaxis[2], -yaxis[2])
    for k, (intensity, rate) in want.items():
        p = got[k]
        assert _log_at(xaxis, float(p.attrs["data-page-x"])) == pytest.approx(
            math.log10(intensity), abs=1 / px_per_decade[0]), k
        assert _log_at(yaxis, float(p.attrs["data-page-y"])) == pytest.approx(
            math.log10(rate), abs=1 / px_per_decade[1]), k
    (silu,) = routes(rep, "aten::silu")
    assert got[(silu["key"], "candidate")].attrs.get("data-rolled-back") == "1"
    assert "1 shape key without a timed call" in dom.all_text()  # topk's, named under the chart

    # the ceilings are the profile's: memory roof through (1, b_peak), compute roofs at p_peak
    ceilings = svg.find("g", "ceiling")
    assert [c.attrs["data-profile"] for c in ceilings] == [PROFILE["name"]]
    (bw,) = ceilings[0].find("line", "bandwidth")
    assert float(bw.attrs["data-bytes-s"]) == PROFILE["b_peak"]
    assert {c.attrs["data-path"]: float(c.attrs["data-flops-s"]) for c in ceilings[0].find("line", "compute")} \
        == PROFILE["p_peak"]

    # drawn: in a screenshot, each production point that no other mark
    # covers has its operator's colour where the browser laid it out
    shot = tmp_path / "shot.png"
    chromium(tmp_path, "--window-size=1280,1400", f"--screenshot={shot}", probed.as_uri())
    w, h, px = png_pixels(shot)
    assert (w, h) == (1280, 1400)
    centres = [(float(p.attrs["data-page-x"]), float(p.attrs["data-page-y"]), p) for p in points]
    checked = 0
    for x, y, p in centres:
        if p.tag != "circle" or any(q is not p and math.hypot(x - qx, y - qy) < 9 for qx, qy, q in centres):
            continue
        fill = p.attrs["fill"]
        rgb = tuple(int(fill[i:i + 2], 16) for i in (1, 3, 5))
        assert all(abs(a - b) <= 3 for a, b in zip(px[round(y - 0.5)][round(x - 0.5)], rgb)), (p.attrs["data-key"], rgb)
        checked += 1
    assert checked >= 3
    bg = px[5][1275]
    assert bg == (255, 255, 255)

    # tables: idle operators only named, keys whole, untimed latency as -, a legend
    names = {tr.attrs["data-op"] for tr in dom.find("tr") if "data-op" in tr.attrs}
    assert names == {o["name"] for o in rep["operators"] if o["calls"]}
    (hidden,) = dom.find("details", "hidden-ops")
    assert set(hidden.find("p")[0].all_text().split(", ")) == {"layer_norm", "fused_moe"}
    rows = {tr.attrs["data-key"]: tr for tr in dom.find("tr", "shape")}
    assert set(rows) == {s["key"] for _, s in _all_shapes(rep)}
    for o, s in _all_shapes(rep):
        tr = rows[s["key"]]
        assert tr.find("td", "key")[0].all_text() == s["key"]
        q = [td.all_text() for td in tr.find("td", "q")]
        lat = s["latency_ns"]
        assert q == (["-"] * 3 if not s["timed"] else [f"{lat[k] / 1000:.1f}" for k in ("p50", "p90", "p99")])
    legend = " ".join(dl.all_text() for dl in dom.find("dl", "legend"))
    for term in ("p50/p90/p99 us", "weight", "W/Q", "achieved", "verif", "speedup"):
        assert term in legend

    # the rolled-back route: its timeline and its evidence
    ev = silu["shadow"]["rollback"]
    (sec,) = [n for n in dom.find("section", "route") if n.attrs["data-key"] == silu["key"]]
    assert "rolled-back" in sec.classes()
    assert [r.attrs["data-mode"] for r in sec.find("rect", "seg")] == ["shadow", "rolled_back"]
    body = sec.all_text()
    assert f"index {ev['first_mismatch']['index']} (flat {ev['first_mismatch']['flat_index']})" in body
    for k in ("max_abs_err", "max_rel_err", "rel_l2_err"):
        assert f"{ev[k]:.4g}" in body
    assert f"{int(ev['mismatches'])} of {int(ev['elements'])}" in body

    # as Chromium reads the page: a summary row per candidate, every point
    # titled with its operator and key (shown on hover), the heaviest named
    assert {tr.attrs["data-op"] for tr in dom.find("tr", "candidate")} == {"rms_norm", "silu"}
    for p in points:
        assert p.find("title")[0].all_text().startswith(f'{p.attrs["data-op"]}: {p.attrs["data-key"]}')
    assert svg.find("text", "label")


def test_candidate_summary_folded_cards_and_named_points(report_file):
    """The page's per-candidate summary holds figures computed here from the
    report: routes, verifications passed and failed, routes rolled back, the
    geometric mean of the routes' speedups, the worst errors (the passing
    verifications' max abs and rel, and a rollback's failing one) and the
    candidate's S against production's on the same keys, weighted by the
    keys' device time. Each candidate's route cards are folded under it
    (unfolded where it was rolled back); the heaviest points are named by
    their operator beside them, and every point names its operator and key
    on hover (its SVG title)."""
    from understudy.html import LABELS_AT_MOST, render

    rep = json.loads(report_file.read_text())
    dom = Tree(render(rep)).root
    rows = {tr.attrs["data-op"]: {td.attrs["data-field"]: td.all_text() for td in tr.find("td")}
            for tr in dom.find("tr", "candidate")}
    want = {}
    for o in rep["operators"]:
        keys = [s for s in o["shapes"] if "shadow" in s]
        if not keys:
            continue
        sp = [s["shadow"]["speedup"] for s in keys if s["shadow"]["speedup"]]
        errs = [(s["shadow"]["max_abs_err"], s["shadow"]["max_rel_err"]) for s in keys]
        errs += [(s["shadow"]["rollback"]["max_abs_err"], s["shadow"]["rollback"]["max_rel_err"])
                 for s in keys if (s["shadow"].get("rollback") or {}).get("max_abs_err") is not None]
        scored = [s for s in keys if s["roofline"]["S"] is not None and s["roofline"]["S_candidate"] is not None]
        t = sum(s["est_device_time_ns"] for s in scored)
        want[o["name"]] = {
            "candidate": f'{o["candidate"]["name"]} ({o["candidate"]["kind"]})', "operator": o["name"],
            "routes": str(len(keys)), "passed": str(sum(s["shadow"]["passed"] for s in keys)),
            "failed": str(sum(s["shadow"]["failed"] for s in keys)),
            "rolled_back": str(sum(s["mode"] == "rolled_back" for s in keys)),
            "speedup_geomean": f"{statistics.geometric_mean(sp):.3f}x" if sp else "-",
            "worst_abs_err": f"{max(e[0] for e in errs):.3g}", "worst_rel_err": f"{max(e[1] for e in errs):.3g}",
            "S_candidate": f"{sum(s['est_device_time_ns'] * s['roofline']['S_candidate'] for s in scored) / t:.3f}"
            if t else "-",
            "S_production": f"{sum(s['est_device_time_ns'] * s['roofline']['S'] for s in scored) / t:.3f}"
            if t else "-",
            "device_share": f"{100 * t / rep['totals']['est_device_time_ns']:.1f} %" if scored else "-"}
    assert set(want) == {"rms_norm", "silu"}
    assert rows == want
    assert rows["rms_norm"]["passed"] == "9" and rows["silu"]["rolled_back"] == "1"
    assert float(rows["silu"]["worst_abs_err"]) > 0  # the wrong tail's error, from the rollback's evidence

    folds = {d.attrs["data-op"]: d for d in dom.find("details", "candidate")}
    assert set(folds) == set(want)
    for name, d in folds.items():
        (o,) = [o for o in rep["operators"] if o["name"] == name]
        assert {sec.attrs["data-key"] for sec in d.find("section", "route")} == \
            {s["key"] for s in o["shapes"] if "shadow" in s}
        assert ("open" in d.attrs) == (rows[name]["rolled_back"] != "0")
    assert len(dom.find("section", "route")) == sum(int(r["routes"]) for r in rows.values())

    (svg,) = [n for n in dom.find("svg") if n.attrs.get("id") == "roofline"]
    points = {(p.attrs["data-key"], p.attrs["data-series"]): p for p in svg.find(cls="point")}
    for (key, _), p in points.items():
        assert p.find("title")[0].all_text().startswith(f'{p.attrs["data-op"]}: {key}\n')
    labels = svg.find("text", "label")
    assert 0 < len(labels) <= LABELS_AT_MOST
    for lb in labels:
        assert lb.all_text() == points[(lb.attrs["data-key"], "production")].attrs["data-op"]
    heaviest = max((s for _, s in _all_shapes(rep) if (s["key"], "production") in points), key=lambda s: s["weight"])
    assert heaviest["key"] in {lb.attrs["data-key"] for lb in labels}


class RecordingProxy:
    """An HTTP proxy on loopback that forwards nothing: it records the first
    line of each request (GET http://..., CONNECT host:443) and answers 502."""

    def __init__(self):
        self.lines = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.settimeout(5)
                try:
                    self.lines.append(c.recv(65536).split(b"\r\n")[0].decode(errors="replace"))
                    c.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def hosts(self):
        out = set()
        for ln in self.lines:
            parts = ln.split()
            if len(parts) >= 2:
                target = parts[1]
                out.add(urllib.parse.urlsplit(target).hostname if "://" in target else target.rsplit(":", 1)[0])
        return out

    def close(self):
        self.sock.close()


def load_through_proxy(tmp_path, page, name):
    """Load page in Chromium with every request sent to a recording proxy
    (loopback included) and a network log. Returns (URLs the page requested,
    by the log: requests made for a file:// document; hosts the browser asked
    for itself; hosts that reached the proxy)."""
    proxy = RecordingProxy()
    netlog = tmp_path / f"{name}.netlog.json"
    try:
        chromium(tmp_path, f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
                 f"--log-net-log={netlog}", "--dump-dom", page.as_uri())
    finally:
        proxy.close()
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    mine, browsers = [], set()
    for e in log["events"]:
        prm = e.get("params") or {}
        if e["type"] != start or "url" not in prm:
            continue
        if "file://" in prm.get("site_for_cookies", "") + prm.get("network_isolation_key", ""):
            mine.append(prm["url"])
        else:
            browsers.add(urllib.parse.urlsplit(prm["url"]).hostname)
    return mine, browsers, proxy.hosts()


def external_references(page_text):
    """Attributes and CSS that would make the browser fetch something: every
    src/href/... that is not a fragment or data: URL, and url(...) that is not url(#...)."""
    refs = []
    for n in Tree(page_text).root.walk():
        for k, v in n.attrs.items():
            if k in ("src", "href", "xlink:href", "srcset", "action", "data", "poster", "background", "formaction") \
                    and not (v or "").startswith(("#", "data:")):
                refs.append(f"{n.tag} {k}={v}")
    refs += [m for m in re.findall(r"url\(\s*['\"]?([^)'\"]*)", page_text) if not m.startswith("#")]
    return refs


def test_no_request_leaves_the_page(report_file, tmp_path):
    """The page asks for nothing: no reference to fetch in its text, and in
    Chromium, with every request going to a proxy that records it, the
    network log holds no request made for the page. A copy of the page with
    three references added (http, https, loopback) shows that both checks see
    such requests."""
    page = tmp_path / "report.html"
    assert _cli("html", report_file, "-o", page).returncode == 0
    text = page.read_text()
    assert external_references(text) == []
    assert "<script" not in text and "<link" not in text and "<img" not in text and "@import" not in text

    mine, browsers, proxied = load_through_proxy(tmp_path, page, "report")
    assert mine == []
    assert proxied <= browsers  # whatever reached the proxy, the log shows it was the browser's own

    control = tmp_path / "control.html"
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    added = ["http://example.invalid/a.png", "https://cdn.example.invalid/b.css", f"http://127.0.0.1:{port}/c.js"]
    control.write_text(text.replace("</head>", f'<link rel="stylesheet" href="{added[1]}"></head>').replace(
        "</body>", f'<img src="{added[0]}"><script src="{added[2]}"></script></body>'))
    assert sorted(external_references(control.read_text())) == sorted(
        [f"link href={added[1]}", f"img src={added[0]}", f"script src={added[2]}"])
    mine, browsers, proxied = load_through_proxy(tmp_path, control, "control")
    assert sorted(mine) == sorted(added)
    assert {"example.invalid", "cdn.example.invalid", "127.0.0.1"} <= proxied


def test_html_all_shows_idle_operators_and_bad_input_is_refused(report_file, tmp_path):
    page = tmp_path / "all.html"
    out = _cli("html", report_file, "-o", page, "--all")
    assert out.returncode == 0, out.stderr
    ops = {tr.attrs["data-op"] for tr in Tree(page.read_text()).root.find("tr") if "data-op" in tr.attrs}
    assert {"layer_norm", "fused_moe"} <= ops and "not shown" not in page.read_text()
    bad = tmp_path / "bad.json"
    for content, why in (("{not json", "Expecting property name"), ('{"schema": "other"}', "not an understudy report")):
        bad.write_text(content)
        out = _cli("html", bad, "-o", tmp_path / "bad.html")
        assert out.returncode == 2 and "cannot make a page of" in out.stderr and why in out.stderr, out.stderr
        assert not (tmp_path / "bad.html").exists()
    out = _cli("html", report_file, "-o", tmp_path / "no" / "such" / "dir.html")
    assert out.returncode == 2 and "cannot write" in out.stderr
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".html-")]  # no temporary file left
