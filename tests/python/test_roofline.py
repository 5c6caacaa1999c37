"""The roofline scorer on live calls: T_SOL per timed call from the operator's
W/Q definitions and a hardware profile, S per shape key and operator, S_agg.

Ground truth: the roofline formulas written out here from the Atrex-Bench
definitions (rms_norm: W = 3MN + M, Q = bytes read + written), the same
floors evaluated here from the definitions' own W and Q text
(conftest.roofline_floor_ns), the profile's figures read from its JSON
file, and the calls' time: the test's _C ops take at least the time they are
held for (conftest.held_for) and at most what the test's clock measures
around each call. S = T_SOL / median latency, so S lies between T_SOL over
the measured median and T_SOL over the held time, widened by the
histogram's resolution (conftest.HIST_REL) where a median is read from it."""
import itertools
import json
import os
import statistics
import subprocess
import sys

import pytest
import torch

import understudy
from understudy.tables import format_report
from conftest import HIST_REL, ROOT, clocked, hardware_profile, held_for, roofline_floor_ns
from test_shadow import candidate_op, native, routes, run_rms_norm, rms_inputs, silu_and_mul, _rms

H200 = json.loads((ROOT / "problems" / "hardware" / "H200.json").read_text())


def tsol_rms_norm(m, n, esize, path):
    w = 3 * m * n + m
    q = esize * (m * n + n) + esize * m * n
    return max(w / H200["p_peak"][path], q / H200["b_peak"])


def rms_floor_ns(x, w, profile=H200):
    return roofline_floor_ns("rms_norm", "_C::rms_norm", {"out": x, "input": x, "weight": w, "eps": 1e-6}, profile)


def s_bounds(tsol_ns, held_ns, measured_ns):
    """Where S = T_SOL / (a median read from the histogram) must lie when each
    call took at least held_ns and at most what measured_ns lists."""
    return tsol_ns / (statistics.median(measured_ns) * (1 + HIST_REL)), tsol_ns / (held_ns * (1 - HIST_REL))


def clock_rms_norm(inputs, calls):
    """calls calls on each of inputs; {N: [ns each call took, by the test's clock]}."""
    return {x.shape[-1]: [clocked(run_rms_norm, [(x, w)], 1) for _ in range(calls)] for x, w in inputs}


def test_rms_norm_scored_against_a_forced_profile(us):
    shapes = ((7, 128), (64, 256), (1, 4096))
    inputs = rms_inputs(shapes=shapes)
    hold = 1_000_000
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}, "silu": {"sample": 1.0}},
               "hardware": {"profile": "H200"}})
    with held_for(hold):
        measured = clock_rms_norm(inputs, 5)
    x = torch.randn(32, 64, dtype=torch.float64)
    silu_ns = clocked(torch.nn.functional.silu, x)  # fp64 math has no path in the profile: weighted, never scored
    rep = us.report()
    us.disable()
    rs = {r["dims"]["N"]: r for r in routes(rep, "_C::rms_norm")}
    lo, hi, tsol_py = {}, {}, {}
    for (m, n), (xin, w) in zip(shapes, inputs):
        r = rs[n]["roofline"]
        assert r["hardware"] == "H200 SXM" and r["calls"] == 5
        want = tsol_rms_norm(m, n, 4, "fp32") * 1e9
        tsol_py[n] = rms_floor_ns(xin, w)  # the definition's own W and Q, evaluated here
        assert tsol_py[n] == pytest.approx(want, rel=1e-12)
        assert r["tsol_ns_mean"] == pytest.approx(want, abs=1e-3)
        assert r["time_ns_sum"] == rs[n]["latency_ns"]["sum"]  # every timed call was scored
        assert 5 * hold <= r["time_ns_sum"] <= sum(measured[n])
        lo[n], hi[n] = s_bounds(tsol_py[n], hold, measured[n])
        assert lo[n] <= r["S"] <= hi[n], (n, r["S"], lo[n], hi[n])
        assert 0 < r["S"] < 1  # a CPU is far below an H200's floor
    op = next(o for o in rep["operators"] if o["name"] == "rms_norm")
    assert op["roofline"]["scored_shapes"] == 3
    # S_i: the median over shape keys; each key's S within its bounds puts
    # the median between the medians of the bounds
    s_lo, s_hi = statistics.median(lo.values()), statistics.median(hi.values())
    assert s_lo <= op["roofline"]["S"] <= s_hi
    # S_weighted: T_SOL summed over the calls over their time summed (sums, not histogram medians)
    tsol_all = sum(5 * t for t in tsol_py.values())
    assert tsol_all / sum(map(sum, measured.values())) <= op["roofline"]["S_weighted"] <= tsol_all / (15 * hold)
    silu = next(o for o in rep["operators"] if o["name"] == "silu")
    assert silu["roofline"]["scored_shapes"] == 0 and silu["weight"] > 0
    (sr,) = silu["shapes"]
    assert sr["roofline"]["unscored"] == 1 and sr["roofline"]["S"] is None
    # S_agg = w_rms S_rms + w_silu * 0, rms_norm's weight at least its held
    # time's share against silu's measured time
    w_lo = 15 * hold / (15 * hold + silu_ns)
    assert w_lo <= op["weight"] <= 1
    assert w_lo * s_lo <= rep["totals"]["S_agg"] <= s_hi


