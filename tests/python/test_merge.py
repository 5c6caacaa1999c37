"""Merging reports: exact for counts, histograms and sums; every derived
figure (quantiles, device time, weights, S, S_agg) computed by the library
from the merged additive figures, never read from the inputs.

Ground truth: calls counted by a TorchDispatchMode in each process, buckets
and sums added by the tests, float64 references from those, and the
in-process report of one process."""
import copy
import json
import math
import os
import random
import statistics
import subprocess
import sys
from collections import Counter

import pytest

import understudy
from conftest import ROOT, all_bindings, bound_ops, candidate_dir
from understudy.merge import MergeError, merge
from understudy.tables import format_report
from test_shadow import native, rms_inputs, run_rms_norm

# The figures plugin/report.c derives (ust__report_derive); every other field
# of a report is additive or identity.
DERIVED_TOTALS = ("calls", "timed", "captured", "routes", "est_device_time_ns", "shadow_calls", "verified", "failed",
                  "rollbacks", "S_agg", "S_agg_candidate", "phases", "above_roof", "candidate_routes")
DERIVED_OP = ("calls", "timed", "captured", "device_time_ns", "est_device_time_ns", "weight", "roofline", "phases")
DERIVED_SHAPE = ("timed", "device_time_ns", "est_device_time_ns", "weight")
DERIVED_HIST = ("count", "p50", "p90", "p99")
DERIVED_ROOF = ("tsol_ns_mean", "S", "S_candidate", "intensity", "flops_mean", "achieved_flops_s",
                "candidate_achieved_flops_s", "above_roof")
ROOF_SUMS = ("calls", "unscored", "tsol_ns_sum", "time_ns_sum", "candidate_calls", "candidate_tsol_ns_sum",
             "candidate_time_ns_sum", "work_calls", "flops_sum", "bytes_sum", "scored_by_callees")
SHADOW_COUNTS = ("calls", "verified", "passed", "failed", "skipped", "unverifiable", "bytes_copied", "overdue",
                 "process_passed")


def derived_slots(rep):
    """(path, container, key) of every derived figure of a report."""
    out = [(("totals", k), rep["totals"], k) for k in DERIVED_TOTALS]
    for o in rep["operators"]:
        out += [((o["name"], k), o, k) for k in DERIVED_OP]
        for s in o["shapes"]:
            at = (o["name"], s["key"])
            out += [(at + (k,), s, k) for k in DERIVED_SHAPE]
            out += [(at + ("latency_ns", k), s["latency_ns"], k) for k in DERIVED_HIST]
            if "shadow" in s:
                out.append((at + ("speedup",), s["shadow"], "speedup"))
                out += [(at + ("candidate_latency_ns", k), s["shadow"]["candidate_latency_ns"], k)
                        for k in DERIVED_HIST]
            if "roofline" in s:
                out += [(at + ("roofline", k), s["roofline"], k) for k in DERIVED_ROOF]
            out += [(at + ("graph", k), s["graph"], k) for k in ("status", "reason")]
    return out


def derived(rep):
    """{path: value} of every derived figure of a report, objects flattened to their leaves."""
    out = {}

    def leaves(path, v):
        if isinstance(v, dict):
            for k, x in v.items():
                leaves(path + (k,), x)
        else:
            out[path] = v

    for path, c, k in derived_slots(rep):
        leaves(path, c[k])
    return out


def poisoned(rep, strip=False):
    """A copy of rep with every derived figure removed (strip) or wrong."""
    rep = copy.deepcopy(rep)
    for _, c, k in derived_slots(rep):
        if strip:
            c.pop(k, None)
        else:
            c[k] = {"wrong": -7.5} if isinstance(c.get(k), dict) else -7.5
    return rep


