"""Merging reports: exact for counts, histograms and sums; weights, S and
S_agg recomputed from the merged figures."""
import copy
import json
import os
import random
import subprocess
import sys

import pytest

import understudy
from conftest import ROOT
from understudy.merge import MergeError, merge
from test_shadow import native, rms_inputs, run_rms_norm


def real_report(us):
    """A report with observed, shadowed and scored routes, from this process."""
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu": {"sample": 1.0}, "gemm": {"sample": 0.5}},
               "hardware": {"profile": "H200"}})
    import torch
    run_rms_norm(rms_inputs(shapes=((7, 128), (64, 256), (3, 5, 64))), repeat=7)
    with understudy.phase("prefill"):
        run_rms_norm(rms_inputs(shapes=((256, 128),)), repeat=3)
    with understudy.phase("decode"):
        run_rms_norm(rms_inputs(shapes=((2, 128),)), repeat=9)
    for n in (16, 33, 64):
        x = torch.randn(n, 48)
        for _ in range(5):
            torch.nn.functional.silu(x)
            torch.mm(x, torch.randn(48, 8))
    rep = us.report()
    us.disable()
    return rep


def _split_int(v, k, rng):
    cuts = sorted(rng.randint(0, int(v)) for _ in range(k - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [int(v)])]


def _split_hist(h, k, rng):
    parts = [{"buckets": [], "sum": 0} for _ in range(k)]
    for i, n in h["buckets"]:
        for p, c in zip(parts, _split_int(n, k, rng)):
            if c:
                p["buckets"].append([i, c])
    for p, c in zip(parts, _split_int(h["sum"], k, rng)):
        p["sum"] = c
    return parts


def split(rep, k, seed=0):
    """k reports whose additive figures sum to rep's: one process's traffic as k processes' shares."""
    rng = random.Random(seed)
    parts = [copy.deepcopy(rep) for _ in range(k)]
    for i, p in enumerate(parts):
        p["pid"] = 1000 + i  # k processes
    for oi, o in enumerate(rep["operators"]):
        for p, c in zip(parts, _split_int(o["untracked"], k, rng)):
            p["operators"][oi]["untracked"] = c
        for si, s in enumerate(o["shapes"]):
            ps = [p["operators"][oi]["shapes"][si] for p in parts]
            for f in ("calls", "timed", "captured", "timing_dropped", "device_time_ns"):
                for p, c in zip(ps, _split_int(s[f], k, rng)):
                    p[f] = c
            fr = [rng.random() + 0.1 for _ in range(k)]
            for p, f in zip(ps, fr):
                p["est_device_time_ns"] = s["est_device_time_ns"] * f / sum(fr)
            for p, h in zip(ps, _split_hist(s["latency_ns"], k, rng)):
                p["latency_ns"] = h
            if "shadow" in s:
                for f in ("calls", "verified", "passed", "failed", "skipped", "unverifiable"):
                    for p, c in zip(ps, _split_int(s["shadow"][f], k, rng)):
                        p["shadow"][f] = c
                for p, h in zip(ps, _split_hist(s["shadow"]["candidate_latency_ns"], k, rng)):
                    p["shadow"]["candidate_latency_ns"] = h
                for j, p in enumerate(ps):  # the maxima live in one share, smaller values elsewhere
                    if j:
                        p["shadow"]["max_abs_err"] = s["shadow"]["max_abs_err"] / (j + 1)
                        p["shadow"]["max_rel_err"] = s["shadow"]["max_rel_err"] / (j + 1)
            if "roofline" in s:
                for f in ("calls", "unscored", "time_ns_sum", "candidate_calls", "candidate_time_ns_sum"):
                    for p, c in zip(ps, _split_int(s["roofline"][f], k, rng)):
                        p["roofline"][f] = c
                for f in ("tsol_ns_sum", "candidate_tsol_ns_sum"):  # ns, with fractions
                    fr = [rng.random() + 0.1 for _ in range(k)]
                    for p, x in zip(ps, fr):
                        p["roofline"][f] = s["roofline"][f] * x / sum(fr)
    for p, c in zip(parts, _split_int(rep["totals"]["internal_errors"], k, rng)):
        p["totals"]["internal_errors"] = c
    return parts


