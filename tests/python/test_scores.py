"""Floors and aggregate scores checked against figures worked out here by hand.

Each test writes W (FLOPs) and Q (bytes) of the calls it makes from the
tensors' shapes, dtypes and values in Python (float64), independently of the
definitions in problems/ and of the library's evaluator, and compares the
report's floor, shares and nulls with them. Calls are made on the CPU and
floored against the shipped H200 profile (hardware.profile forces it)."""
import itertools
import re
import json

import pytest
import torch

import understudy
from conftest import ROOT, series_labels
from test_shadow import routes

H200 = json.loads((ROOT / "problems" / "hardware" / "H200.json").read_text())
PEAK, BW = H200["p_peak"], H200["b_peak"]


def floor_ns(w, path, q):
    """T_SOL in ns: the hybrid rule, max(W / P_peak, Q / B_peak)."""
    return max(w / PEAK[path], q / BW) * 1e9


def observe(us, *operators, **extra):
    cfg = {"operators": {name: {"mode": "observe", "sample": 1.0} for name in operators},
           "hardware": {"profile": "H200"}}
    cfg.update(extra)
    us.enable(cfg)


# ---- zero-size matrix products ------------------------------------------------------

def test_grouped_mm_with_empty_groups_is_floored_by_its_rows_alone(us):
    """torch's CPU _grouped_mm runs one aten::mm a group, empty groups
    included: 128 experts, 5 with rows. An empty group's mm multiplies
    nothing and moves nothing, so it adds nothing to the floor (it was
    booked a whole expert's weights: 25x the true floor here)."""
    G, K, N = 128, 256, 128
    rows = {3: 1, 17: 2, 40: 3, 77: 2, 120: 2}  # group -> rows
    counts = [rows.get(g, 0) for g in range(G)]
    T = sum(counts)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(T, K, generator=g).to(torch.bfloat16)
    ws = torch.randn(G, K, N, generator=g).to(torch.bfloat16)
    offs = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32)
    observe(us, "grouped_mm", "gemm")  # gemm binds the mm calls it floors by
    torch._grouped_mm(xs, ws, offs=offs)
    (r,) = routes(us.report(), "aten::_grouped_mm")
    e = 2  # bf16
    want = sum(floor_ns(2 * m * K * N, "bf16", e * (m * K + K * N + m * N)) for m in rows.values())
    before = want + (G - len(rows)) * K * N * e / BW * 1e9  # each empty group booked its expert's weights
    assert r["roofline"]["scored_by_callees"] == 1
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, abs=len(rows) * 1e-3)
    assert before > 20 * want


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_a_product_with_no_rows_or_columns_moves_nothing(us, op):
    """M = 0 or N = 0: no FLOP and no byte must move (the other operand was
    booked whole); K = 0: the M x N result is still written (zeros, or the
    bias for addmm), nothing else."""
    K, N, M = 64, 48, 16
    a0, w = torch.empty(0, K), torch.randn(K, N)
    aK, wK = torch.randn(M, 0), torch.randn(0, N)
    bias = torch.randn(N)
    observe(us, "gemm")
    if op == "mm":
        torch.mm(a0, w)  # M = 0
        torch.mm(torch.randn(M, K), torch.empty(K, 0))  # N = 0
        torch.mm(aK, wK)  # K = 0
        k_floor = floor_ns(0, "fp32", 4 * M * N)
    elif op == "addmm":
        torch.addmm(bias, a0, w)
        torch.addmm(torch.empty(0), torch.randn(M, K), torch.empty(K, 0))
        torch.addmm(bias, aK, wK)  # the bias broadcast: read N, written M x N, M*N FLOPs (scale and add)
        k_floor = floor_ns(M * N, "fp32", 4 * N + 4 * M * N)
    else:
        torch.bmm(torch.empty(3, 0, K), torch.randn(3, K, N))
        torch.bmm(torch.randn(3, M, K), torch.empty(3, K, 0))
        torch.bmm(torch.randn(3, M, 0), torch.randn(3, 0, N))
        k_floor = floor_ns(0, "fp32", 4 * 3 * M * N)
    rs = routes(us.report(), "aten::" + op)
    assert len(rs) == 3
    by_k = {r["dims"]["K"]: r for r in rs}
    for k, r in by_k.items():
        rf = r["roofline"]
        assert rf["work_calls"] == 1, r["key"]
        if k == 0:
            assert rf["tsol_ns_mean"] == pytest.approx(k_floor, abs=1e-3), r["key"]
            continue
        # nothing to do: W = Q = 0, a floor of 0, which scores nothing (S null, not 0)
        assert rf["flops_sum"] == 0 and rf["bytes_sum"] == 0, r["key"]
        assert rf["calls"] == 0 and rf["S"] is None and rf["unscored"] == 0, r["key"]


