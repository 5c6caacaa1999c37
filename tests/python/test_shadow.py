"""Shadow mode on CPU tensors: candidates run beside production and are judged.

Ground truth: production's outputs from the same calls with understudy
disabled (served outputs must be bit-identical), float64 references for the
comparison, and the arguments the tests hand in.
"""
import importlib.util
import time

import pytest
import torch

import understudy
from conftest import ROOT, candidate_dir, hold_since

# vLLM-style ops that write their arguments, as serving frameworks define
# them. Kept for the whole session: see test_errors.py on torch 2.11 and
# deleted libraries. rms_norm and silu_and_mul take at least the time a test
# holds them for (conftest.held_for), so that their device time is known.
_lib = torch.library.Library("_C", "FRAGMENT")
_lib.define("rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps) -> ()")
# what torch.compile traces: it writes out and returns nothing
torch.library.register_fake("_C::rms_norm", lib=_lib)(lambda out, input, weight, eps: None)
_lib.define("fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> ()")
_lib.define("silu_and_mul(Tensor(a!) result, Tensor input) -> ()")


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _rms_norm_impl(out, input, weight, eps):
    t0 = time.perf_counter_ns()
    out.copy_(_rms(input, weight, eps))
    hold_since(t0)


def _silu_and_mul_impl(result, input):
    t0 = time.perf_counter_ns()
    d = input.shape[-1] // 2
    result.copy_(torch.nn.functional.silu(input[..., :d]) * input[..., d:])
    hold_since(t0)


def _fused_add_impl(input, residual, weight, eps):
    s = input.float() + residual.float()
    residual.copy_(s.to(residual.dtype))
    input.copy_(_rms(s.to(input.dtype), weight, eps))


for _key in ("CPU", "CUDA"):
    _lib.impl("rms_norm", _rms_norm_impl, _key)
    _lib.impl("fused_add_rms_norm", _fused_add_impl, _key)
    _lib.impl("silu_and_mul", _silu_and_mul_impl, _key)


def _import_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "candidates" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_registered = {}


def candidate_op(name, fn, like):
    """Register a torch-op candidate once per session."""
    if name not in _registered:
        _registered[name] = understudy.register_candidate(name, fn, like=like)
    return _registered[name]


def native(lib_name):
    path = candidate_dir() / f"lib{lib_name}.so"
    if not path.exists():
        pytest.fail(f"{path} was not built; run ./run.sh build")
    return understudy.native(path)


def shadow_config(op, candidate, **extra):
    entry = {"mode": "shadow", "sample": 1.0, "candidate": candidate}
    entry.update(extra)
    return {"operators": {op: entry}, "report": {"interval_s": 0}}


def routes(rep, op_display):
    return [s for o in rep["operators"] for s in o["shapes"] if s["op"] == op_display]


def rms_inputs(device="cpu", dtype=torch.float32, shapes=((1, 128), (7, 128), (64, 256), (3, 5, 64))):
    g = torch.Generator().manual_seed(0)
    out = []
    for shape in shapes:
        x = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        w = torch.randn(shape[-1], generator=g).to(device=device, dtype=dtype)
        out.append((x, w))
    return out


def assert_same(a, b):
    """Bit-identical tensors, or sequences of them."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
        return
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert_same(x, y)


def served_under(us, config, run):
    """run() without understudy, then with understudy enabled by config: the
    served outputs must be bit-identical. Returns understudy's report."""
    expected = run()
    us.enable(config)
    served = run()
    rep = us.report()
    us.disable()
    assert_same(expected, served)
    return rep


def run_rms_norm(inputs, repeat=3):
    outs = []
    for _ in range(repeat):
        for x, w in inputs:
            o = torch.empty_like(x)
            torch.ops._C.rms_norm(o, x, w, 1e-6)
            outs.append(o)
    return outs