def test_candidate_scored_only_where_it_verified(us):
    """Production is held, so its S is bounded above; the candidate runs in
    the same call after production, so each of its runs took at most the
    call's measured time less the held time, which bounds its S below. A
    second operator (silu_and_mul, held, no candidate) makes rms_norm's
    weight, and so S_agg_candidate, a share the test knows."""
    inputs = rms_inputs(shapes=((16, 512),))
    (x, w), xs = inputs[0], torch.randn(8, 2 * 128)
    hold, silu_hold = 2_000_000, 1_000_000
    tsol = rms_floor_ns(x, w)
    for lib, passes in (("rms_norm_cpu", True), ("rms_norm_cpu_wrong_tail", False)):
        cfg = {"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native(lib)},
                             "silu_and_mul": {"sample": 1.0}},
               "hardware": {"profile": "H200"}}
        us.enable(cfg)
        with held_for(hold):
            measured = clock_rms_norm(inputs, 4)[512]
        with held_for(silu_hold):
            silu_measured = sum(clocked(silu_and_mul, xs) for _ in range(3))
        rep = us.report()
        us.disable()
        (r,) = routes(rep, "_C::rms_norm")
        rms = next(o for o in rep["operators"] if o["name"] == "rms_norm")
        op = rms["roofline"]
        s_lo, s_hi = s_bounds(tsol, hold, measured)
        assert s_lo <= r["roofline"]["S"] <= s_hi
        if passes:
            assert r["shadow"]["passed"] == 4
            cand_most = statistics.median(t - hold for t in measured)
            s_cand_lo = tsol / (cand_most * (1 + HIST_REL))
            assert r["roofline"]["S_candidate"] >= s_cand_lo, (r["roofline"], s_cand_lo)
            assert op["S_candidate"] >= s_cand_lo and op["coverage"] == 1.0  # its one shape key verified
            w_lo = 4 * hold / (4 * hold + silu_measured)
            w_hi = sum(measured) / (sum(measured) + 3 * silu_hold)
            assert w_lo <= rms["weight"] <= w_hi
            assert rep["totals"]["scored_share"] == pytest.approx(1)  # both operators have a floor
            # silu_and_mul has no candidate: it counts 0
            assert w_lo * op["S_candidate"] <= rep["totals"]["S_agg_candidate"] <= w_hi * op["S_candidate"]
        else:
            assert r["shadow"]["failed"] == 1 and r["mode"] == "rolled_back"
            assert r["roofline"]["S_candidate"] is None
            assert op["S_candidate"] is None and op["coverage"] == 0  # nothing verified: no S, not 0
            assert rep["totals"]["S_agg_candidate"] == 0  # production scores there; the candidate counts 0


def test_candidate_partly_verified_is_scored_on_its_verified_keys(us):
    """A torch-op candidate right for N=512 and wrong for N=256: it is scored
    on the one key where it verified, and covers half the keys."""
    def half_right(out, input, weight, eps):
        out.copy_(_rms(input, weight, eps))
        if input.shape[-1] == 256:
            out.view(-1)[-1] += 1.0

    name = candidate_op("ust_test::rms_norm_half_right", half_right, "_C::rms_norm")
    inputs = rms_inputs(shapes=((16, 512), (16, 256)))
    hold = 2_000_000
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0,
                                          "candidate": {"torch_op": name, "target": "_C::rms_norm"}}},
               "hardware": {"profile": "H200"}})
    with held_for(hold):
        measured = clock_rms_norm(inputs, 3)
    rep = us.report()
    us.disable()
    rs = {r["dims"]["N"]: r for r in routes(rep, "_C::rms_norm")}
    assert rs[256]["mode"] == "rolled_back" and rs[256]["roofline"]["S_candidate"] is None
    assert rs[512]["mode"] == "shadow" and rs[512]["shadow"]["passed"] == 3
    x, w = inputs[0]
    s_cand_lo = rms_floor_ns(x, w) / (statistics.median(t - hold for t in measured[512]) * (1 + HIST_REL))
    op = rep["operators"][0]["roofline"]
    assert op["coverage"] == 0.5
    assert rs[512]["roofline"]["S_candidate"] >= s_cand_lo and op["S_candidate"] >= s_cand_lo
    for n, (x, w) in zip((512, 256), inputs):
        s_lo, s_hi = s_bounds(rms_floor_ns(x, w), hold, measured[n])
        assert s_lo <= rs[n]["roofline"]["S"] <= s_hi, n


def test_cpu_without_a_profile_is_not_scored(us):
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}}})
    run_rms_norm(rms_inputs(shapes=((4, 64),)), repeat=2)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    assert r["roofline"]["hardware"] is None and r["roofline"]["S"] is None and r["roofline"]["calls"] == 0
    (op,) = (o for o in rep["operators"] if o["name"] == "rms_norm")
    assert op["weight"] == 1 and op["roofline"]["S"] is None and op["roofline"]["S_weighted"] is None
    # unscored is null, not 0, and the text report says how to get scores
    assert rep["totals"]["S_agg"] is None and rep["totals"]["S_agg_candidate"] is None
    assert rep["totals"]["scored_share"] == 0
    assert "nothing scored" in format_report(rep) and "calibrate" in format_report(rep)