# ---- bytes written: the output's own size ---------------------------------------------

def test_an_expanded_input_is_read_from_its_storage_and_its_output_written_whole(us):
    """silu and layer_norm of an input expanded over its rows (stride 0):
    the input is read from its storage (once a stored element, the least
    that must move), but the output is a full M x N tensor and is written
    whole (the written bytes were taken from the input's storage: 1/M of
    them)."""
    M, N = 64, 1024
    g = torch.Generator().manual_seed(2)
    row = torch.randn(1, N, generator=g)
    x = row.expand(M, N)
    assert x.stride() == (0, 1)
    w, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
    observe(us, "silu", "layer_norm")
    y = torch.nn.functional.silu(x)
    z = torch.nn.functional.layer_norm(x, (N,), w, b)
    assert y.shape == z.shape == (M, N) and y.stride() == (N, 1)
    rep = us.report()
    e = 4  # float32
    want_silu = floor_ns(4 * M * N, "fp32", N * e + M * N * e)
    # layer_norm: 5 FLOPs an element, one each for weight and bias; the input
    # row, weight and bias read; the output and a float32 mean and rstd a row written
    want_ln = floor_ns(7 * M * N, "fp32", N * e + 2 * N * e + M * N * e + 8 * M)
    (rs,) = routes(rep, "aten::silu")
    (rl,) = routes(rep, "aten::native_layer_norm")
    assert rs["roofline"]["tsol_ns_mean"] == pytest.approx(want_silu, abs=1e-3)
    assert rl["roofline"]["tsol_ns_mean"] == pytest.approx(want_ln, abs=1e-3)
    assert rs["roofline"]["bytes_sum"] == N * e + M * N * e
    assert rl["roofline"]["bytes_sum"] == 3 * N * e + M * N * e + 8 * M


def test_an_out_argument_is_written_whole(us):
    """silu.out into a fresh M x N out from an expanded input: the bytes
    written are out's, all of them."""
    M, N = 32, 512
    x = torch.randn(1, N).expand(M, N)
    out = torch.empty(M, N)
    observe(us, "silu")
    torch.nn.functional.silu(x, inplace=False)
    torch.ops.aten.silu.out(x, out=out)
    rep = us.report()
    for r in routes(rep, "aten::silu") + routes(rep, "aten::silu.out"):
        assert r["roofline"]["bytes_sum"] == N * 4 + M * N * 4, r["key"]


# ---- the scored share, per shape key ---------------------------------------------------

def test_scored_share_counts_the_keys_that_were_scored(us):
    """silu on float32 (a path in the profile: scored) and on float64 (no
    path: unscored), and a float32 GEMM: the share of the device time that
    was scored is the scored keys' share, not the share of every operator
    one of whose keys was scored (which counted silu's float64 time)."""
    g = torch.Generator().manual_seed(3)
    x32 = torch.randn(64, 256, generator=g)
    x64 = torch.randn(1024, 2048, generator=g, dtype=torch.float64)  # the busiest key, unscored
    a, b = torch.randn(64, 128, generator=g), torch.randn(128, 64, generator=g)
    observe(us, "silu", "gemm")
    with understudy.phase("decode"):
        for _ in range(3):
            torch.nn.functional.silu(x32)
            torch.nn.functional.silu(x64)
            torch.mm(a, b)
    rep = us.report()
    shapes = [s for o in rep["operators"] for s in o["shapes"]]
    assert len(shapes) == 3
    total = sum(s["est_device_time_ns"] for s in shapes)
    scored = sum(s["est_device_time_ns"] for s in shapes if "f64" not in s["key"])
    tot = rep["totals"]
    assert tot["scored_share"] == pytest.approx(scored / total, rel=1e-12)
    assert tot["phases"]["decode"]["scored_share"] == pytest.approx(scored / total, rel=1e-12)
    silu = next(o for o in rep["operators"] if o["name"] == "silu")
    assert tot["scored_share"] < 1 - silu["weight"] / 2  # the old figure counted all of silu's


# ---- null where nothing was measured -----------------------------------------------------