def silu_and_mul(x):
    """One call of _C::silu_and_mul on x (..., 2d); returns its result (..., d)."""
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    torch.ops._C.silu_and_mul(out, x)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_correct_candidate_passes_every_verification(us, dtype):
    inputs = rms_inputs(dtype=dtype)
    rep = served_under(us, shadow_config("rms_norm", native("rms_norm_cpu"), ), lambda: run_rms_norm(inputs))
    rs = routes(rep, "_C::rms_norm")
    assert len(rs) == len(inputs)
    for r in rs:
        sh = r["shadow"]
        assert r["mode"] == "shadow"
        assert r["calls"] == 3
        assert (sh["calls"], sh["verified"], sh["passed"], sh["failed"], sh["skipped"]) == (3, 3, 3, 0, 0)
        assert sh["rollback"] is None
        assert sh["candidate_latency_ns"]["count"] == 3
        assert r["latency_ns"]["count"] == 3
        assert sh["speedup"] > 0
    op = next(o for o in rep["operators"] if o["name"] == "rms_norm")
    assert op["candidate"]["kind"] == "native"
    assert op["candidate"]["target"] == "_C::rms_norm"
    assert rep["totals"]["rollbacks"] == 0


@pytest.mark.parametrize("variant, reason", [("wrong_tail", "mismatch"), ("wrong_nan", "nonfinite"),
                                             ("wrong_error", "error")])
def test_wrong_native_candidate_rolls_back_at_first_failure(us, variant, reason):
    inputs = rms_inputs()
    rep = served_under(us, shadow_config("rms_norm", native(f"rms_norm_cpu_{variant}")), lambda: run_rms_norm(inputs))
    rs = routes(rep, "_C::rms_norm")
    assert len(rs) == len(inputs)
    for r in rs:
        sh = r["shadow"]
        assert r["mode"] == "rolled_back"
        assert r["calls"] == 3
        # Rolled back at the first verified failure: the candidate ran once.
        assert (sh["calls"], sh["verified"], sh["passed"], sh["failed"]) == (1, 1, 0, 1)
        ev = sh["rollback"]
        assert ev["reason"] == reason
        assert ev["shadow_call"] == 1
    assert rep["totals"]["rollbacks"] == len(inputs)
    if reason == "error":
        for r in rs:
            assert "deliberate failure" in r["shadow"]["rollback"]["message"]
        return
    by_shape = {tuple(r["shadow"]["rollback"]["shape"]): r["shadow"]["rollback"] for r in rs}
    for x, _ in inputs:
        ev = by_shape[tuple(x.shape)]
        assert ev["output"] == "out"
        assert ev["elements"] == x.numel()
        assert ev["mismatches"] == 1
        # Wrong only on the tail: the last row's last element, or (NaN) the
        # middle of the last row.
        idx = ev["first_mismatch"]["index"]
        assert idx[:-1] == [d - 1 for d in x.shape[:-1]]
        if reason == "mismatch":
            assert idx[-1] == x.shape[-1] - 1
            assert ev["max_abs_err"] >= 1.0
        else:
            assert ev["nonfinite_where_production_finite"] == 1


def test_sha256_mismatch_is_refused(us):
    entry = native("rms_norm_cpu")
    entry["sha256"] = "0" * 64
    with pytest.raises(understudy.ConfigError) as ei:
        us.enable(shadow_config("rms_norm", entry))
    msg = str(ei.value)
    assert "operators.rms_norm.candidate.native" in msg
    assert "0" * 64 in msg and understudy.sha256_of(entry["native"]) in msg
    assert not us.is_enabled()
    x = torch.randn(4, 8)
    o = torch.empty_like(x)
    torch.ops._C.rms_norm(o, x, torch.ones(8), 1e-6)
    assert torch.allclose(o, _rms(x, torch.ones(8), 1e-6))


def test_shadow_without_candidate_is_a_config_error(us):
    with pytest.raises(understudy.ConfigError, match="names no 'candidate'"):
        us.enable({"operators": {"rms_norm": "shadow"}})
    with pytest.raises(understudy.ConfigError, match="64 hex digits"):
        us.enable(shadow_config("rms_norm", {"native": "x.so", "sha256": "abc"}))
    with pytest.raises(understudy.ConfigError, match="does not bind"):
        us.enable(shadow_config("gemm", {"torch_op": "ns::x", "target": "aten::silu"}))
    with pytest.raises(understudy.ConfigError, match=r"binds \d+ ops .* name the one"):
        us.enable(shadow_config("gemm", {"torch_op": "ns::x"}))


