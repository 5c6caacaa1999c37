"""Shadow mode on CUDA: native and torch-op candidates, the compare kernel,
no host synchronisation, the in-flight bound, graph capture.
Skipped only where torch sees no CUDA device."""
import time

import pytest
import torch
import torch.nn.functional as F

import understudy
from test_shadow import (DTYPES, _rms, served_under, _import_example, _reference, candidate_op, in_place_aa_runs, native,
                         poisoned_pair, rms_inputs, routes, run_rms_norm, shadow_config)

pytestmark = pytest.mark.gpu  # needs a CUDA device (conftest.py skips it without one)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_cuda_candidate_passes_and_outputs_identical(us, dtype):
    inputs = rms_inputs("cuda", dtype, shapes=((1, 4096), (7, 4096), (512, 4096), (3, 5, 128)))
    rep = served_under(us, shadow_config("rms_norm", native("rms_norm_cuda")), lambda: run_rms_norm(inputs))
    rs = routes(rep, "_C::rms_norm")
    assert len(rs) == len(inputs)
    for r in rs:
        sh = r["shadow"]
        assert r["device"] == "cuda" and r["mode"] == "shadow"
        assert (sh["calls"], sh["verified"], sh["passed"], sh["failed"], sh["skipped"]) == (3, 3, 3, 0, 0)
        assert sh["candidate_latency_ns"]["count"] == 3 and sh["speedup"] > 0
        print(f"{r['key']}: production p50 {r['latency_ns']['p50'] / 1e3:.1f} us, candidate p50 "
              f"{sh['candidate_latency_ns']['p50'] / 1e3:.1f} us, speedup {sh['speedup']:.2f}, "
              f"max abs err {sh['max_abs_err']:.3g}")


def test_native_cuda_wrong_tail_rolls_back(us):
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((64, 1024), (3, 5, 128)))
    expected = run_rms_norm(inputs)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda_wrong_tail")))
    served = run_rms_norm(inputs)
    rep = us.report()  # harvests the verdicts
    # On a GPU verdicts arrive after the comparison ran on the device, so
    # calls made meanwhile were shadowed too (and failed too); once the
    # route is rolled back the candidate no longer runs.
    run_rms_norm(inputs)
    after = us.report()
    us.disable()
    assert all(torch.equal(e, s) for e, s in zip(expected, served))
    for r, (x, _) in zip(sorted(routes(rep, "_C::rms_norm"), key=lambda r: -r["dims"]["N"]), inputs):
        sh = r["shadow"]
        assert r["mode"] == "rolled_back" and 1 <= sh["calls"] <= 3 and sh["failed"] == sh["calls"]
        (later,) = [a for a in routes(after, "_C::rms_norm") if a["key"] == r["key"]]
        assert later["calls"] == 6 and later["shadow"]["calls"] == sh["calls"]
        ev = sh["rollback"]
        assert ev["shadow_call"] == 1
        assert ev["reason"] == "mismatch" and ev["output"] == "out" and ev["mismatches"] == 1
        assert ev["first_mismatch"]["index"] == [d - 1 for d in x.shape]


def test_triton_gemm_torch_op_candidate(us):
    pytest.importorskip("triton")
    triton_mm = _import_example("triton_mm")
    name = candidate_op(triton_mm.OP_NAME, triton_mm.mm_triton, triton_mm.TARGET)
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(16, 4096, 4096), (128, 4096, 11008), (1000, 1024, 1000), (4096, 4096, 4096)]
    mats = [(torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16) / k ** 0.25,
             torch.randn(k, n, device="cuda", generator=g, dtype=torch.bfloat16) / k ** 0.25) for m, k, n in shapes]
    rep = served_under(us, shadow_config("gemm", {"torch_op": name, "target": "aten::mm"}), lambda: [torch.mm(a, b) for a, b in mats for _ in range(4)])
    rs = routes(rep, "aten::mm")
    assert len(rs) == len(shapes)
    for r in rs:
        sh = r["shadow"]
        assert (sh["calls"], sh["passed"], sh["failed"]) == (4, 4, 0), sh["rollback"]
        print(f"{r['key']}: cuBLAS p50 {r['latency_ns']['p50'] / 1e3:.1f} us, Triton p50 "
              f"{sh['candidate_latency_ns']['p50'] / 1e3:.1f} us, speedup {sh['speedup']:.2f}, "
              f"max abs err {sh['max_abs_err']:.3g}")