def test_no_candidate_means_no_candidate_score_anywhere(us, tmp_path):
    """With no candidate registered, the candidates' S_agg is null (it was
    0: as if every candidate had been measured at S = 0), in the report,
    per phase, in the metrics (no series) and in a merge of two such
    reports; the text and HTML reports show no candidates' headline."""
    from understudy import html, merge, metrics, tables
    x = torch.randn(32, 256)
    observe(us, "silu")
    with understudy.phase("prefill"):
        torch.nn.functional.silu(x)
    rep = us.report()
    us.disable()
    tot = rep["totals"]
    assert tot["S_agg"] is not None and tot["S_agg_candidate"] is None
    assert tot["phases"]["prefill"]["S_agg"] is not None and tot["phases"]["prefill"]["S_agg_candidate"] is None
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    assert "S_candidate" not in op["roofline"] and op["roofline"]["S"] is not None
    assert tot["candidate_routes"] is None
    assert "candidates" not in tables.format_report(rep) and tables.candidate_headline(rep) == []
    page = html.render(rep)
    assert 'class="headline"' not in page and "S_agg candidates" not in page
    text = metrics.metrics_text(rep)
    assert re.search(r"^understudy_aggregate_roofline_ratio" + re.escape(series_labels()) + r" \S+$", text, re.M)
    assert not re.search(r"^understudy_(phase_)?aggregate_candidate_roofline_ratio", text, re.M)  # no series
    assert not re.search(r"^understudy_candidate_routes_", text, re.M)
    other = json.loads(json.dumps(rep))
    other["pid"] = (rep.get("pid") or 0) + 1
    merged = merge.merge([rep, other])
    assert merged["totals"]["S_agg"] is not None and merged["totals"]["S_agg_candidate"] is None
    assert merged["totals"]["phases"]["prefill"]["S_agg_candidate"] is None


# ---- fp8 and int8 products ----------------------------------------------------------------

def test_int8_product_is_scored_on_the_int8_peak(us):
    """torch._int_mm (int8 x int8 -> int32) is bound and floored on the
    profile's int8 path: 2 operations a multiply-add, the operands read
    once, the int32 result written once."""
    M, K, N = 96, 512, 256
    g = torch.Generator().manual_seed(4)
    a = torch.randint(-8, 8, (M, K), generator=g, dtype=torch.int8)
    b = torch.randint(-8, 8, (K, N), generator=g, dtype=torch.int8)
    observe(us, "gemm")
    torch._int_mm(a, b)
    out = torch.empty(M, N, dtype=torch.int32)
    torch._int_mm(a, b, out=out)
    rep = us.report()
    w, q = 2 * M * K * N, M * K + K * N + 4 * M * N
    for op in ("aten::_int_mm", "aten::_int_mm.out"):
        (r,) = routes(rep, op)
        # without an int8 path the call was unscored (and before that, not bound)
        assert r["roofline"]["calls"] == 1 and r["roofline"]["unscored"] == 0, op
        assert r["roofline"]["flops_sum"] == w and r["roofline"]["bytes_sum"] == q, op
        assert r["roofline"]["tsol_ns_mean"] == pytest.approx(floor_ns(w, "int8", q), abs=1e-3), op
        assert r["roofline"]["S"] is not None, op
    assert rep["hardware"][0]["p_peak"]["int8"] == PEAK["int8"]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, None])
def test_scaled_fp8_product_is_scored_on_the_fp8_peak(us, out_dtype):
    """torch._scaled_mm of float8_e4m3 operands with per-tensor scales: W
    on the fp8 path, the operands and scales read, the result written in
    out_dtype (the operands' dtype when None)."""
    M, K, N = 1024, 2048, 1024
    g = torch.Generator().manual_seed(5)
    a = torch.randn(M, K, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn).t()  # column-major, as the kernels want it
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    observe(us, "gemm")
    torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    (r,) = routes(us.report(), "aten::_scaled_mm")
    eo = 2 if out_dtype is torch.bfloat16 else 1
    q = M * K + K * N + 4 + 4 + M * N * eo
    assert r["roofline"]["unscored"] == 0 and r["roofline"]["calls"] == 1
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(floor_ns(2 * M * K * N, "fp8_e4m3", q), abs=1e-3)
    assert r["roofline"]["bytes_sum"] == q


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 products need a CUDA device of compute capability 8.9 or later")
def test_scaled_fp8_product_is_scored_on_a_gpu(us):
    """The same on a GPU, against the profile its name picks (or H200's)."""
    M, K, N = 4096, 4096, 4096
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor(1.0, device="cuda"), torch.tensor(1.0, device="cuda")
    observe(us, "gemm")
    for _ in range(3):
        torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    (r,) = routes(us.report(), "aten::_scaled_mm")
    q = M * K + K * N + 8 + 2 * M * N
    assert r["roofline"]["unscored"] == 0 and r["roofline"]["calls"] >= 1
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(floor_ns(2 * M * K * N, "fp8_e4m3", q), abs=1e-3)
    assert 0 < r["roofline"]["S"] <= 1.05  # no kernel beats the datasheet's dense peak