def test_s_agg_is_taken_over_the_scored_share(us, tmp_path):
    """An operator none of whose calls can be scored keeps its weight but
    has no S; S_agg is the weighted mean over the scored operators, with
    their share beside it (Sum w_i S_i alone would be pulled down by it)."""
    import shutil
    pdir = tmp_path / "problems"
    shutil.copytree(understudy.problems_dir(), pdir)
    sam = json.loads((pdir / "silu_and_mul.json").read_text())
    sam["bindings"][0]["roofline"]["vars"]["Bi"] = "bytes(x)"  # _C::silu_and_mul has no 'x': unscorable
    (pdir / "silu_and_mul.json").write_text(json.dumps(sam))
    us.enable({"operators": {"silu_and_mul": {"sample": 1.0}, "rms_norm": {"sample": 1.0}},
               "hardware": {"profile": "H200"}}, problems=pdir)
    with held_for(1_000_000):
        sam_hi = sum(clocked(silu_and_mul, torch.randn(8, 256)) for _ in range(3))
        rms_hi = clocked(run_rms_norm, rms_inputs(shapes=((16, 512),)), 3)
    rep = us.report()
    us.disable()
    ops = {o["name"]: o for o in rep["operators"]}
    sam_op, rms = ops["silu_and_mul"], ops["rms_norm"]
    # both held as long per call: each weight about a half, between the
    # bounds the held time (at least) and the test's clock (at most) give
    lo, eps = 3 * 1_000_000, 1e-9
    assert sam_op["roofline"]["S"] is None
    assert lo / (lo + rms_hi) - eps <= sam_op["weight"] <= sam_hi / (sam_hi + lo) + eps
    assert rms["roofline"]["S"] > 0
    assert lo / (lo + sam_hi) - eps <= rms["weight"] <= rms_hi / (rms_hi + lo) + eps
    tot = rep["totals"]
    assert tot["scored_share"] == pytest.approx(rms["weight"])
    assert tot["S_agg"] == pytest.approx(rms["roofline"]["S"])  # not w * S
    assert "S_agg production" in format_report(rep)


def test_unknown_profile_is_a_config_error(us):
    with pytest.raises(understudy.ConfigError, match="'hardware.profile' is 'H9000'"):
        us.enable({"hardware": {"profile": "H9000"}})
    with pytest.raises(understudy.ConfigError, match="unknown field 'hardware.profil'"):
        us.enable({"hardware": {"profil": "H200"}})