def test_candidate_that_raises_leaves_production_serving(us):
    wrong_silu = _import_example("wrong_silu")
    name = candidate_op(wrong_silu.RAISES_NAME, wrong_silu.raising_silu, wrong_silu.TARGET)
    x = torch.randn(33, 17)
    expected = torch.nn.functional.silu(x)
    us.enable(shadow_config("silu", {"torch_op": name, "target": "aten::silu"}))
    got = [torch.nn.functional.silu(x) for _ in range(4)]
    rep = us.report()
    us.disable()
    for g in got:
        assert torch.equal(g, expected)
    (r,) = routes(rep, "aten::silu")
    sh = r["shadow"]
    assert r["calls"] == 4 and r["mode"] == "rolled_back"
    assert (sh["calls"], sh["failed"]) == (1, 1)
    assert sh["rollback"]["reason"] == "raised"
    assert "deliberate failure" in sh["rollback"]["message"]
    assert rep["totals"]["internal_errors"] == 0


def test_torch_op_candidates_wrong_tail_and_correct(us):
    wrong_silu = _import_example("wrong_silu")
    wrong = candidate_op(wrong_silu.WRONG_TAIL_NAME, wrong_silu.silu_wrong_tail, wrong_silu.TARGET)
    x = torch.randn(8, 100)
    expected = torch.nn.functional.silu(x)
    us.enable(shadow_config("silu", {"torch_op": wrong, "target": "aten::silu"}))
    got = torch.nn.functional.silu(x)
    rep = us.report()
    us.disable()
    assert torch.equal(got, expected)
    (r,) = routes(rep, "aten::silu")
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "mismatch" and ev["output"] == "result 0"
    assert ev["first_mismatch"]["index"] == [7, 99] and ev["mismatches"] == 1

    right = candidate_op("ust_test::silu_decomposed", lambda t: t * torch.sigmoid(t), "aten::silu")
    us.enable(shadow_config("silu", {"torch_op": right, "target": "aten::silu"}))
    for _ in range(5):
        torch.nn.functional.silu(x)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "aten::silu")
    sh = r["shadow"]
    assert r["mode"] == "shadow"
    assert (sh["calls"], sh["verified"], sh["passed"], sh["failed"]) == (5, 5, 5, 0)
    # A real comparison happened: the guard's max error is the decomposed
    # silu's own difference from aten::silu, measured here independently.
    assert sh["max_abs_err"] <= 1e-4
    assert sh["max_abs_err"] == pytest.approx(
        (x * torch.sigmoid(x) - expected).abs().max().item(), abs=1e-12)


def test_candidate_built_from_the_op_it_shadows_does_not_recurse(us):
    # A torch-op candidate that calls aten::mm itself: the inner call is not
    # live traffic and is neither shadowed again nor counted.
    mm_via_aten = candidate_op("ust_test::mm_via_aten", lambda a, b: torch.mm(a, b), "aten::mm")
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    us.enable(shadow_config("gemm", {"torch_op": mm_via_aten, "target": "aten::mm"}))
    for _ in range(6):
        torch.mm(a, b)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "aten::mm")
    assert r["calls"] == 6
    sh = r["shadow"]
    assert (sh["calls"], sh["passed"]) == (6, 6)
    assert sh["max_abs_err"] == 0.0


def test_out_variant_written_argument_is_judged(us):
    # rms_norm(Tensor(a!) out, ...) with a torch-op candidate: production's
    # out is intact and the candidate's write into the snapshot is compared.
    def cand(out, input, weight, eps):
        out.copy_(_rms(input, weight, eps))

    name = candidate_op("ust_test::rms_norm_cand", cand, "_C::rms_norm")
    inputs = rms_inputs()
    rep = served_under(us, shadow_config("rms_norm", {"torch_op": name, "target": "_C::rms_norm"}), lambda: run_rms_norm(inputs, repeat=2))
    for r in routes(rep, "_C::rms_norm"):
        assert (r["shadow"]["passed"], r["shadow"]["failed"]) == (2, 0)


