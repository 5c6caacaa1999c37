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
    x = torch.randn(32, 64, dtype=torch.float64)
    torch.nn.functional.silu(x)  # fp64 math has no path in the profile: weighted, never scored
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
    (sr,) = silu["shapes"]
    assert sr["roofline"]["unscored"] == 1 and sr["roofline"]["S"] is None
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


def test_torch_ops_scored(us):
    """The torch ops an HF model runs, scored on the CPU against a forced
    H200 profile; W and Q written out here from the shapes (attention's
    query-key pairs counted from torch's own causal mask)."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    def floor(w, path, q):
        return max(w / H200["p_peak"][path], q / H200["b_peak"]) * 1e9

    us.enable({"operators": {name: {"mode": "observe", "sample": 1.0}
                             for name in ("gemm", "sdpa", "silu", "topk", "grouped_mm")},
               "hardware": {"profile": "H200"}})
    expect = {}  # op display -> T_SOL in ns
    a, b, bias = rnd(12, 40), rnd(40, 24), rnd(24)
    torch.mm(a, b)
    expect["aten::mm"] = floor(2 * 12 * 40 * 24, "fp32", 4 * (12 * 40 + 40 * 24 + 12 * 24))
    torch.nn.functional.linear(a, b.t().contiguous(), bias)  # addmm(bias, a, w.t())
    expect["aten::addmm"] = floor(2 * 12 * 40 * 24 + 12 * 24, "fp32", 4 * (24 + 12 * 40 + 40 * 24 + 12 * 24))
    torch.bmm(rnd(3, 5, 8), rnd(3, 8, 6))
    expect["aten::bmm"] = floor(2 * 3 * 5 * 8 * 6, "fp32", 4 * (3 * 5 * 8 + 3 * 8 * 6 + 3 * 5 * 6))
    x = rnd(16, 96, dtype=torch.bfloat16)
    torch.nn.functional.silu(x)
    expect["aten::silu"] = floor(4 * x.numel(), "bf16", 2 * 2 * x.numel())
    logits = rnd(4, 1000)
    torch.topk(logits, 50)
    expect["aten::topk"] = floor(logits.numel(), "fp32", 4 * logits.numel() + 4 * 50 * (4 + 8))
    xs, ws = rnd(6, 16, dtype=torch.bfloat16), rnd(3, 16, 8, dtype=torch.bfloat16)
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)
    torch._grouped_mm(xs, ws, offs=offs)
    expect["aten::_grouped_mm"] = floor(2 * 6 * 16 * 8, "bf16", 2 * (6 * 16 + 3 * 16 * 8) + 4 * 3 + 2 * 6 * 8)
    rep_mid = us.report()
    sdpa = []
    for causal in (False, True):
        # Compute-bound on the H200 even when causal; equal head dims take the
        # CPU flash kernel (others the math path, a composite).
        B, H, L, S, D, Dv = 2, 4, 200, 232, 16, 16
        q, k, v = rnd(B, H, L, D), rnd(B, H, S, D), rnd(B, H, S, Dv)
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        pairs = int(torch.ones(L, S).tril().sum()) if causal else L * S
        sdpa.append(floor(2 * B * H * pairs * (D + Dv), "fp32", 4 * (q.numel() + k.numel() + v.numel() + B * H * L * Dv)))
    rep = us.report()
    us.disable()
    for op, want in expect.items():
        (r,) = routes(rep_mid, op)
        assert r["roofline"]["calls"] == 1, op
        assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, abs=1e-3), op  # T_SOL is kept in ps
    gm = routes(rep_mid, "aten::_grouped_mm")[0]["roofline"]
    assert "upper bound" in gm["estimate"]
    assert "estimate" not in routes(rep_mid, "aten::mm")[0]["roofline"]
    attn = [s for o in rep["operators"] if o["name"] == "sdpa" for s in o["shapes"]]
    assert len(attn) == 2
    got = sorted(s["roofline"]["tsol_ns_mean"] for s in attn)
    assert got == pytest.approx(sorted(sdpa), abs=1e-3)
    assert sdpa[1] < 0.5 * sdpa[0]  # the causal mask keeps fewer than half the pairs (L < S)


def test_host_cpu_profile_picked_by_its_model_name(us, tmp_path):
    """A profile for the host CPU (as `understudy calibrate` writes one, named
    after the CPU's model name) in the hardware directory scores CPU calls
    without hardware.profile."""
    from understudy.calibrate import _cpu_name
    name = _cpu_name()
    if not name or name == "host CPU":
        pytest.skip("no CPU model name in /proc/cpuinfo")
    hw = tmp_path / "hardware"
    hw.mkdir()
    (hw / "host.json").write_text(json.dumps({
        "schema_version": 1, "name": "this host (test)", "match": [name[:63]],
        "p_peak": {"fp32": 1e12, "bf16": 2e12}, "b_peak": 1e11, "source": "a test's made-up figures"}))
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}}, "hardware": {"dir": str(hw)}})
    run_rms_norm(rms_inputs(shapes=((64, 256),)), repeat=3)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    m, n = 64, 256
    w, q = 3 * m * n + m, 4 * (m * n + n) + 4 * m * n
    assert r["roofline"]["hardware"] == "this host (test)" and r["roofline"]["calls"] == 3
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(max(w / 1e12, q / 1e11) * 1e9, abs=1e-3)