def real_report(us):
    """A report with observed, shadowed and scored routes, from this process
    (past the thread's first 10 of silu's and mm's calls, keyed 1 in 2: keys with
    estimated calls, tallied ones)."""
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu": {"sample": 1.0}, "gemm": {"sample": 0.5}},
               "defaults": {"key_every": 2, "key_after": 10}, "hardware": {"profile": "H200"}})
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
    """k reports whose additive figures sum to rep's (one process's traffic as
    k processes' shares), their derived figures wrong."""
    rng = random.Random(seed)
    parts = [copy.deepcopy(rep) for _ in range(k)]
    for i, p in enumerate(parts):
        p["pid"] = 1000 + i  # k processes
    for oi, o in enumerate(rep["operators"]):
        for f in ("untracked", "tallied"):
            for p, c in zip(parts, _split_int(o[f], k, rng)):
                p["operators"][oi][f] = c
        for si, s in enumerate(o["shapes"]):
            ps = [p["operators"][oi]["shapes"][si] for p in parts]
            for f in ("calls", "estimated", "captured", "timing_dropped", "first_timed", "first_time_ns"):
                for p, c in zip(ps, _split_int(s[f], k, rng)):
                    p[f] = c
            for p, h in zip(ps, _split_hist(s["latency_ns"], k, rng)):
                p["latency_ns"] = h
            if "shadow" in s:
                for f in SHADOW_COUNTS:
                    for p, c in zip(ps, _split_int(s["shadow"][f], k, rng)):
                        p["shadow"][f] = c
                for p, h in zip(ps, _split_hist(s["shadow"]["candidate_latency_ns"], k, rng)):
                    p["shadow"]["candidate_latency_ns"] = h
                for j, p in enumerate(ps):  # the maxima live in one share, smaller values elsewhere
                    if j:
                        p["shadow"]["max_abs_err"] = s["shadow"]["max_abs_err"] / (j + 1)
                        p["shadow"]["max_rel_err"] = s["shadow"]["max_rel_err"] / (j + 1)
            if "roofline" in s:
                for f in ("calls", "unscored", "time_ns_sum", "candidate_calls", "candidate_time_ns_sum", "work_calls"):
                    for p, c in zip(ps, _split_int(s["roofline"][f], k, rng)):
                        p["roofline"][f] = c
                for f in ("flops_sum", "bytes_sum"):  # whole numbers here: split as such, they add back exactly
                    assert float(s["roofline"][f]).is_integer(), (s["key"], f)
                    for p, c in zip(ps, _split_int(s["roofline"][f], k, rng)):
                        p["roofline"][f] = c
                for f in ("tsol_ns_sum", "candidate_tsol_ns_sum"):  # ns, with fractions
                    fr = [rng.random() + 0.1 for _ in range(k)]
                    for p, x in zip(ps, fr):
                        p["roofline"][f] = s["roofline"][f] * x / sum(fr)
    for p, c in zip(parts, _split_int(rep["totals"]["internal_errors"], k, rng)):
        p["totals"]["internal_errors"] = c
    return [poisoned(p) for p in parts]  # a merge reads no derived figure


