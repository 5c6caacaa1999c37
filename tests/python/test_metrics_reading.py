"""The figures the metrics expose, read by the library from the route
snapshot (no JSON report between): equal to what the JSON report says of
the same routes, and to the report's raw figures summed and re-bucketed by
the test itself; counters that only grow across a disable and enable."""
from collections import Counter, defaultdict

import pytest
import torch

import understudy
from understudy import metrics
from test_metrics import fine_lower, fine_upper
from test_shadow import native, rms_inputs, run_rms_norm


def traffic(us):
    """Shadowed rms_norm (a native candidate), observed gemm and silu, in three phases."""
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "gemm": {"sample": 1.0}, "silu": {"sample": 0.5}},
               "hardware": {"profile": "H200"}, "report": {"window_s": 60}})
    for ph, repeat in (("decode", 3), ("prefill", 2), ("unknown", 1)):
        with understudy.phase(ph):
            run_rms_norm(rms_inputs(), repeat=repeat)
            for k in (4, 8, 16):
                torch.mm(torch.randn(k, 32), torch.randn(32, k))
            for n in range(repeat + 2):
                torch.nn.functional.silu(torch.randn(3 + n, 8))
    understudy.flush()


def live(top_keys):
    return metrics.UnderstudyCollector(top_keys=top_keys).read()


def of_report(rep, top_keys):
    return metrics.UnderstudyCollector(lambda: rep, top_keys=top_keys).read()


def coarse_of(report_buckets, bounds):
    """The report's buckets {index: count} summed into the exposed buckets
    (upper bounds `bounds` in ns, then +Inf), each report bucket wholly in one."""
    out = [0] * (len(bounds) + 1)
    for i, n in report_buckets.items():
        j = sum(1 for b in bounds if b <= fine_lower(i))
        assert j == len(bounds) or fine_upper(i) <= bounds[j], f"bound {bounds[j]} splits report bucket {i}"
        out[j] += n
    return out


@pytest.mark.parametrize("top_keys", [0, 2, 100])
def test_live_figures_are_the_reports(us, top_keys):
    traffic(us)
    rep = us.report(flush_timings=False)
    fast, slow = live(top_keys), of_report(rep, top_keys)
    assert fast["series"] == slow["series"]
    assert fast["operators"] == slow["operators"]
    assert fast["totals"] == slow["totals"]
    assert fast["window"]["operators"] == slow["window"]["operators"]
    assert fast["window"]["totals"] == slow["window"]["totals"]
    assert fast["pid"] == rep["pid"] and fast["started_unix_ms"] == rep["started_unix_ms"]
    # against the report's raw figures, summed by the test
    want = defaultdict(lambda: {"calls": 0, "timed": 0, "buckets": Counter(), "passed": 0, "served": 0})
    ranked = {}
    for o in rep["operators"]:
        order = sorted(o["shapes"], key=lambda s: (-s["est_device_time_ns"], -s["calls"], s["key"]))
        for rank, s in enumerate(order):
            key = (s["key"] if rank < top_keys else "other") if top_keys else None
            w = want[(o["name"], key, s["phase"])]
            w["calls"] += s["calls"]
            w["timed"] += s["timed"]
            w["buckets"].update({int(i): int(n) for i, n in s["latency_ns"]["buckets"]})
            if "shadow" in s:
                w["passed"] += s["shadow"]["passed"]
                w["served"] += s["rollout"]["served"]["production"]
            ranked[s["key"]] = rank
    got = {(s["operator"], s.get("key"), s["phase"]): s for s in fast["series"]}
    assert set(got) == set(want)
    for k, w in want.items():
        s = got[k]
        assert s["counters"]["calls"] == w["calls"], k
        assert sum(s["latency"]["buckets"]) == w["timed"], k
        assert s["latency"]["buckets"] == coarse_of(w["buckets"], fast["bounds_ns"]), k
        if k[0] == "rms_norm":
            assert s["counters"]["shadow_passed"] == w["passed"] and s["counters"]["served_production"] == w["served"]
    assert sum(s["counters"]["calls"] for s in fast["series"]) == rep["totals"]["calls"]
    by_name = {o["name"]: o for o in rep["operators"]}
    for o in fast["operators"]:
        r = by_name[o["name"]]
        assert o["weight"] == r["weight"] and o["S"] == r["roofline"]["S"]
        assert sum(o["routes"].values()) == len(r["shapes"])
    assert fast["totals"]["S_agg"] == rep["totals"]["S_agg"] is not None
    # the keys above their roof, the candidates' headline, who serves
    for o in fast["operators"]:
        rl = by_name[o["name"]]["roofline"]
        assert o.get("above_roof") == (rl["above_roof"] if rl["scored_shapes"] else None)
    assert fast["totals"]["candidate_routes"] == rep["totals"]["candidate_routes"] is not None
    assert fast["candidates"] == slow["candidates"]
    (c,) = fast["candidates"]
    rms = by_name["rms_norm"]
    assert (c["operator"], c["candidate"], c["kind"]) == ("rms_norm", rms["candidate"]["name"], rms["candidate"]["kind"])
    assert c["serving"] == {impl: sum(s["served_by"]["now"] == impl for s in rms["shapes"])
                            for impl in ("production", "candidate", "both")}
    assert {ph: x["S_agg"] for ph, x in fast["totals"]["phases"].items()} == \
        {ph: x["S_agg"] for ph, x in rep["totals"]["phases"].items()}


def test_counters_grow_across_a_disable_and_enable(us):
    """One reader over two sessions: each session's calls add to the series;
    nothing counted goes back, and a read without new calls changes nothing."""
    reader = metrics.UnderstudyCollector()
    made = Counter()
    for session in range(2):
        us.enable({"operators": {"silu": {"sample": 1.0}}})
        for ph, n in (("decode", 3 + session), ("prefill", 2)):
            with understudy.phase(ph):
                for _ in range(n):
                    torch.nn.functional.silu(torch.randn(4, 4))
            made[ph] += n
        first = reader.read()
        assert reader.read()["series"] == first["series"]
        us.disable()
    assert {s["phase"]: s["counters"]["calls"] for s in first["series"]} == made
    assert not any("key" in s for s in first["series"])


def test_reading_while_disabled_is_a_state_error(us):
    with pytest.raises(understudy.UnderstudyError) as e:
        metrics.UnderstudyCollector().read()
    assert e.value.name == "UST_ESTATE"


def test_a_report_of_another_scheme_is_refused(us):
    rep = {"histogram": {"scheme": "log10", "buckets": 3}, "operators": []}
    with pytest.raises(understudy.UnderstudyError, match="log10"):
        of_report(rep, 0)