def _fused_add_calls(inputs, repeat=2):
    results = []
    for _ in range(repeat):
        for x, w in inputs:
            inp, res = x.clone(), (x * 0.5 + 1).clone()
            torch.ops._C.fused_add_rms_norm(inp, res, w, 1e-6)
            results.append((inp, res))
    return results


def test_in_place_op_is_judged_on_the_snapshot(us):
    # The candidate reads input and residual: had it run on production's
    # results (already normalised, already summed) it would disagree. It
    # passes only if it saw the values from before production ran.
    name = candidate_op("ust_test::fused_add_cand", _fused_add_impl, "_C::fused_add_rms_norm")
    inputs = rms_inputs()
    rep = served_under(us, shadow_config("fused_add_rms_norm", {"torch_op": name, "target": "_C::fused_add_rms_norm"}), lambda: _fused_add_calls(inputs))
    rs = routes(rep, "_C::fused_add_rms_norm")
    assert len(rs) == len(inputs)
    for r in rs:
        assert (r["shadow"]["passed"], r["shadow"]["failed"]) == (2, 0)

    def wrong_residual(input, residual, weight, eps):
        _fused_add_impl(input, residual, weight, eps)
        residual.view(-1)[0] += 3.0

    wname = candidate_op("ust_test::fused_add_wrong_residual", wrong_residual, "_C::fused_add_rms_norm")
    rep = served_under(us, shadow_config("fused_add_rms_norm", {"torch_op": wname, "target": "_C::fused_add_rms_norm"}),
                       lambda: _fused_add_calls(inputs[:1], repeat=1))
    (r,) = routes(rep, "_C::fused_add_rms_norm")
    ev = r["shadow"]["rollback"]
    assert ev["output"] == "residual" and ev["first_mismatch"]["flat_index"] == 0


def test_set_comparison_accepts_reordered_topk(us):
    # topk is compared as sets: a candidate that returns the same values and
    # indices in ascending order passes; one with a wrong value does not.
    def topk_ascending(self, k, dim=-1, largest=True, sorted=True):
        v, i = torch.ops.aten.topk.default(self, k, dim, largest, sorted)
        return v.flip(-1), i.flip(-1)

    def topk_unpaired(self, k, dim=-1, largest=True, sorted=True):
        # the right values and the right set of indices, but not paired
        v, i = torch.ops.aten.topk.default(self, k, dim, largest, sorted)
        return v, i.flip(-1)

    x = torch.randn(4, 50)
    expected = torch.topk(x, 5)
    for fn, fname, passed in ((topk_ascending, "ust_test::topk_ascending", True),
                              (topk_unpaired, "ust_test::topk_unpaired", False)):
        name = candidate_op(fname, fn, "aten::topk")
        us.enable(shadow_config("topk", {"torch_op": name, "target": "aten::topk"}))
        got = torch.topk(x, 5)
        rep = us.report()
        us.disable()
        assert torch.equal(got.values, expected.values) and torch.equal(got.indices, expected.indices)
        (r,) = routes(rep, "aten::topk")
        assert (r["shadow"]["passed"], r["shadow"]["failed"]) == ((1, 0) if passed else (0, 1)), fname
        if not passed:
            assert r["shadow"]["rollback"]["output"] == "result 1"