def test_split_into_four_merges_back_exactly(us):
    rep = real_report(us)
    merged = merge(split(rep, 4))
    assert rep["totals"]["S_agg"] > 0 and rep["totals"]["S_agg_candidate"] > 0
    assert set(merged["totals"]["phases"]) == set(rep["totals"]["phases"]) == {"unknown", "prefill", "decode"}
    want, got = derived(rep), derived(merged)
    assert set(got) == set(want)
    for path, v in want.items():
        # the roofline's T_SOL sums were split with fractions: equal to the last bits
        if isinstance(v, float) and not float(v).is_integer():
            assert got[path] == pytest.approx(v, rel=1e-12, abs=1e-15), path
        else:
            assert got[path] == v, path
    assert merged["totals"]["untracked"] == rep["totals"]["untracked"]
    assert merged["totals"]["tallied"] == rep["totals"]["tallied"] > 0
    assert merged["totals"]["internal_errors"] == rep["totals"]["internal_errors"]
    got = {o["name"]: o for o in merged["operators"]}
    assert sum(s["estimated"] for o in rep["operators"] for s in o["shapes"]) > 0
    for o in rep["operators"]:
        m = got[o["name"]]
        assert (m["untracked"], m["tallied"], m["key_every"]) == (o["untracked"], o["tallied"], o["key_every"]), o["name"]
        ms = {s["key"]: s for s in m["shapes"]}
        for s in o["shapes"]:
            t = ms[s["key"]]
            for f in ("calls", "estimated", "captured", "timing_dropped", "first_timed", "first_time_ns", "mode",
                      "phase"):
                assert t[f] == s[f], (s["key"], f)
            assert t["latency_ns"] == s["latency_ns"], s["key"]  # buckets, count, sum and quantiles
            if "shadow" in s:
                for f in SHADOW_COUNTS + ("max_abs_err", "max_rel_err"):
                    assert t["shadow"][f] == s["shadow"][f], (s["key"], f)
                assert t["shadow"]["candidate_latency_ns"] == s["shadow"]["candidate_latency_ns"]
            if "roofline" in s:
                for f in ROOF_SUMS:
                    assert t["roofline"][f] == pytest.approx(s["roofline"][f], rel=1e-12), (s["key"], f)


def test_derive_reproduces_the_in_process_report(us):
    """The in-process report and the library's derive path agree exactly,
    whatever the derived figures handed in; a merge of one report changes
    no derived figure and reads none."""
    rep = real_report(us)
    assert rep["totals"]["S_agg"] > 0 and rep["totals"]["S_agg_candidate"] > 0
    assert understudy.derive(rep) == rep
    assert understudy.derive(poisoned(rep, strip=True)) == rep
    assert understudy.derive(poisoned(rep)) == rep
    one = merge([rep])
    assert derived(one) == derived(rep)
    assert merge([poisoned(rep)]) == one
    assert merge([poisoned(rep, strip=True)]) == one


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


TWO_WORKER = r"""
import json, sys
sys.path[:0] = [{shim!r}, {tests!r}]
import torch
import understudy
from conftest import DispatchCounter
from test_shadow import native, rms_inputs, run_rms_norm

share, out, counts_out = int(sys.argv[1]), sys.argv[2], sys.argv[3]


def work():
    # one shape key in both processes (its histograms combine), others in one
    run_rms_norm(rms_inputs(shapes=((7, 128), (64, 256)) if share == 0 else ((7, 128), (3, 5, 64))),
                 repeat=5 + 2 * share)
    with understudy.phase("decode"):
        run_rms_norm(rms_inputs(shapes=((2, 128),)), repeat=3 + share)
    g = torch.Generator().manual_seed(share)
    w = torch.randn(48, 8, generator=g)
    for n in ((16, 33) if share == 0 else (33, 64)):
        x = torch.randn(n, 48, generator=g)
        for _ in range(3 + share):
            torch.nn.functional.silu(x)
            torch.mm(x, w)


with DispatchCounter() as truth:
    work()
understudy.enable({{"operators": {{"rms_norm": {{"mode": "shadow", "sample": 1.0,
                                               "candidate": native("rms_norm_cpu")}},
                                  "silu": {{"sample": 1.0}}, "gemm": {{"sample": 1.0}}}},
                   "hardware": {{"profile": "H200"}}, "report": {{"path": out, "interval_s": 0}}}})
work()
understudy.disable()
with open(counts_out, "w") as f:
    json.dump(truth.counts, f)
"""


def _buckets_add(*hists):
    c = Counter()
    for h in hists:
        for i, n in h["buckets"]:
            c[i] += n
    return [[i, c[i]] for i in sorted(c) if c[i]]