def test_phases_weight_and_score_separately(us):
    """Per phase, each operator's weight is its share of that phase's device
    time and S_agg sums weight times S: both checked against the bounds the
    held and measured times give, phase by phase (prefill's rms_norm is the
    busier operator there, decode's silu_and_mul)."""
    us.enable({"operators": {"rms_norm": {"sample": 1.0}, "silu_and_mul": {"sample": 1.0}},
               "hardware": {"profile": "H200"}})
    ms = 1_000_000
    # phase -> operator -> (calls, held ns, input)
    plan = {"prefill": {"rms_norm": (3, 4 * ms, rms_inputs(shapes=((64, 256),))[0]),
                        "silu_and_mul": (1, 2 * ms, torch.randn(64, 2 * 256))},
            "decode": {"rms_norm": (6, ms // 2, rms_inputs(shapes=((4, 256),))[0]),
                       "silu_and_mul": (6, 2 * ms, torch.randn(4, 2 * 256))}}
    run = {"rms_norm": lambda a: run_rms_norm([a], 1), "silu_and_mul": silu_and_mul}
    measured = {ph: {} for ph in plan}
    for ph, ops in plan.items():
        with understudy.phase(ph):
            for name, (n, hold, a) in ops.items():
                with held_for(hold):
                    measured[ph][name] = [clocked(run[name], a) for _ in range(n)]
    run_rms_norm([plan["decode"]["rms_norm"][2]], repeat=1)  # outside any phase: unknown
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

    def floor(name, a):
        if name == "rms_norm":
            return rms_floor_ns(*a)
        out = torch.empty(*a.shape[:-1], a.shape[-1] // 2)
        return roofline_floor_ns("silu_and_mul", "_C::silu_and_mul", {"result": out, "input": a}, H200)

    for ph, ops in plan.items():
        lo = {name: n * hold for name, (n, hold, _) in ops.items()}
        hi = {name: sum(measured[ph][name]) for name in ops}
        assert sum(lo.values()) <= tot["phases"][ph]["est_device_time_ns"] <= sum(hi.values()), ph
        got = {o["name"]: o["phases"][ph] for o in rep["operators"] if ph in o["phases"]}
        assert set(got) == set(ops)
        agg_lo = agg_hi = 0
        for name, (n, hold, a) in ops.items():
            others_lo, others_hi = sum(lo.values()) - lo[name], sum(hi.values()) - hi[name]
            w_lo, w_hi = lo[name] / (lo[name] + others_hi), hi[name] / (hi[name] + others_lo)
            assert w_lo <= got[name]["weight"] <= w_hi, (ph, name)
            s_lo, s_hi = s_bounds(floor(name, a), hold, measured[ph][name])
            assert s_lo <= got[name]["S"] <= s_hi, (ph, name)  # one shape key per phase
            agg_lo, agg_hi = agg_lo + w_lo * s_lo, agg_hi + w_hi * s_hi
        assert agg_lo <= tot["phases"][ph]["S_agg"] <= agg_hi, ph
        print(f"{ph}: S_agg {tot['phases'][ph]['S_agg']:.3g} in [{agg_lo:.3g}, {agg_hi:.3g}]")


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
    # its roofline is an estimate and, on the CPU, it runs one aten::mm a group
    # (2, 0 and 4 rows): it is floored by those, the level with exact rooflines;
    # the empty group's mm moves nothing
    expect["aten::_grouped_mm"] = sum(floor(2 * m * 16 * 8, "bf16", 2 * (m * 16 + 16 * 8 + m * 8)) for m in (2, 4))
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
        # T_SOL is kept in whole ps: grouped_mm's is the sum of its 3 callees', each rounded
        tol = 3e-3 if op == "aten::_grouped_mm" else 1e-3
        assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, abs=tol), op
    gm = routes(rep_mid, "aten::_grouped_mm")[0]["roofline"]
    assert "upper bound" in gm["estimate"] and gm["scored_by_callees"] == 1
    assert routes(rep_mid, "aten::mm")[0]["roofline"]["scored_by_callees"] == 0
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


def test_an_expanded_mask_is_read_from_its_storage(us):
    """torch hands the attention kernel a mask expanded over batch and heads
    (stride 0): its bytes are its storage's, not its logical size (which
    made T_SOL several times too high). Ground truth: the storage torch
    allocated for the mask."""
    g = torch.Generator().manual_seed(3)
    B, H, L, D = 1, 32, 512, 16
    q, k, v = (torch.randn(B, H, L, D, generator=g).to(torch.bfloat16) for _ in range(3))
    base = torch.randn(L, L, generator=g).to(torch.bfloat16)
    mask = base.expand(B, H, L, L)
    assert mask.stride()[:2] == (0, 0)
    us.enable({"operators": {"sdpa": {"mode": "observe", "sample": 1.0}}, "hardware": {"profile": "H200"}})
    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rep = us.report()
    (r,) = [s for o in rep["operators"] if o["name"] == "sdpa" for s in o["shapes"]]
    w = 2 * B * H * L * L * (D + D)
    qv = 2 * (q.numel() + k.numel() + v.numel() + B * H * L * D)
    want = max(w / H200["p_peak"]["bf16"], (qv + mask.untyped_storage().nbytes()) / H200["b_peak"]) * 1e9
    logical = max(w / H200["p_peak"]["bf16"], (qv + mask.numel() * 2) / H200["b_peak"]) * 1e9
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, abs=1e-3)
    assert logical > 4 * want  # what the logical size gave