def test_wrong_and_raising_torch_op_candidates_on_cuda(us):
    wrong_silu = _import_example("wrong_silu")
    wrong = candidate_op(wrong_silu.WRONG_TAIL_NAME, wrong_silu.silu_wrong_tail, wrong_silu.TARGET)
    raises = candidate_op(wrong_silu.RAISES_NAME, wrong_silu.raising_silu, wrong_silu.TARGET)
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    expected = F.silu(x)
    for name, reason in ((wrong, "mismatch"), (raises, "raised")):
        us.enable(shadow_config("silu", {"torch_op": name, "target": "aten::silu"}))
        got = [F.silu(x) for _ in range(3)]
        rep = us.report()
        us.disable()
        assert all(torch.equal(g, expected) for g in got)
        (r,) = routes(rep, "aten::silu")
        assert r["calls"] == 3 and r["shadow"]["rollback"]["reason"] == reason
        # A raise is known on the host and rolls back at once; a mismatch
        # waits for the device's verdict.
        assert r["shadow"]["calls"] == 1 if reason == "raised" else 1 <= r["shadow"]["calls"] <= 3


def test_in_place_op_on_cuda_judged_on_snapshot(us):
    r, ran = in_place_aa_runs(us, "cuda", 1.0)
    assert (r["shadow"]["passed"], r["shadow"]["failed"]) == (2, 0)
    # every call an A/A call: production runs again twice (its timed arm on
    # copies, the A/A run), and shadow.aa.runs counts each run
    assert ran == [2, 2 + 2 * 2]
    assert r["shadow"]["aa"]["runs"] == ran[1] - ran[0] == 4
    assert r["shadow"]["aa"]["mismatching"] == 0


def test_shadow_does_not_wait_for_queued_work(us):
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((256, 4096),))
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    run_rms_norm(inputs, repeat=2)  # first calls create the slots' events and buffers
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(2_000_000_000)
    t0 = time.perf_counter()
    run_rms_norm(inputs, repeat=10)
    host_s = time.perf_counter() - t0
    done.record()
    still_running = not done.query()
    torch.cuda.synchronize()
    gpu_total = time.perf_counter() - t0
    print(f"10 shadowed calls returned after {host_s * 1e3:.2f} ms; queued work finished after "
          f"{gpu_total * 1e3:.0f} ms")
    assert still_running, "the queued work finished before the calls returned: something synchronised"
    assert gpu_total > 10 * host_s
    (r,) = routes(us.report(), "_C::rms_norm")
    assert (r["shadow"]["calls"], r["shadow"]["passed"]) == (12, 12)


def test_inflight_bound_skips_and_production_serves(us):
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((64, 1024),))
    expected = run_rms_norm(inputs, repeat=10)
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["shadow"] = {"max_inflight": 2}
    us.enable(cfg)
    run_rms_norm(inputs, repeat=1)  # the first shadowed call on a device allocates the slots' buffers
    us.flush()
    torch.cuda._sleep(500_000_000)  # the next two shadow calls stay in flight meanwhile
    served = run_rms_norm(inputs, repeat=10)
    rep = us.report()
    us.disable()
    assert all(torch.equal(e, s) for e, s in zip(expected, served))
    (r,) = routes(rep, "_C::rms_norm")
    sh = r["shadow"]
    assert r["calls"] == 11
    assert (sh["calls"], sh["passed"], sh["skipped"]) == (3, 3, 8)


def test_capture_runs_production_and_replays_match(us):
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops._C.rms_norm(out, x, w, 1e-6)
    torch.cuda.current_stream().wait_stream(s)
    want = out.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ops._C.rms_norm(out, x, w, 1e-6)
    out.zero_()
    # the capture opened the call's gate from its route (shadow, sample 1)
    g.replay()
    torch.cuda.synchronize()
    us.flush()
    rep = us.report()
    us.disable()
    assert torch.equal(out, want)
    (r,) = routes(rep, "_C::rms_norm")
    # the captured call holds its shadow: the replay was verified (sample 1)
    assert (r["calls"], r["captured"], r["shadow"]["calls"], r["shadow"]["passed"]) == (2, 1, 2, 2)
    assert r["shadow"]["skipped_by"]["capture"] == 0 and r["shadow"]["graph"]["shadowed"] == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1])