def add_reports(a, b):
    """a and b as one process's report, from their additive figures alone:
    counts and sums add, buckets add index by index; operators and shape keys
    in first-seen order (as a merge lists them), derived figures left out."""
    out = copy.deepcopy(a)
    ops = {o["name"]: o for o in out["operators"]}
    for ob in b["operators"]:
        oa = ops.get(ob["name"])
        if oa is None:
            out["operators"].append(copy.deepcopy(ob))
            continue
        oa["untracked"] += ob["untracked"]
        shapes = {s["key"]: s for s in oa["shapes"]}
        for sb in ob["shapes"]:
            sa = shapes.get(sb["key"])
            if sa is None:
                oa["shapes"].append(copy.deepcopy(sb))
                continue
            for f in ("calls", "captured", "timing_dropped", "first_timed", "first_time_ns"):
                sa[f] += sb[f]
            sa["latency_ns"] = {"sum": sa["latency_ns"]["sum"] + sb["latency_ns"]["sum"],
                                "buckets": _buckets_add(sa["latency_ns"], sb["latency_ns"])}
            if "roofline" in sb:
                for f in ROOF_SUMS:
                    sa["roofline"][f] += sb["roofline"][f]
            if "shadow" in sb:
                for f in SHADOW_COUNTS:
                    sa["shadow"][f] += sb["shadow"][f]
                ca, cb = sa["shadow"]["candidate_latency_ns"], sb["shadow"]["candidate_latency_ns"]
                sa["shadow"]["candidate_latency_ns"] = {"sum": ca["sum"] + cb["sum"], "buckets": _buckets_add(ca, cb)}
    out["totals"]["internal_errors"] += b["totals"]["internal_errors"]
    out["totals"]["untracked"] += b["totals"]["untracked"]
    return poisoned(out, strip=True)


def bucket_bounds(i):
    """Scheme log2-sub16-ns: each value below 16 ns has a bucket; above, each
    power of two [2^k, 2^(k+1)) is cut into 16 buckets of equal width."""
    if i < 16:
        return i, 1
    k, sub = 4 + (i - 16) // 16, (i - 16) % 16
    width = 1 << (k - 4)
    return (1 << k) + sub * width, width


def ref_quantile(buckets, q):
    """The bucket holding rank ceil(q * count), as the middle of its values."""
    count = sum(n for _, n in buckets)
    if count == 0:
        return 0.0
    rank, seen = max(1, math.ceil(q * count)), 0
    for i, n in sorted(buckets):
        seen += n
        if seen >= rank:
            lo, width = bucket_bounds(i)
            return lo + (width - 1) / 2
    raise AssertionError("rank beyond the buckets")


def est_of(summed):
    """{key: estimated device time} from a report's additive figures."""
    est = {}
    for o in summed["operators"]:
        for s in o["shapes"]:
            timed = sum(n for _, n in s["latency_ns"]["buckets"])
            est[s["key"]] = s["latency_ns"]["sum"] * max(s["calls"] - s["captured"], 0) / timed if timed else 0.0
    return est