@pytest.mark.parametrize("precision, path", [("tf32", "tf32"), ("ieee", "fp32")])
def test_a_float32_gemm_is_floored_by_the_path_torch_allows(us, precision, path):
    """torch may run float32 matrix products in TF32 (fp32_precision "tf32",
    as set_float32_matmul_precision("high") sets it): the floor is then the
    profile's tf32 peak, not fp32's (7x lower on the H200), read at the call.
    On the CPU the same rule through oneDNN's setting."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    before = torch.backends.mkldnn.matmul.fp32_precision
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "hardware": {"profile": "H200"}})
    try:
        torch.backends.mkldnn.matmul.fp32_precision = precision
        torch.mm(a, b)
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before
    (r,) = routes(us.report(), "aten::mm")
    w, q = 2 * 1024 ** 3, 4 * 3 * 1024 * 1024
    want = max(w / H200["p_peak"][path], q / H200["b_peak"]) * 1e9
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, abs=1e-3)


def test_grouped_mm_in_decode_reads_at_most_one_expert_per_row(us):
    """HF MoE decode: a few rows over many experts. At most min(G, rows)
    experts can be active, so only their weights count (counting all of
    them gave T_SOL 16x too high and S above 1); the rows' expert ids live on
    the device, so the bound is min(G, rows), not the exact active set."""
    g = torch.Generator().manual_seed(5)
    T, G, K, N = 4, 64, 256, 128
    xs = torch.randn(T, K, generator=g).to(torch.bfloat16)
    ws = torch.randn(G, K, N, generator=g).to(torch.bfloat16)
    offs = torch.tensor([1] * 3 + [T] * (G - 3), dtype=torch.int32)  # rows in experts 0, 1, 2 and 3
    us.enable({"operators": {"grouped_mm": {"mode": "observe", "sample": 1.0}}, "hardware": {"profile": "H200"}})
    torch._grouped_mm(xs, ws, offs=offs)
    (r,) = routes(us.report(), "aten::_grouped_mm")
    active = min(G, T)
    q = 2 * T * K + active * K * N * 2 + 4 * G + 2 * T * N
    want = max(2 * T * K * N / H200["p_peak"]["bf16"], q / H200["b_peak"]) * 1e9
    every = max(2 * T * K * N / H200["p_peak"]["bf16"], (q + (G - active) * K * N * 2) / H200["b_peak"]) * 1e9
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, abs=1e-3)
    assert every > 10 * want


def test_a_roofline_the_schema_cannot_feed_is_reported_per_binding_at_enable(us, tmp_path):
    """A definition whose roofline names an argument the op's schema lacks
    (an older build of a framework's op, say) scores none of its calls: the
    report says so per binding from enable on, not only a log line."""
    import shutil
    pdir = tmp_path / "problems"
    shutil.copytree(understudy.problems_dir(), pdir)
    silu = json.loads((pdir / "silu.json").read_text())
    silu["bindings"][1]["roofline"]["vars"]["B"] = "bytes(input)"  # aten::silu_ has no 'input'
    (pdir / "silu.json").write_text(json.dumps(silu))
    us.enable({"operators": {"silu": {"mode": "observe", "sample": 1.0}, "gemm": "observe"},
               "hardware": {"profile": "H200"}}, problems=pdir)
    rep = us.report()
    ops = {o["name"]: o for o in rep["operators"]}
    assert ops["silu"]["unscorable"] == {"aten::silu_": "its roofline names argument 'input', which the schema lacks"}
    assert "unscorable" not in ops["gemm"]
    x = torch.randn(4, 8)
    torch.nn.functional.silu(x)
    torch.nn.functional.silu(x.clone(), inplace=True)  # aten::silu_
    (ok,) = routes(us.report(), "aten::silu")
    (bad,) = routes(us.report(), "aten::silu_")
    assert ok["roofline"]["calls"] == 1 and bad["roofline"]["calls"] == 0 and bad["roofline"]["unscored"] == 1


# vLLM's attention as the dispatcher sees it: the layer's wrapper, whose
# schema carries only the new tokens (the sequences are in vLLM's forward
# context), and the FA2 kernel it calls with the paged cache and the
# sequences' lengths. Defined here with vLLM's schemas
# (tests/data/serving-schemas.json); the kernel computes nothing: only the
# floor is under test.
_SCHEMAS = json.loads((ROOT / "tests" / "data" / "serving-schemas.json").read_text())["schemas"]
_ATTN = {}  # the forward context the wrapper reads


def _define(qualname):
    ns, name = qualname.split("::")
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU") if _op_exists(qualname) else True:
        lib = _ATTN.setdefault("lib:" + ns, torch.library.Library(ns, "FRAGMENT"))
        if not _op_exists(qualname):
            lib.define(_SCHEMAS[qualname].split("::", 1)[1])
        return lib
    return None


def _op_exists(qualname):
    try:
        torch._C._get_schema(qualname, "")
        return True
    except RuntimeError:
        return False


def _varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
                max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
                window_size_right, softcap, return_softmax, gen):
    return [out]


def _unified_attention_with_output(query, key, value, output, layer_name, output_scale=None,
                                   output_block_scale=None, kv_cache_dummy_dep=None):
    m = _ATTN["metadata"]
    torch.ops._vllm_fa2_C.varlen_fwd(query, m["k_cache"], m["v_cache"], output, m["cu_seqlens_q"],
                                     m["cu_seqlens_k"], m["seqused_k"], None, m["block_table"], None,
                                     m["max_seqlen_q"], m["max_seqlen_k"], 0.0, 0.125, False, True, -1, -1, 0.0,
                                     False, None)


for _q, _fn in (("_vllm_fa2_C::varlen_fwd", _varlen_fwd),
                ("vllm::unified_attention_with_output", _unified_attention_with_output)):
    _lib = _define(_q)
    if _lib is not None:
        _lib.impl(_q.split("::")[1], _fn, "CPU")


@pytest.mark.parametrize("batch", ["decode", "prefill"])
def test_an_attention_wrapper_is_floored_by_the_kernel_it_calls(us, batch):
    """vLLM's attention wrapper has no exact roofline of its own (its schema
    lacks the sequences); the FA2 kernel it calls does. The wrapper's timed
    calls are floored by the kernel's floor: for a decode batch (64
    sequences, 4096 keys each) the wrapper's own estimate was 820x too low, for batched prefill (130 x 256) 65x too high (129x on W). Ground truth: the query-key
    pairs and bytes counted here from the sequences, bottom-right causal."""
    Hq, Hk, D, bs = 32, 8, 128, 16
    if batch == "decode":
        seqs = [(1, 4096)] * 64  # (new tokens, keys) per sequence
    else:
        seqs = [(256, 256)] * 130
    T = sum(q for q, _ in seqs)
    n = len(seqs)
    max_k = max(k for _, k in seqs)
    blocks_per_seq = -(-max_k // bs)
    bf = torch.bfloat16
    q = torch.empty(T, Hq, D, dtype=bf)
    kv = torch.empty(T, Hk, D, dtype=bf)
    out = torch.empty(T, Hq, D, dtype=bf)
    _ATTN["metadata"] = {
        "k_cache": torch.empty(n * blocks_per_seq, bs, Hk, D, dtype=bf),
        "v_cache": torch.empty(n * blocks_per_seq, bs, Hk, D, dtype=bf),
        "cu_seqlens_q": torch.tensor([0] + list(itertools.accumulate(q for q, _ in seqs)), dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0] + list(itertools.accumulate(k for _, k in seqs)), dtype=torch.int32),
        "seqused_k": torch.tensor([k for _, k in seqs], dtype=torch.int32),
        "block_table": torch.arange(n * blocks_per_seq, dtype=torch.int32).reshape(n, blocks_per_seq),
        "max_seqlen_q": max(q for q, _ in seqs), "max_seqlen_k": max_k}
    us.enable({"operators": {"unified_attention": {"mode": "observe", "sample": 1.0}},
               "hardware": {"profile": "H200"}})
    torch.ops.vllm.unified_attention_with_output(q, kv, kv, out, "layers.0.attn")
    rep = us.report()
    (r,) = routes(rep, "vllm::unified_attention_with_output")
    assert routes(rep, "_vllm_fa2_C::varlen_fwd") == []  # inside the wrapper: part of its call
    pairs = sum(qn * kn - qn * (qn - 1) // 2 for qn, kn in seqs)
    w = 2 * Hq * (D + D) * pairs
    read = (T * Hq * D * 2 + sum(kn for _, kn in seqs) * Hk * (D + D) * 2 + 4 * (n + 1) + 4 * n
            + 4 * n * blocks_per_seq)
    written = T * Hq * D * 2
    want = max(w / H200["p_peak"]["bf16"], (read + written) / H200["b_peak"]) * 1e9
    got = r["roofline"]["tsol_ns_mean"]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-3)
    assert r["roofline"]["scored_by_callees"] == 1 and r["roofline"]["calls"] == 1
    # what the wrapper's own estimate gave: the batch as one causal sequence without its cache
    own_w = (T + 1) * (q.numel() + out.numel())
    own = max(own_w / H200["p_peak"]["bf16"], (q.numel() * 2 + 2 * kv.numel() * 2 + out.numel() * 2)
              / H200["b_peak"]) * 1e9
    assert (want / own > 100) if batch == "decode" else (own / want > 50), (want, own)


def test_a_varlen_call_with_host_lengths_is_floored_by_each_sequence(us):
    """FA2 called directly on a mixed batch whose lengths are host tensors:
    the keyed call's view carries their data, and the floor is each
    sequence's (bottom-right causal pairs, keys, block-table entries), not
    the bound that takes every sequence as long as the longest. Ground truth:
    the definition's W and Q written out here over the batch."""
    Hq, Hk, D, bs = 32, 8, 128, 16
    seqs = [(1, 37), (1, 4096), (1, 900), (5, 300), (128, 128), (1, 1)]
    T, n = sum(q for q, _ in seqs), len(seqs)
    max_q, max_k = max(q for q, _ in seqs), max(k for _, k in seqs)
    width = -(-max_k // bs)
    bf = torch.bfloat16
    q = torch.empty(T, Hq, D, dtype=bf)
    cache = torch.empty(n * width, bs, Hk, D, dtype=bf)
    cu_q = torch.tensor([0] + list(itertools.accumulate(q for q, _ in seqs)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(k for _, k in seqs)), dtype=torch.int32)
    used = torch.tensor([k for _, k in seqs], dtype=torch.int32)
    table = torch.arange(n * width, dtype=torch.int32).reshape(n, width)
    us.enable({"operators": {"unified_attention": {"mode": "observe", "sample": 1.0}},
               "hardware": {"profile": "H200"}})
    for _ in range(3):
        torch.ops._vllm_fa2_C.varlen_fwd(q, cache, cache, torch.empty_like(q), cu_q, cu_k, used, None, table, None,
                                         max_q, max_k, 0.0, 0.125, False, True, -1, -1, 0.0, False, None)
    rep = us.report()
    (r,) = routes(rep, "_vllm_fa2_C::varlen_fwd")
    pairs = sum(qn * kn - qn * (qn - 1) // 2 for qn, kn in seqs)
    w = 2 * Hq * (D + D) * pairs
    read = (T * Hq * D * 2 + sum(k for _, k in seqs) * Hk * (D + D) * 2 + 4 * (n + 1) + 4 * n
            + 4 * sum(-(-k // bs) for _, k in seqs))
    want = max(w / H200["p_peak"]["bf16"], (read + T * Hq * D * 2) / H200["b_peak"]) * 1e9
    assert r["roofline"]["calls"] == 3
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, rel=1e-9, abs=1e-3)
    # the bound (every sequence as long as the longest) would read 4.5 times the keys
    assert n * max_k > 4 * sum(k for _, k in seqs)


# A profile far below the host for fp32 (every rms_norm call beats its floor)
# and above it for bf16 (a silu_and_mul call held for 0.2 ms floors at most
# a few hundred ns).
LOW_FP32 = {"schema_version": 1, "name": "low fp32 ceilings", "match": ["no such device"],
            "p_peak": {"fp32": 1e3, "bf16": 1e11}, "b_peak": 1e12, "source": "a test's made-up figures"}


def test_a_key_above_its_roof_is_flagged_in_the_report_table_page_and_metrics(us, tmp_path):
    """A shape key measured faster than its floor (S > 1, by production or
    the candidate) means the profile is below what the device achieved. The
    report flags it per key (roofline.above_roof), counts it per operator
    and in total, and the text table, the HTML page and the metrics show the
    flag wherever such an S appears; keys below their roof are not flagged.

    Ground truth: each call's floor evaluated here from the definitions'
    W and Q over the test's arguments and the profile's figures, against the
    time the test's clock measured around the call (which bounds the timed
    one from above) for rms_norm, and against the time silu_and_mul's calls
    are held for (which bounds it from below)."""
    from html.parser import HTMLParser

    from understudy.html import render
    from understudy.metrics import metrics_text
    from understudy.tables import ABOVE_ROOF_WORDS, format_report

    hw = tmp_path / "hw"
    hw.mkdir()
    (hw / "low.json").write_text(json.dumps(LOW_FP32))
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu_and_mul": {"sample": 1.0}},
               "hardware": {"dir": str(hw), "profile": LOW_FP32["name"]}})
    inputs = rms_inputs(shapes=((8, 128), (64, 256), (3, 64)))
    measured = clock_rms_norm(inputs, 3)
    xs = [torch.randn(n, 64).to(torch.bfloat16) for n in (4, 32)]
    hold = 200_000
    with held_for(hold):
        for x in xs:
            for _ in range(3):
                silu_and_mul(x)
    rep = us.report()
    us.disable()

    want_above = set()
    for x, w in inputs:
        floor_ns = rms_floor_ns(x, w, LOW_FP32)
        assert floor_ns > max(measured[x.shape[-1]])  # every call of the key beat its floor
        (s,) = [s for s in routes(rep, "_C::rms_norm") if s["dims"]["N"] == x.shape[-1]]
        want_above.add(s["key"])
    for x in xs:
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype)
        assert roofline_floor_ns("silu_and_mul", "_C::silu_and_mul", {"result": out, "input": x}, LOW_FP32) < hold
    shapes = {s["key"]: s for o in rep["operators"] for s in o["shapes"]}
    assert {k for k, s in shapes.items() if s["roofline"]["above_roof"]} == want_above
    assert len(routes(rep, "_C::silu_and_mul")) == 2
    assert all(0 < s["roofline"]["S"] < 1 for s in routes(rep, "_C::silu_and_mul"))
    ops = {o["name"]: o for o in rep["operators"]}
    assert ops["rms_norm"]["roofline"]["above_roof"] == 3 and ops["silu_and_mul"]["roofline"]["above_roof"] == 0
    assert rep["totals"]["above_roof"] == 3 and rep["totals"]["S_agg"] > 1

    # the text table: the flag's line, and every S above 1 marked
    text = format_report(rep)
    assert f"3 shape keys measured above their roof (S > 1): {ABOVE_ROOF_WORDS}" in text
    rows = [ln.split() for ln in text.splitlines()]
    for k, s in shapes.items():
        (row,) = [r for r in rows if r and r[0] == k]
        assert row[-1] == f"{s['roofline']['S']:.3f}" + ("!" if k in want_above else ""), row
    (rms_row,) = [r for r in rows if r and r[0] == "rms_norm"]
    assert rms_row[-1].endswith("!")
    assert f"S_agg production {rep['totals']['S_agg']:.3f}!" in text

    # the page: the flag with its count; the points above their roof marked
    # (both arms of the rms_norm keys); every S cell above 1 marked
    class Page(HTMLParser):
        """The flag's count, the chart's points and the tables' rows (cells' text)."""
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.flag, self.points, self.rows, self.in_td = None, {}, [], False

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            classes = (a.get("class") or "").split()
            if "above-roof-flag" in classes:
                self.flag = a["data-count"]
            if "point" in classes:
                self.points[(a["data-key"], a["data-series"])] = a.get("data-above-roof") == "1"
            if tag == "tr":
                self.rows.append((a, []))
            if tag == "td" and self.rows:
                self.rows[-1][1].append("")
                self.in_td = True

        def handle_endtag(self, tag):
            if tag == "td":
                self.in_td = False

        def handle_data(self, data):
            if self.in_td:
                self.rows[-1][1][-1] += data

    page = Page()
    page.feed(render(rep))
    assert page.flag == "3"
    assert page.points == {(k, series): k in want_above for k in shapes
                           for series in (("production", "candidate") if k in want_above else ("production",))}
    shape_s = {a["data-key"]: cells[10] for a, cells in page.rows if a.get("class") == "shape"}
    assert shape_s == {k: f"{s['roofline']['S']:.3f}" + ("!" if k in want_above else "") for k, s in shapes.items()}
    op_s = {a["data-op"]: cells[5:7] for a, cells in page.rows if "data-op" in a and a.get("class") != "candidate"}
    assert op_s["rms_norm"] == [f"{ops['rms_norm']['roofline'][f]:.3f}!" for f in ("S", "S_candidate")]
    assert op_s["silu_and_mul"][0] == f"{ops['silu_and_mul']['roofline']['S']:.3f}"

    # the metrics: each operator's keys above their roof
    from prometheus_client.parser import text_string_to_metric_families
    got = {s.labels["operator"]: s.value for f in text_string_to_metric_families(metrics_text(rep))
           for s in f.samples if s.name == "understudy_operator_above_roof_keys"}
    assert got == {"rms_norm": 3, "silu_and_mul": 0}

    # `understudy merge` says so too, where it prints the merged S_agg
    paths = []
    for i in range(2):
        r = json.loads(json.dumps(rep))
        r["pid"] = (rep.get("pid") or 0) + i
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    out = subprocess.run([sys.executable, "-m", "understudy", "merge", str(tmp_path / "m.json"), *map(str, paths)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert out.returncode == 0, out.stderr
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["totals"]["above_roof"] == 3
    assert f"S_agg {merged['totals']['S_agg']:.4f}!" in out.stdout
    assert f"3 shape keys above the roof: {ABOVE_ROOF_WORDS}" in out.stdout


def test_the_candidates_headline_compares_both_arms_on_the_candidates_keys(us):
    """S_agg_candidate counts 0 for every operator without a candidate, so a
    candidate on a small share of the time reads as far worse than
    production. The headline compares the arms where both ran: S of the
    candidate over its own scored keys beside production's S over the same
    keys, each weighted by the keys' estimated device time, with the share
    of the device time they hold; computed here from the keys' own S,
    S_candidate and device time, and shown so by the text report, the
    verdicts, the page and the metrics."""
    from html.parser import HTMLParser

    from prometheus_client.parser import text_string_to_metric_families

    from understudy.html import render
    from understudy.metrics import metrics_text
    from understudy.tables import format_verdicts

    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu_and_mul": {"sample": 1.0}},
               "hardware": {"profile": "H200"}})
    with held_for(100_000):
        run_rms_norm(rms_inputs(shapes=((8, 128), (64, 256), (3, 64))), repeat=3)
    with held_for(2_000_000):  # most of the time: an operator without a candidate
        for n in (4, 32):
            for _ in range(3):
                silu_and_mul(torch.randn(n, 64))
    rep = us.report()
    us.disable()

    keys = [s for s in routes(rep, "_C::rms_norm") if s["roofline"]["S_candidate"] is not None]
    assert len(keys) == 3
    t = sum(s["est_device_time_ns"] for s in keys)
    want = {"routes": 3, "device_share": t / rep["totals"]["est_device_time_ns"],
            "S_candidate": sum(s["est_device_time_ns"] * s["roofline"]["S_candidate"] for s in keys) / t,
            "S_production": sum(s["est_device_time_ns"] * s["roofline"]["S"] for s in keys) / t}
    got = rep["totals"]["candidate_routes"]
    assert got == pytest.approx(want, rel=1e-12)
    (rms,) = [o for o in rep["operators"] if o["name"] == "rms_norm"]
    assert rms["roofline"]["candidate_routes"] == pytest.approx(want, rel=1e-12)
    # S_agg_candidate: rms_norm's S_candidate at its weight, silu_and_mul's time counting 0 (the share of
    # each comes from the calls' measured times, so it is read from the report, not assumed)
    assert 0 < rms["weight"] < 1 and want["device_share"] == pytest.approx(rms["weight"], rel=1e-9)
    assert rep["totals"]["S_agg_candidate"] == pytest.approx(rms["weight"] * rms["roofline"]["S_candidate"], rel=1e-9)

    line = (f"candidates on their own routes: S {want['S_candidate']:.3f} against production's "
            f"{want['S_production']:.3f} on the same 3 shape keys ({100 * want['device_share']:.1f} % of device time)")
    text = format_report(rep)
    assert line in text and "candidates 0." not in text
    assert format_verdicts(rep).splitlines()[0] == line

    class Headline(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.field, self.got = None, {}

        def handle_starttag(self, tag, attrs):
            self.field = dict(attrs).get("data-field") if tag == "b" else self.field

        def handle_endtag(self, tag):
            self.field = None if tag == "b" else self.field

        def handle_data(self, data):
            if self.field:
                self.got[self.field] = data

    page = Headline()
    page.feed(render(rep).split('<p class="headline">', 1)[1].split("</p>", 1)[0])
    assert page.got == {"S_candidate": f"{want['S_candidate']:.3f}", "S_production": f"{want['S_production']:.3f}"}

    smp = {s.name: s.value for f in text_string_to_metric_families(metrics_text(rep)) for s in f.samples}
    assert smp["understudy_candidate_routes_roofline_ratio"] == pytest.approx(want["S_candidate"], rel=1e-12)
    assert smp["understudy_candidate_routes_production_roofline_ratio"] == pytest.approx(want["S_production"],
                                                                                        rel=1e-12)
    assert smp["understudy_candidate_routes_device_time_ratio"] == pytest.approx(want["device_share"], rel=1e-12)
