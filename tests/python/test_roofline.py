"""The roofline scorer on live calls: T_SOL per timed call from the operator's
W/Q definitions and a hardware profile, S per shape key and operator, S_agg.

Ground truth: the roofline formulas written out here from the Atrex-Bench
definitions (rms_norm: W = 3MN + M, Q = bytes read + written) and the
profile's figures read from its JSON file."""
import json

import pytest
import torch

import understudy
from conftest import ROOT
from test_shadow import native, routes, run_rms_norm, rms_inputs

H200 = json.loads((ROOT / "problems" / "hardware" / "H200.json").read_text())


def tsol_rms_norm(m, n, esize, path):
    w = 3 * m * n + m
    q = esize * (m * n + n) + esize * m * n
    return max(w / H200["p_peak"][path], q / H200["b_peak"])


def test_rms_norm_scored_against_a_forced_profile(us):
    shapes = ((7, 128), (64, 256), (1, 4096))
    inputs = rms_inputs(shapes=shapes)
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}, "silu": {"sample": 1.0}},
               "hardware": {"profile": "H200"}})
    run_rms_norm(inputs, repeat=5)
    x = torch.randn(32, 64)
    torch.nn.functional.silu(x)  # an operator without a roofline: weighted, never scored
    rep = us.report()
    us.disable()
    rs = {r["dims"]["N"]: r for r in routes(rep, "_C::rms_norm")}
    s_values = []
    for m, n in [(7, 128), (64, 256), (1, 4096)]:
        r = rs[n]["roofline"]
        assert r["hardware"] == "H200 SXM" and r["calls"] == 5
        want = tsol_rms_norm(m, n, 4, "fp32") * 1e9
        assert r["tsol_ns_mean"] == pytest.approx(want, abs=1e-3)
        assert r["time_ns_sum"] == rs[n]["latency_ns"]["sum"]  # every timed call was scored
        # S_j = T_SOL / median(T) (DESIGN.md), T_SOL the mean over the shape key's calls
        assert r["S"] == pytest.approx(r["tsol_ns_mean"] / rs[n]["latency_ns"]["p50"], rel=1e-9)
        assert 0 < r["S"] < 1  # a CPU is far below an H200's floor
        s_values.append(r["S"])
    op = next(o for o in rep["operators"] if o["name"] == "rms_norm")
    s_values.sort()
    assert op["roofline"]["scored_shapes"] == 3
    assert op["roofline"]["S"] == pytest.approx(s_values[1], rel=1e-12)  # median over shape keys
    tsol = sum(rs[n]["roofline"]["tsol_ns_mean"] * 5 for n in rs)
    time = sum(rs[n]["roofline"]["time_ns_sum"] for n in rs)
    assert op["roofline"]["S_weighted"] == pytest.approx(tsol / time, rel=1e-9)
    silu = next(o for o in rep["operators"] if o["name"] == "silu")
    assert silu["roofline"]["scored_shapes"] == 0 and silu["weight"] > 0
    s_agg = sum(o["weight"] * o["roofline"]["S"] for o in rep["operators"])
    assert rep["totals"]["S_agg"] == pytest.approx(s_agg, rel=1e-12)
    assert rep["totals"]["S_agg"] == pytest.approx(op["weight"] * op["roofline"]["S"], rel=1e-12)


def test_candidate_scored_only_where_it_verified(us):
    inputs = rms_inputs(shapes=((16, 512),))
    for lib, passes in (("rms_norm_cpu", True), ("rms_norm_cpu_wrong_tail", False)):
        us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native(lib)}},
                   "hardware": {"profile": "H200"}})
        run_rms_norm(inputs, repeat=4)
        rep = us.report()
        us.disable()
        (r,) = routes(rep, "_C::rms_norm")
        op = rep["operators"][0]["roofline"]
        if passes:
            assert r["roofline"]["S_candidate"] > 0
            assert op["S_candidate"] == pytest.approx(r["roofline"]["S_candidate"]) and op["coverage"] == 1.0
            assert rep["totals"]["S_agg_candidate"] == pytest.approx(op["S_candidate"] * rep["operators"][0]["weight"])
        else:
            assert r["roofline"]["S_candidate"] is None
            assert op["S_candidate"] == 0 and op["coverage"] == 0
            assert rep["totals"]["S_agg_candidate"] == 0
        assert r["roofline"]["S"] > 0


def test_cpu_without_a_profile_is_not_scored(us):
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}}})
    run_rms_norm(rms_inputs(shapes=((4, 64),)), repeat=2)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    assert r["roofline"]["hardware"] is None and r["roofline"]["S"] is None and r["roofline"]["calls"] == 0
    assert rep["totals"]["S_agg"] == 0


def test_unknown_profile_is_a_config_error(us):
    with pytest.raises(understudy.ConfigError, match="'hardware.profile' is 'H9000'"):
        us.enable({"hardware": {"profile": "H9000"}})
    with pytest.raises(understudy.ConfigError, match="unknown field 'hardware.profil'"):
        us.enable({"hardware": {"profil": "H200"}})


def test_phases_weight_and_score_separately(us):
    import torch
    us.enable({"operators": {"rms_norm": {"sample": 1.0}, "silu": {"sample": 1.0}},
               "hardware": {"profile": "H200"}})
    prefill, decode = rms_inputs(shapes=((512, 256),)), rms_inputs(shapes=((4, 256),))
    with understudy.phase("prefill"):
        run_rms_norm(prefill, repeat=3)
        torch.nn.functional.silu(torch.randn(512, 256))
    with understudy.phase("decode"):
        run_rms_norm(decode, repeat=6)
        for _ in range(6):
            torch.nn.functional.silu(torch.randn(4, 256))
    run_rms_norm(decode, repeat=1)  # outside any phase: unknown
    with pytest.raises(ValueError):
        understudy.set_phase("training")
    rep = us.report()
    us.disable()
    rs = routes(rep, "_C::rms_norm")
    by_phase = {r["phase"]: r for r in rs}
    assert set(by_phase) == {"prefill", "decode", "unknown"}
    assert by_phase["prefill"]["key"].endswith("|prefill") and by_phase["prefill"]["calls"] == 3
    assert by_phase["decode"]["calls"] == 6 and by_phase["unknown"]["calls"] == 1
    tot = rep["totals"]
    assert sum(p["est_device_time_ns"] for p in tot["phases"].values()) == pytest.approx(tot["est_device_time_ns"])
    for ph in ("prefill", "decode"):
        ops = [o for o in rep["operators"] if ph in o["phases"]]
        assert {o["name"] for o in ops} == {"rms_norm", "silu"}
        assert sum(o["phases"][ph]["weight"] for o in ops) == pytest.approx(1.0)
        s_agg = sum(o["phases"][ph]["weight"] * o["phases"][ph]["S"] for o in ops)
        assert tot["phases"][ph]["S_agg"] == pytest.approx(s_agg, rel=1e-12)
        rms = next(o for o in ops if o["name"] == "rms_norm")["phases"][ph]
        assert rms["S"] == pytest.approx(by_phase[ph]["roofline"]["S"], rel=1e-12)  # one shape key per phase