# ---- torch-op candidates for schemas that write an unnamed alias set ---------------------

_MUTABLE_CANDIDATES = r"""
import json, sys
import torch
import understudy

schemas = json.loads(open(sys.argv[1]).read())["schemas"]
lib = torch.library.Library("_C", "FRAGMENT")
for name in ("_C::rms_norm", "_C::silu_and_mul"):
    lib.define(schemas[name].split("::", 1)[1])  # vLLM's own text: Tensor! result

def rms(result, input, weight, epsilon):
    x = input.float()
    result.copy_((x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * weight.float()).to(result.dtype))

def silu_and_mul(result, input):
    d = input.shape[-1] // 2
    result.copy_(torch.nn.functional.silu(input[..., :d]) * input[..., d:])

lib.impl("rms_norm", rms, "CPU")
lib.impl("silu_and_mul", silu_and_mul, "CPU")
# candidates: the same math, written another way
def rms_cand(result, input, weight, epsilon):
    x = input.double()
    result.copy_((x / torch.sqrt((x * x).mean(-1, keepdim=True) + epsilon) * weight.double()).to(result.dtype))

def silu_and_mul_cand(result, input):
    a, b = input.chunk(2, dim=-1)
    result.copy_(a * torch.sigmoid(a) * b)

names = {"rms_norm": understudy.register_candidate("ust_cand::rms_norm", rms_cand, like="_C::rms_norm"),
         "silu_and_mul": understudy.register_candidate("ust_cand::silu_and_mul", silu_and_mul_cand,
                                                       like="_C::silu_and_mul")}
written = {op: [a.name for a in torch._C._get_schema(n, "").arguments
                if a.alias_info is not None and a.alias_info.is_write] for op, n in names.items()}
understudy.enable({"operators": {op: {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": n, "target": "_C::" + op}}
                                 for op, n in names.items()}})
g = torch.Generator().manual_seed(6)
for _ in range(4):
    x, w = torch.randn(8, 256, generator=g), torch.randn(256, generator=g)
    torch.ops._C.rms_norm(torch.empty_like(x), x, w, 1e-6)
    y = torch.randn(8, 512, generator=g)
    torch.ops._C.silu_and_mul(torch.empty(8, 256), y)
rep = understudy.report()
understudy.disable()
shadow = {s["op"]: s["shadow"] for o in rep["operators"] for s in o["shapes"] if "shadow" in s}
print(json.dumps({"names": names, "written": written, "shadow": shadow}))
"""


def test_torch_op_candidates_for_schemas_with_unnamed_writes(tmp_path):
    """vLLM declares its ops with `Tensor!` (`_C::rms_norm(Tensor! result,
    ...)`, `_C::silu_and_mul(Tensor! result, Tensor input)`), which torch
    prints as `Tensor($0! -> )` and refused to parse again, so
    register_candidate(like=...) failed for every such op. Defined here
    with vLLM's schema text in a fresh process (this one defines _C's ops
    its own way), both candidates register, write what the op writes, and
    are shadowed and verified on every call."""
    import os
    import subprocess
    import sys
    script = tmp_path / "mutable_candidates.py"
    script.write_text(_MUTABLE_CANDIDATES)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    run = subprocess.run([sys.executable, str(script), str(ROOT / "tests" / "data" / "serving-schemas.json")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["names"] == {"rms_norm": "ust_cand::rms_norm", "silu_and_mul": "ust_cand::silu_and_mul"}
    assert out["written"] == {"rms_norm": ["result"], "silu_and_mul": ["result"]}
    for op in ("_C::rms_norm", "_C::silu_and_mul"):
        sh = out["shadow"][op]
        assert sh["calls"] == 4 and sh["verified"] == 4 and sh["passed"] == 4 and sh["failed"] == 0, (op, sh)