def test_split_into_four_merges_back_exactly(us):
    rep = real_report(us)
    merged = merge(split(rep, 4))
    assert merged["totals"]["calls"] == rep["totals"]["calls"]
    assert merged["totals"]["routes"] == rep["totals"]["routes"]
    assert merged["totals"]["S_agg"] == pytest.approx(rep["totals"]["S_agg"], rel=1e-12)
    assert merged["totals"]["S_agg_candidate"] == pytest.approx(rep["totals"]["S_agg_candidate"], rel=1e-12)
    assert rep["totals"]["S_agg"] > 0 and rep["totals"]["S_agg_candidate"] > 0
    assert set(merged["totals"]["phases"]) == set(rep["totals"]["phases"]) == {"unknown", "prefill", "decode"}
    for ph, x in rep["totals"]["phases"].items():
        for f in x:
            assert merged["totals"]["phases"][ph][f] == pytest.approx(x[f], rel=1e-12), (ph, f)
    got = {o["name"]: o for o in merged["operators"]}
    for o in rep["operators"]:
        m = got[o["name"]]
        for f in ("calls", "timed", "captured", "untracked", "device_time_ns"):
            assert m[f] == o[f], (o["name"], f)
        assert m["weight"] == pytest.approx(o["weight"], rel=1e-12, abs=1e-15)
        for f in o["roofline"]:
            assert m["roofline"][f] == pytest.approx(o["roofline"][f], rel=1e-12), (o["name"], f)
        assert set(m["phases"]) == set(o["phases"])
        for ph, x in o["phases"].items():
            for f in x:
                assert m["phases"][ph][f] == pytest.approx(x[f], rel=1e-12, abs=1e-15), (o["name"], ph, f)
        ms = {s["key"]: s for s in m["shapes"]}
        for s in o["shapes"]:
            t = ms[s["key"]]
            for f in ("calls", "timed", "captured", "timing_dropped", "device_time_ns", "mode", "phase"):
                assert t[f] == s[f], (s["key"], f)
            assert t["latency_ns"] == s["latency_ns"], s["key"]  # buckets, count, sum and quantiles
            assert t["weight"] == pytest.approx(s["weight"], rel=1e-12, abs=1e-15)
            if "shadow" in s:
                for f in ("calls", "verified", "passed", "failed", "skipped", "max_abs_err", "max_rel_err"):
                    assert t["shadow"][f] == s["shadow"][f], (s["key"], f)
                assert t["shadow"]["candidate_latency_ns"] == s["shadow"]["candidate_latency_ns"]
                assert t["shadow"]["speedup"] == pytest.approx(s["shadow"]["speedup"], rel=1e-12)
            if "roofline" in s:
                for f in ("S", "S_candidate", "tsol_ns_mean"):
                    assert t["roofline"][f] == pytest.approx(s["roofline"][f], rel=1e-12), (s["key"], f)


def test_merge_refuses_foreign_files():
    with pytest.raises(MergeError, match="report 0 is not an understudy.report"):
        merge([{"schema": "x"}])
    with pytest.raises(MergeError, match="nothing to merge"):
        merge([])


def test_merge_takes_the_candidate_from_any_report_and_refuses_conflicts(us):
    rep = real_report(us)
    a, b = split(rep, 2)
    # the first rank ran no candidate: its rms_norm routes observe only
    op = next(o for o in a["operators"] if o["name"] == "rms_norm")
    del op["candidate"]
    merged = merge([a, b])
    mo = next(o for o in merged["operators"] if o["name"] == "rms_norm")
    assert mo["candidate"]["name"] == "rms_norm_cpu" and "S_candidate" in mo["roofline"]
    assert merged["totals"]["S_agg_candidate"] == pytest.approx(rep["totals"]["S_agg_candidate"], rel=1e-12)
    c = copy.deepcopy(b)
    next(o for o in c["operators"] if o["name"] == "rms_norm")["candidate"]["sha256"] = "0" * 64
    c["pid"] = 4242
    with pytest.raises(MergeError, match="ran different candidates"):
        merge([b, c])
    with pytest.raises(MergeError, match="come from the same process"):
        merge([b, copy.deepcopy(b)])


WORKER = r"""
import json, sys, torch
sys.path.insert(0, {shim!r})
import understudy
share, out = int(sys.argv[1]), sys.argv[2]
understudy.enable({{"operators": {{"silu": {{"sample": 1.0}}, "gemm": {{"sample": 1.0}}}},
                   "report": {{"path": out, "interval_s": 0}}}})
for n in range(1, 9):
    if n % 4 == share:
        x = torch.randn(n * 8, 32)
        for _ in range(n):
            torch.nn.functional.silu(x)
            torch.mm(x, torch.randn(32, 16))
understudy.disable()
"""


def test_four_processes_merge_into_the_traffic_they_saw(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(shim=str(ROOT / "python-shim")))
    outs = [tmp_path / f"r{i}.json" for i in range(4)]
    procs = [subprocess.run([sys.executable, str(script), str(i), str(o)], capture_output=True, text=True, timeout=120)
             for i, o in enumerate(outs)]
    for p in procs:
        assert p.returncode == 0, p.stderr
    merged_path = tmp_path / "merged.json"
    cli = subprocess.run([sys.executable, "-m", "understudy", "merge", str(merged_path)] + [str(o) for o in outs],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert cli.returncode == 0, cli.stderr
    merged = json.loads(merged_path.read_text())
    assert merged["merged_from"] == 4
    silu = {s["dims"]["M"]: s for o in merged["operators"] if o["name"] == "silu" for s in o["shapes"]}
    # n*8 rows, n calls each, M bucketed to a power of two
    want = {}
    for n in range(1, 9):
        m = 1 << (n * 8 - 1).bit_length()
        want[m] = want.get(m, 0) + n
    assert {m: s["calls"] for m, s in silu.items()} == want
    for s in silu.values():
        assert s["latency_ns"]["count"] == s["calls"] == s["timed"]
    assert merged["totals"]["calls"] == 2 * sum(range(1, 9))
    assert sum(o["weight"] for o in merged["operators"]) == pytest.approx(1.0)