def reference(summed):
    """Weights, quantiles, S and S_agg in float64 from a report's additive figures."""
    routes = [(o, s) for o in summed["operators"] for s in o["shapes"]]
    est = est_of(summed)
    total = sum(est.values())
    total_ph = Counter()
    for o, s in routes:
        total_ph[s["phase"]] += est[s["key"]]
    ref = {"shapes": {}, "ops": {}, "S_agg": 0.0, "S_agg_candidate": 0.0, "phases": Counter(),
           "candidate_routes": Counter()}
    for o in summed["operators"]:
        has_cand = "candidate" in o
        sv, cv, ph_est, ph_sv = [], [], Counter(), {}
        for s in o["shapes"]:
            lat = s["latency_ns"]["buckets"]
            r = ref["shapes"][s["key"]] = {"p50": ref_quantile(lat, 0.5), "p90": ref_quantile(lat, 0.9),
                                           "p99": ref_quantile(lat, 0.99), "weight": est[s["key"]] / total}
            ph_est[s["phase"]] += est[s["key"]]
            roof = s.get("roofline")
            if roof and roof["calls"] and r["p50"] > 0:
                r["S"] = roof["tsol_ns_sum"] / roof["calls"] / r["p50"]
                sv.append(r["S"])
                ph_sv.setdefault(s["phase"], []).append(r["S"])
            if roof and "shadow" in s:
                cp50 = ref_quantile(s["shadow"]["candidate_latency_ns"]["buckets"], 0.5)
                if roof["candidate_calls"] and cp50 > 0 and s["mode"] != "rolled_back":
                    r["S_candidate"] = roof["candidate_tsol_ns_sum"] / roof["candidate_calls"] / cp50
                    cv.append(r["S_candidate"])
            if "S" in r and "S_candidate" in r:
                # the candidates' headline: both arms over the keys where both have an S, by device time
                c = ref["candidate_routes"]
                c["routes"] += 1
                c["time"] += est[s["key"]]
                c["cand"] += est[s["key"]] * r["S_candidate"]
                c["prod"] += est[s["key"]] * r["S"]
        w = sum(est[s["key"]] for s in o["shapes"]) / total
        s_op = statistics.median(sv) if sv else 0.0
        ref["ops"][o["name"]] = {"weight": w, "S": s_op}
        ref["S_agg"] += w * s_op
        if has_cand:
            ref["ops"][o["name"]]["S_candidate"] = statistics.median(cv) if cv else 0.0
            ref["S_agg_candidate"] += w * ref["ops"][o["name"]]["S_candidate"]
        for ph, e in ph_est.items():
            v = ph_sv.get(ph, [])
            ref["phases"][ph] += e / total_ph[ph] * (statistics.median(v) if v else 0.0)
    return ref