def test_compare_kernel_matches_float64_reference(dtype, offset):
    n = (1 << 22) + 37
    p_all, c_all = poisoned_pair(n + offset, dtype, device="cuda", seed=7)
    p, c = p_all[offset:], c_all[offset:]  # offset 1 breaks the 16-byte alignment
    got = understudy.compare(p, c, atol=1e-2, rtol=5e-2)
    ref = _reference(p.cpu(), c.cpu(), 1e-2, 5e-2)
    for k in ("elements", "mismatches", "nonfinite_production", "nonfinite_candidate", "nonfinite_bad",
              "first_mismatch"):
        assert got[k] == ref[k], k
    for k in ("max_abs_err", "max_rel_err", "sum_sq_diff", "sum_sq_production"):
        assert got[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-9), k
    assert got["device_time_ns"] > 0


def test_compare_kernel_integers_on_cuda():
    p = torch.randint(0, 1 << 30, (1 << 20,), device="cuda", dtype=torch.int64)
    c = p.clone()
    c[123457] += 1
    got = understudy.compare(p, c)
    assert (got["mismatches"], got["first_mismatch"], got["max_abs_err"]) == (1, 123457, 1.0)
    got = understudy.compare(p.to(torch.int32), c.to(torch.int32))
    assert (got["mismatches"], got["first_mismatch"]) == (1, 123457)


def test_cuda_candidate_writing_its_input_never_touches_the_callers(us):
    """A CUDA candidate that writes 1234 into each row's first input element
    after a correct result: it runs on understudy's copies, the caller's
    input stays bit-equal, every served output is production's, and the
    route rolls back with "wrote input"."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096), (64, 1024)))
    before = [(x.clone(), w.clone()) for x, w in inputs]
    expected = run_rms_norm(inputs)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda_writes_input")))
    served = run_rms_norm(inputs)
    us.flush()
    rep = us.report()
    for (x, w), (x0, w0) in zip(inputs, before):
        assert torch.equal(x, x0) and torch.equal(w, w0)
    assert all(torch.equal(e, s) for e, s in zip(expected, served))
    for r in routes(rep, "_C::rms_norm"):
        ev = r["shadow"]["rollback"]
        assert r["mode"] == "rolled_back" and ev["reason"] == "wrote input" and ev["output"] == "input", ev
        assert r["shadow"]["bytes_copied"] > 0


def _triton_rms_norm():
    """A Triton RMSNorm (one program a row) in vLLM's out-variant form, or a
    torch one where Triton is absent; returns (fn, what)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return (lambda out, x, w, eps: out.copy_(_rms(x, w, eps))), "torch (Triton is not installed)"

    @triton.jit
    def kernel(out_ptr, x_ptr, w_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        tl.store(out_ptr + row * n + cols, (x * r * w).to(out_ptr.dtype.element_ty), mask=mask)

    def fn(out, x, w, eps):
        n = x.shape[-1]
        kernel[(x.numel() // n,)](out, x.contiguous(), w, n, eps, BLOCK=triton.next_power_of_2(n))

    return fn, "Triton"


def test_shadow_keeps_up_with_sustained_load(us):
    """A Triton candidate shadowing 6 shapes x 300 back-to-back calls at
    sample 1: slots come back at the pace of the calls (a serving thread
    concludes completed comparisons before it takes a slot), so >= 90 % of
    the calls are verified, the rest skipped with a reason. The first call
    also compiles the kernel (no warm-up, as in serving)."""
    fn, what = _triton_rms_norm()
    name = candidate_op("ust_cuda::rms_norm_triton", fn, "_C::rms_norm")
    inputs = rms_inputs("cuda", torch.float32, shapes=((1, 4096), (4, 4096), (16, 4096), (1, 1024), (8, 1024),
                                                       (32, 2048)))
    us.enable(shadow_config("rms_norm", {"torch_op": name, "target": "_C::rms_norm"}))
    t0 = time.perf_counter()
    for x, w in inputs:
        out = torch.empty_like(x)
        for _ in range(300):
            torch.ops._C.rms_norm(out, x, w, 1e-6)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    us.flush()
    rep = us.report()
    us.disable()
    rs = routes(rep, "_C::rms_norm")
    assert len(rs) == 6 and all(r["calls"] == 300 for r in rs)
    verified = sum(r["shadow"]["verified"] for r in rs)
    skipped = sum(r["shadow"]["skipped"] for r in rs)
    print(f"{what} candidate, 1800 calls in {dt * 1e3:.0f} ms: {verified} verified, {skipped} skipped "
          f"{[r['shadow']['skipped_by'] for r in rs]}")
    assert all(r["shadow"]["failed"] == 0 for r in rs)
    for r in rs:
        sh = r["shadow"]
        assert sh["skipped"] == sum(sh["skipped_by"].values())
        assert sh["verified"] + sh["skipped"] + sh["unverifiable"] == 300, sh
    assert verified >= 0.9 * 1800