def test_a_candidate_serving_a_tuple_op_hands_the_caller_its_results(us):
    # topk's interceptor is typed: the results a live candidate serves (a
    # tuple) are taken back off the plan's stack into the tuple the caller
    # receives, the candidate's order and all, with no internal error.
    def topk_ascending(self, k, dim=-1, largest=True, sorted=True):
        v, i = torch.ops.aten.topk.default(self, k, dim, largest, sorted)
        return v.flip(-1), i.flip(-1)

    x = torch.randn(4, 50)
    expected = torch.topk(x, 5)
    name = candidate_op("ust_test::topk_ascending", topk_ascending, "aten::topk")
    us.enable(shadow_config("topk", {"torch_op": name, "target": "aten::topk"}, mode="live"))
    got = [torch.topk(x, 5) for _ in range(4)]
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "aten::topk")
    assert rep["totals"]["internal_errors"] == 0 and r["shadow"]["failed"] == 0
    served = r["rollout"]["served"]["candidate"]
    assert served >= 3, r["rollout"]
    ascending = [torch.equal(g.values, expected.values.flip(-1)) and torch.equal(g.indices, expected.indices.flip(-1))
                 for g in got]
    production = [torch.equal(g.values, expected.values) and torch.equal(g.indices, expected.indices) for g in got]
    assert sum(ascending) == served and all(a or p for a, p in zip(ascending, production))


_tuple_lib = torch.library.Library("ust_tuple", "DEF")
_tuple_lib.define("halve_and_count(Tensor x) -> (Tensor, int)")
# the int is production's alone: 7 per row and one, a value no candidate makes
_tuple_lib.impl("halve_and_count", lambda x: (x * 0.5, 7 * x.shape[0] + 1), "CPU")


def test_a_native_candidate_serving_an_op_with_an_int_result_hands_production_its_int(us, tmp_path):
    """A native candidate writes only the tensor outputs understudy
    preallocates for it; an op's other results (an int here, the attention
    kernels' max_q) are not among them. A served call that production also
    ran (verified) hands the caller production's int beside the candidate's
    tensor, not None; one production did not run is not served natively
    (no layout holds an int), so production answers it whole."""
    import json

    d = tmp_path / "problems"
    d.mkdir()
    (d / "halve_and_count.json").write_text(json.dumps({
        "schema_version": 1, "operator": "halve_and_count",
        "bindings": [{"op": "ust_tuple::halve_and_count", "key": {"M": "x[0]", "N": "x[1]"}}]}))
    xs = [torch.randn(rows, 16) for rows in (3, 3, 3, 3, 5, 5, 5, 5)]

    def run(sample):
        cfg = shadow_config("halve_and_count", native("halve_count"), mode="live")
        cfg["operators"]["halve_and_count"]["sample"] = sample
        us.enable(cfg, problems=d)
        got = [torch.ops.ust_tuple.halve_and_count(x) for x in xs]
        rep = us.report()
        us.disable()
        for x, (half, count) in zip(xs, got):
            assert torch.equal(half, x * 0.5)
            assert count == 7 * x.shape[0] + 1, (x.shape, count)
        rs = routes(rep, "ust_tuple::halve_and_count")
        assert len(rs) == 2 and rep["totals"]["internal_errors"] == 0
        return rs

    for r in run(1.0):  # every served call verified
        assert r["shadow"]["failed"] == 0, r["shadow"]
        # qualified on a shadowed call, then served by the candidate, verified
        assert r["rollout"]["served"]["candidate"] >= 1 and r["shadow"]["verified"] >= 2, (r["rollout"], r["shadow"])
    for r in run(0.01):  # after the qualifying call, none verified: production serves them whole
        assert (r["shadow"]["verified"], r["shadow"]["failed"]) == (1, 0), r["shadow"]
        served = r["rollout"]["served"]
        assert (served["candidate"], served["production"], served["unlearned"]) == (0, 4, 3), served


@pytest.mark.parametrize("aa_sample, reruns", [(1.0, 2), (0.0, 1)])
def test_aa_check_reports_production_spread(us, aa_sample, reruns):
    """Every shadowed call runs production again on copies of its own, as
    the candidate's timed counterpart, and an A/A call once more: each run
    is compared with the results production served."""
    inputs = rms_inputs(shapes=((8, 64),))
    us.enable(shadow_config("rms_norm", native("rms_norm_cpu"), guard={"aa_sample": aa_sample}))
    run_rms_norm(inputs, repeat=4)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    aa = r["shadow"]["aa"]
    assert aa["runs"] == 4 * reruns and aa["mismatching"] == 0
    assert aa["max_abs_err"] == 0.0  # the CPU reference is deterministic