def test_two_processes_merge_into_what_the_library_derives_from_their_sums(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(TWO_WORKER.format(shim=str(ROOT / "python-shim"), tests=str(ROOT / "tests" / "python")))
    reps, truth = [], Counter()
    for i in range(2):
        out, counts = tmp_path / f"r{i}.json", tmp_path / f"c{i}.json"
        p = subprocess.run([sys.executable, str(script), str(i), str(out), str(counts)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        reps.append(json.loads(out.read_text()))
        truth.update(json.loads(counts.read_text()))
    merged = merge(reps)

    # calls: what each process's dispatch mode counted, added
    bound = all_bindings(merged)
    assert {"_C::rms_norm", "aten::silu", "aten::mm"} <= bound
    assert bound_ops(merged) == {op: n for op, n in truth.items() if op in bound}
    # a key seen by both processes, so that buckets combine
    keys = [{s["key"] for o in r["operators"] for s in o["shapes"]} for r in reps]
    assert any("M=8,N=128" in k for k in keys[0] & keys[1])

    # additive figures: the sums of the two reports', added here
    summed = add_reports(*reps)
    shapes = {s["key"]: s for o in merged["operators"] for s in o["shapes"]}
    want_shapes = {s["key"]: s for o in summed["operators"] for s in o["shapes"]}
    assert set(shapes) == set(want_shapes)
    for key, w in want_shapes.items():
        s = shapes[key]
        assert s["latency_ns"]["buckets"] == w["latency_ns"]["buckets"], key
        assert s["latency_ns"]["sum"] == w["latency_ns"]["sum"], key
        assert s["calls"] == s["latency_ns"]["count"] == sum(n for _, n in w["latency_ns"]["buckets"]), key
        # the buckets hold the measured times: their bounds enclose the sum
        lo = sum(n * bucket_bounds(i)[0] for i, n in w["latency_ns"]["buckets"])
        hi = sum(n * sum(bucket_bounds(i)) for i, n in w["latency_ns"]["buckets"])
        assert lo <= w["latency_ns"]["sum"] < hi, key
        if "shadow" in w:
            assert s["shadow"]["candidate_latency_ns"]["buckets"] == w["shadow"]["candidate_latency_ns"]["buckets"]
            for f in SHADOW_COUNTS:
                assert s["shadow"][f] == w["shadow"][f], (key, f)
        if "roofline" in w:
            # cJSON writes a number with 15 significant digits when they read
            # back within DBL_EPSILON of it: T_SOL sums (ns, fractional) may
            # move by their last bit on the way through the library
            for f in ROOF_SUMS:
                assert s["roofline"][f] == pytest.approx(w["roofline"][f], rel=1e-15, abs=0), (key, f)

    # every derived figure: what the library derives from the summed report
    assert derived(merged) == derived(understudy.derive(summed))

    # and float64 references computed here from the summed buckets and sums
    ref = reference(summed)
    assert merged["histogram"]["scheme"] == "log2-sub16-ns"
    for key, r in ref["shapes"].items():
        s = shapes[key]
        for q in ("p50", "p90", "p99"):
            assert s["latency_ns"][q] == r[q], (key, q)
        assert s["weight"] == pytest.approx(r["weight"], rel=1e-12), key
        for f in ("S", "S_candidate"):
            if f in r:
                assert s["roofline"][f] == pytest.approx(r[f], rel=1e-12), (key, f)
            elif "roofline" in s:
                assert s["roofline"][f] is None, (key, f)
    assert sum(1 for r in ref["shapes"].values() if "S_candidate" in r) >= 3
    charted = 0
    for o in summed["operators"]:  # the roofline chart's coordinates, from the summed W, Q and medians
        for w in o["shapes"]:
            roof, s = w.get("roofline"), shapes[w["key"]]
            if not roof or not roof["work_calls"]:
                continue
            w_mean = roof["flops_sum"] / roof["work_calls"]
            assert s["roofline"]["intensity"] == pytest.approx(roof["flops_sum"] / roof["bytes_sum"], rel=1e-12)
            assert s["roofline"]["achieved_flops_s"] == pytest.approx(w_mean / ref["shapes"][w["key"]]["p50"] * 1e9,
                                                                      rel=1e-12)
            if "shadow" in w and w["shadow"]["candidate_latency_ns"]["buckets"]:
                cp50 = ref_quantile(w["shadow"]["candidate_latency_ns"]["buckets"], 0.5)
                assert s["roofline"]["candidate_achieved_flops_s"] == pytest.approx(w_mean / cp50 * 1e9, rel=1e-12)
            charted += 1
    assert charted >= 3
    h200 = json.loads((ROOT / "problems" / "hardware" / "H200.json").read_text())
    assert merged["hardware"] == [{"name": h200["name"], "p_peak": h200["p_peak"], "b_peak": h200["b_peak"],
                                   "source": h200["source"]}]  # the ceilings the routes were scored against
    for o in merged["operators"]:
        r = ref["ops"][o["name"]]
        assert o["weight"] == pytest.approx(r["weight"], rel=1e-12), o["name"]
        for f in ("S", "S_candidate"):
            if f in r:
                assert o["roofline"][f] == pytest.approx(r[f], rel=1e-12), (o["name"], f)
    assert sum(o["weight"] for o in merged["operators"]) == pytest.approx(1.0, rel=1e-12)
    assert merged["totals"]["S_agg"] == pytest.approx(ref["S_agg"], rel=1e-12) and ref["S_agg"] > 0
    assert merged["totals"]["S_agg_candidate"] == pytest.approx(ref["S_agg_candidate"], rel=1e-12)
    assert ref["S_agg_candidate"] > 0
    c, got = ref["candidate_routes"], merged["totals"]["candidate_routes"]
    assert c["routes"] >= 3 and got["routes"] == c["routes"]
    assert got["device_share"] == pytest.approx(c["time"] / sum(est_of(summed).values()), rel=1e-12)
    assert got["S_candidate"] == pytest.approx(c["cand"] / c["time"], rel=1e-12)
    assert got["S_production"] == pytest.approx(c["prod"] / c["time"], rel=1e-12)
    above = {k for k, r in ref["shapes"].items() if r.get("S", 0) > 1 or r.get("S_candidate", 0) > 1}
    assert {k for k, s in shapes.items() if (s.get("roofline") or {}).get("above_roof")} == above
    assert merged["totals"]["above_roof"] == len(above)
    assert set(merged["totals"]["phases"]) == set(ref["phases"]) == {"unknown", "decode"}
    for ph, v in ref["phases"].items():
        assert merged["totals"]["phases"][ph]["S_agg"] == pytest.approx(v, rel=1e-12), ph


MERGE_WITHOUT_LIB = r"""
import json, sys
sys.path.insert(0, {shim!r})
import understudy
from understudy.merge import merge
try:
    merge([json.load(open(sys.argv[1]))])
except understudy.UnderstudyError as e:
    print(e.name, e)
    sys.exit(3)
"""


@pytest.mark.parametrize("lib", ["absent", "without_derive"])
def test_merge_without_the_library_fails_naming_what_is_missing(tmp_path, lib):
    rep = tmp_path / "r.json"
    rep.write_text(json.dumps({"schema": "understudy.report", "version": 1, "histogram": {"scheme": "log2-sub16-ns"},
                               "operators": [], "totals": {"untracked": 0, "internal_errors": 0}}))
    # a library that is not there, or a shared object without understudy's functions
    path = tmp_path / "libunderstudy.so" if lib == "absent" else candidate_dir() / "libsilu_cpu.so"
    want = str(path) if lib == "absent" else "undefined symbol: ust_"
    env = dict(os.environ, UNDERSTUDY_LIB=str(path), PYTHONPATH=str(ROOT / "python-shim"))
    script = tmp_path / "merge.py"
    script.write_text(MERGE_WITHOUT_LIB.format(shim=str(ROOT / "python-shim")))
    p = subprocess.run([sys.executable, str(script), str(rep)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.startswith("UST_ENOTFOUND ") and want in p.stdout and str(path) in p.stdout, p.stdout
    out = tmp_path / "merged.json"
    cli = subprocess.run([sys.executable, "-m", "understudy", "merge", str(out), str(rep)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert cli.returncode == 2 and not out.exists(), cli.stderr
    assert cli.stderr.startswith("understudy: merge: ") and want in cli.stderr, cli.stderr


def test_graph_figures_add_and_keep_a_reason(us):
    """shadow.graph: eager calls on the CPU put nothing into graphs (0, 0,
    no reason), and no route has a graph status; two processes' captured
    calls add, the merged route keeps a reason one of them gave, and its
    status is derived again from the sums: observe-only, naming each cause
    (calls holding production alone, shadows left ungated, calls in a graph
    handed out, kernels run by graphs understudy did not see captured)."""
    rep = real_report(us)
    shadowed = [s for o in rep["operators"] for s in o["shapes"] if "shadow" in s]
    assert shadowed and all(s["shadow"]["graph"] == {"shadowed": 0, "plain": 0, "beside": 0, "ungated": 0,
                                                     "exposed": 0, "reason": None} for s in shadowed)
    assert all(s["graph"] == {"unseen_kernels": 0, "unseen_ns": 0, "changed": 0, "dropped": 0, "status": None,
                              "reason": None}
               for o in rep["operators"] for s in o["shapes"])
    a, b = copy.deepcopy(rep), copy.deepcopy(rep)
    b["pid"] = rep["pid"] + 1
    key = shadowed[0]["key"]
    for r, fig, unseen in ((a, {"shadowed": 3, "plain": 0, "beside": 2, "ungated": 0, "exposed": 0, "reason": None},
                            (0, 0, 0, 0)),
                           (b, {"shadowed": 2, "plain": 1, "beside": 1, "ungated": 1, "exposed": 2,
                                "reason": "a torch-op candidate: ..."}, (6, 900, 2, 7))):
        (s,) = [s for o in r["operators"] for s in o["shapes"] if s["key"] == key]
        s["shadow"]["graph"] = fig
        s["captured"] += fig["shadowed"] + fig["plain"]
        g = s["graph"]
        g["unseen_kernels"], g["unseen_ns"], g["changed"], g["dropped"] = unseen
    (sa,) = [s for o in understudy.derive(a)["operators"] for s in o["shapes"] if s["key"] == key]
    assert sa["graph"] == {"unseen_kernels": 0, "unseen_ns": 0, "changed": 0, "dropped": 0, "status": "gated",
                           "reason": None}
    (sb,) = [s for o in understudy.derive(b)["operators"] for s in o["shapes"] if s["key"] == key]
    assert sb["graph"]["status"] == "observe-only"
    assert sb["graph"]["reason"].startswith("6 of its kernels ran in graphs understudy did not see captured")
    assert ("; 2 of its captured calls changed in place in an executable graph by a graph library"
            in sb["graph"]["reason"])
    assert "so they run production alone (7 replays' comparisons dropped since, not judged)" in sb["graph"]["reason"]
    b0 = copy.deepcopy(b)
    (s0,) = [s for o in b0["operators"] for s in o["shapes"] if s["key"] == key]
    s0["graph"]["dropped"] = 0  # a route without a candidate drops nothing: the reason does not count it
    (s0,) = [s for o in understudy.derive(b0)["operators"] for s in o["shapes"] if s["key"] == key]
    assert "production alone; " in s0["graph"]["reason"] and "dropped since" not in s0["graph"]["reason"]
    assert "; 1 captured calls hold production alone: a torch-op candidate: ...; 1 captured shadows left ungated" \
        in sb["graph"]["reason"]
    assert sb["graph"]["reason"].endswith("; 2 of its captured calls are in a graph whose raw handle was handed to "
                                          "code outside understudy, which may change its kernels in place unseen: "
                                          "production alone in its replays")
    # nothing captured here: no site, no ring entry
    assert rep["graphs"] == {"sites": 0, "live": 0, "open": 0, "unknown": 0, "lost": 0, "launched": 0, "refused": 0,
                             "gated": 0, "gated_replays": 0, "gate_failed": 0, "hosted": 0, "host_starts": 0,
                             "unseen": 0}
    a["graphs"] = {"sites": 4, "live": 3, "open": 3, "unknown": 0, "lost": 2, "launched": 2, "refused": 5,
                   "gated": 2, "gated_replays": 100, "gate_failed": 0, "hosted": 2, "host_starts": 30, "unseen": 1}
    b["graphs"] = {"sites": 3, "live": 2, "open": 0, "unknown": 1, "lost": 0, "launched": 1, "refused": 0,
                   "gated": 1, "gated_replays": 40, "gate_failed": 1, "hosted": 0, "host_starts": 0, "unseen": 2}
    merged = merge([a, b])
    (m,) = [s for o in merged["operators"] for s in o["shapes"] if s["key"] == key]
    assert m["shadow"]["graph"] == {"shadowed": 5, "plain": 1, "beside": 3, "ungated": 1, "exposed": 2,
                                    "reason": "a torch-op candidate: ..."}
    g = m["graph"]
    assert (g["unseen_kernels"], g["unseen_ns"], g["changed"], g["dropped"]) == (6, 900, 2, 7)
    assert m["graph"]["status"] == "observe-only" and m["graph"]["reason"] == sb["graph"]["reason"]
    table = format_report(merged, max_shapes=0, legend=False)
    assert f"observe-only under CUDA graphs (no verdict flows in their replays):\n  {key}: 6 of its kernels" in table
    assert "observe-only under CUDA graphs" not in format_report(rep, legend=False)
    # a route captured without a candidate: its replays timed, nothing to gate
    (plain,) = [s for o in a["operators"] if o["name"] == "silu" for s in o["shapes"]][:1]
    plain["captured"] = 2
    (p,) = [s for o in understudy.derive(a)["operators"] for s in o["shapes"] if s["key"] == plain["key"]]
    assert p["graph"]["status"] == "observed" and p["graph"]["reason"] is None
    assert merged["graphs"] == {"sites": 7, "live": 5, "open": 3, "unknown": 1, "lost": 2, "launched": 3,
                                "refused": 5, "gated": 3, "gated_replays": 140, "gate_failed": 1, "hosted": 2,
                                "host_starts": 30, "unseen": 3}
