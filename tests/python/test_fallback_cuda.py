"""A candidate that falls back to torch, on CUDA: inside the kernel tracer's
windows the kernels of its runs are counted, and apart those launched by
the ops it called. Ground truth: torch.profiler over the same candidate run
alone, its kernels told apart by name (the candidate's own Triton kernel,
torch's for the half it hands over). Skipped only where torch sees no CUDA
device."""
import time

import pytest
import torch

import understudy

pytestmark = pytest.mark.gpu  # needs a CUDA device (conftest.py skips it without one)

N = 1 << 22  # elements: each half's kernel takes microseconds, not the launch's turnaround


_made = {}


def candidates():
    """Two candidates for silu(x) with a Triton kernel of their own: one
    hands the second half of the elements to torch (silu.out into the
    output's tail), the other runs the kernel over every element. Made once
    (triton is imported only here: CPU machines may lack it)."""
    if _made:
        return _made
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def silu_head(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m).to(tl.float32)
        tl.store(out_ptr + i, x / (1.0 + tl.exp(-x)), mask=m)

    def own(flat, out, n):
        silu_head[(triton.cdiv(n, 1024),)](flat, out, n, BLOCK=1024)

    def half_in_torch(x):
        flat = x.contiguous().view(-1)
        out = torch.empty_like(flat)
        h = flat.numel() // 2
        own(flat, out, h)
        torch.ops.aten.silu.out(flat[h:], out=out[h:])
        return out.view(x.shape)

    def whole(x):
        flat = x.contiguous().view(-1)
        out = torch.empty_like(flat)
        own(flat, out, flat.numel())
        return out.view(x.shape)

    _made["half"] = (understudy.register_candidate("ust_fallback_cuda::silu_half", half_in_torch, like="aten::silu"),
                     half_in_torch)
    _made["whole"] = (understudy.register_candidate("ust_fallback_cuda::silu_whole", whole, like="aten::silu"), whole)
    return _made


KERNEL = "silu_head"  # the candidates' own kernel, by the name the profiler gives it


def profiled(fn, x, runs):
    """Kernels per run, those not the candidate's own per run, and the time
    share of the latter, from torch.profiler's kernel events."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn(x)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    theirs = [e for e in kernels if KERNEL not in e.name]
    total = sum(e.device_time_total for e in kernels)
    return len(kernels) / runs, len(theirs) / runs, sum(e.device_time_total for e in theirs) / total


def shadowed(us, name, x, calls):
    """calls of silu(x) shadowed by the candidate name, inside one kernel
    window (5 s, as the kernel timer's own tests open it); the route."""
    us.enable({"operators": {"silu": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": name, "target": "aten::silu"}}},
               "timer": {"kind": "cupti", "budget": 0, "window_ms": 5000},
               "report": {"interval_s": 0}})
    for _ in range(3):
        torch.nn.functional.silu(x)
    torch.cuda.synchronize()
    time.sleep(0.3)  # the window opens within the worker's poll once a GPU call was seen
    for _ in range(calls - 3):
        torch.nn.functional.silu(x)
    torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    (s,) = [s for s in op["shapes"] if s["op"] == "aten::silu"]
    return s, rep


def test_a_triton_candidate_handing_half_to_torch_is_labelled_with_its_kernels_share(us):
    name, fn = candidates()["half"]
    x = torch.randn(N, device="cuda")
    torch.testing.assert_close(fn(x), torch.nn.functional.silu(x))  # compiles the kernel, and is right
    per_run, theirs_per_run, share = profiled(fn, x, 20)
    assert per_run == 2 and theirs_per_run == 1, (per_run, theirs_per_run)
    s, rep = shadowed(us, name, x, 43)
    fb = s["fallback"]
    assert s["shadow"]["passed"] == 43 and fb["runs"] == 43, (s["shadow"], fb)
    k = fb["kernels"]
    assert k is not None and k["runs"] >= 30, (fb, rep["timer"])
    assert k["kernels"] == per_run * k["runs"] and k["kernels_in_ops"] == theirs_per_run * k["runs"], k
    print(f"fallback kernels on {torch.cuda.get_device_name()}: runs seen {k['runs']} of {fb['runs']}, "
          f"kernels {k['kernels']} ({k['kernels_in_ops']} in ops), time share {k['time_share']:.3f}; "
          f"torch.profiler: {per_run:g} kernels a run ({theirs_per_run:g} torch's), time share {share:.3f}")
    assert k["time_share"] == pytest.approx(share, abs=0.1), (k, share)
    assert f"{100 * k['time_share']:.3g}% of its kernel time in theirs" in s["served_by"]["fallback"]


def test_a_candidate_running_only_its_own_kernel_has_none_in_ops(us):
    name, fn = candidates()["whole"]
    x = torch.randn(N, device="cuda")
    torch.testing.assert_close(fn(x), torch.nn.functional.silu(x))
    per_run, theirs_per_run, _ = profiled(fn, x, 10)
    assert per_run == 1 and theirs_per_run == 0, (per_run, theirs_per_run)
    s, rep = shadowed(us, name, x, 23)
    k = s["fallback"]["kernels"]
    assert k is not None and k["runs"] >= 15, (s["fallback"], rep["timer"])
    assert k["kernels"] == k["runs"] and k["kernels_in_ops"] == 0 and k["time_share"] == 0, k