def test_mode_change_stops_and_resumes_shadowing(us):
    inputs = rms_inputs(shapes=((4, 32),))
    cfg = shadow_config("rms_norm", native("rms_norm_cpu"))
    cfg["operators"]["gemm"] = "observe"
    us.enable(cfg)
    run_rms_norm(inputs, repeat=2)
    us.set_mode("rms_norm", "observe")
    run_rms_norm(inputs, repeat=3)
    us.set_mode("rms_norm", "shadow")
    run_rms_norm(inputs, repeat=1)
    rep = us.report()
    with pytest.raises(understudy.UnderstudyError, match="no candidate"):
        us.set_mode("gemm", "shadow")
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    assert r["calls"] == 6
    assert (r["shadow"]["calls"], r["shadow"]["passed"]) == (3, 3)


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _reference(p, c, atol, rtol):
    """The guard's rule in float64 torch, written independently."""
    p64, c64 = p.double().flatten(), c.double().flatten()
    pf, cf = torch.isfinite(p64), torch.isfinite(c64)
    both = pf & cf
    d = (c64 - p64).abs()
    bad_close = both & ~(d <= atol + rtol * p64.abs())
    same_nonfinite = (~pf) & ((torch.isnan(p64) & torch.isnan(c64)) | (p64 == c64))
    mism = bad_close | (pf & ~cf) | ((~pf) & ~same_nonfinite)
    nz = both & (p64 != 0)
    return {
        "elements": p64.numel(),
        "mismatches": int(mism.sum()),
        "nonfinite_production": int((~pf).sum()),
        "nonfinite_candidate": int((~cf).sum()),
        "nonfinite_bad": int((pf & ~cf).sum()),
        "first_mismatch": int(mism.nonzero()[0, 0]) if mism.any() else -1,
        "max_abs_err": float(d[both].max()) if both.any() else 0.0,
        "max_rel_err": float((d[nz] / p64[nz].abs()).max()) if nz.any() else 0.0,
        "sum_sq_diff": float((d[both] ** 2).sum()),
        "sum_sq_production": float((p64[pf] ** 2).sum()),
    }


def poisoned_pair(n, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=g, dtype=torch.float64)
    c = p + torch.randn(n, generator=g, dtype=torch.float64) * 1e-3
    idx = torch.randperm(n, generator=g)[:12]
    c[idx[0]] += 5.0             # a large error
    c[idx[1]] = float("nan")     # NaN where production is finite
    c[idx[2]] = float("inf")
    p[idx[3]] = float("nan")     # production NaN, candidate finite
    p[idx[4]] = float("nan")
    c[idx[4]] = float("nan")     # both NaN: agree
    p[idx[5]] = float("-inf")
    c[idx[5]] = float("-inf")    # same infinity: agree
    p[idx[6]] = 0.0
    c[idx[6]] = 0.0
    return p.to(dtype=dtype, device=device), c.to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_compare_matches_float64_reference(dtype):
    n = 100003  # not a multiple of any vector width
    p, c = poisoned_pair(n, dtype)
    got = understudy.compare(p, c, atol=1e-2, rtol=5e-2)
    ref = _reference(p, c, 1e-2, 5e-2)
    for k in ("elements", "mismatches", "nonfinite_production", "nonfinite_candidate", "nonfinite_bad",
              "first_mismatch"):
        assert got[k] == ref[k], k
    for k in ("max_abs_err", "max_rel_err", "sum_sq_diff", "sum_sq_production"):
        assert got[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-12), k


def test_compare_integers_exactly():
    g = torch.Generator().manual_seed(1)
    p = torch.randint(-1000, 1000, (5000,), generator=g, dtype=torch.int64)
    c = p.clone()
    c[4321] += 1
    c[77] -= 3
    got = understudy.compare(p.int(), c.int())
    assert (got["mismatches"], got["first_mismatch"], got["max_abs_err"]) == (2, 77, 3.0)
    assert understudy.compare(p, p)["mismatches"] == 0
    got = understudy.compare(torch.tensor([1.0, float("nan")], dtype=torch.float64),
                             torch.tensor([1.0 + 1e-9, float("nan")], dtype=torch.float64), exact=True)
    assert (got["mismatches"], got["first_mismatch"]) == (1, 0)
    with pytest.raises(understudy.UnderstudyError, match="dimension 0"):
        understudy.compare(torch.zeros(3), torch.zeros(4))


def test_four_threads_shadow_with_exact_counts(us):
    # Four serving threads on one route: every call counted, every call
    # shadowed and verified, outputs identical to production's.
    import threading

    x, w = rms_inputs(shapes=((16, 256),))[0]
    want = torch.empty_like(x)
    _rms_norm_impl(want, x, w, 1e-6)
    us.enable(shadow_config("rms_norm", native("rms_norm_cpu")))
    errors = []

    def worker():
        try:
            for _ in range(200):
                o = torch.empty_like(x)
                torch.ops._C.rms_norm(o, x, w, 1e-6)
                if not torch.equal(o, want):
                    errors.append("output differs")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rep = us.report()
    us.disable()
    assert errors == []
    (r,) = routes(rep, "_C::rms_norm")
    sh = r["shadow"]
    assert r["calls"] == 800
    # every call shadowed and verified, but those the guard held for production
    # alone while the candidate had more calls inside than it has returned in
    # time (its first calls, with four threads at once: guard/flight.h)
    held = r["in_flight"]["held"]
    assert held["overdue"] == held["full"] == 0 and held["bound"] < 800, held
    shadowed = 800 - held["bound"]
    assert (sh["calls"], sh["verified"], sh["passed"], sh["failed"], sh["skipped"]) == (shadowed, shadowed, shadowed, 0, 0)
    assert r["latency_ns"]["count"] == 800 and sh["candidate_latency_ns"]["count"] == shadowed


def test_read_only_argument_aliasing_a_written_one(us):
    # addmm(c, a, b, out=c): production overwrites c, which it also reads;
    # the candidate must read c as it was.
    def addmm_out(self, mat1, mat2, *, beta=1, alpha=1, out):
        return torch.ops.aten.addmm.out(self, mat1, mat2, beta=beta, alpha=alpha, out=out)

    name = candidate_op("ust_test::addmm_out", addmm_out, "aten::addmm.out")
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    c0 = torch.randn(8, 4)
    want = torch.addmm(c0, a, b)
    us.enable(shadow_config("gemm", {"torch_op": name, "target": "aten::addmm.out"}))
    c = c0.clone()
    torch.addmm(c, a, b, out=c)
    rep = us.report()
    us.disable()
    assert torch.equal(c, want)
    (r,) = routes(rep, "aten::addmm.out")
    assert (r["shadow"]["passed"], r["shadow"]["failed"]) == (1, 0), r["shadow"]["rollback"]


def test_out_argument_resized_by_production(us):
    # silu(x, out=empty(0)): production resizes out; the candidate gets an
    # out of the final shape, not the empty snapshot.
    def silu_out(self, *, out):
        return torch.ops.aten.silu.out(self, out=out)

    name = candidate_op("ust_test::silu_out", silu_out, "aten::silu.out")
    x = torch.randn(6, 7)
    us.enable(shadow_config("silu", {"torch_op": name, "target": "aten::silu.out"}))
    out = torch.empty(0)
    torch.nn.functional.silu(x, inplace=False)  # not the target: observed only
    torch.ops.aten.silu.out(x, out=out)
    rep = us.report()
    us.disable()
    assert torch.equal(out, torch.nn.functional.silu(x))
    (r,) = routes(rep, "aten::silu.out")
    assert (r["shadow"]["passed"], r["shadow"]["failed"]) == (1, 0), r["shadow"]["rollback"]
