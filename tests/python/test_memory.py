"""Memory returns to its baseline over enable/disable cycles: host RSS, open
file descriptors and threads on the CPU, the device's memory on CUDA.

On the host, understudy registers one dispatcher interceptor per op for the
life of the process (on purpose: a later enable reuses it), and torch, the
allocators and the first candidate loads settle in the first cycles: those
are warm-up, done before the baseline is taken. On the device nothing is
kept: the baseline is taken before the first enable."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

# One process of its own, so that other tests' allocations do not move its
# RSS. argv: cycles, warm-up cycles, a scratch directory. Prints one JSON
# line: the samples taken after each cycle from the warm-up on.
CPU_CYCLES = r"""
import ctypes, gc, json, os, sys
sys.path[:0] = [os.path.join(sys.argv[4], "tests", "python"), os.path.join(sys.argv[4], "python-shim")]
import torch
import torch.nn.functional as F
import understudy
from test_shadow import candidate_op, native, rms_inputs, run_rms_norm, silu_and_mul

cycles, warmup, scratch = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
libc = ctypes.CDLL(None)
page = os.sysconf("SC_PAGE_SIZE")
silu_cand = candidate_op("ust_mem::silu", lambda t: t * torch.sigmoid(t), "aten::silu")
config = {
    "report": {"path": os.path.join(scratch, "report.json"), "interval_s": 0.01},
    "state": {"path": os.path.join(scratch, "state.json")},
    "hardware": {"profile": "H200"},
    "operators": {
        "gemm": {"sample": 1.0}, "sdpa": {"sample": 1.0}, "topk": {"sample": 0.5}, "silu_and_mul": "observe",
        "rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
        "silu": {"mode": "shadow", "sample": 1.0, "candidate": {"torch_op": silu_cand, "target": "aten::silu"}},
    },
}
inputs = rms_inputs()
a, b = torch.randn(32, 64), torch.randn(64, 16)
q = torch.randn(1, 2, 16, 8)
x = torch.randn(8, 64)


def sample():
    gc.collect()
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)  # freed heap tops back to the system: what stays is in use
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}


samples = []
for c in range(cycles):
    understudy.enable(config)
    for m in (4, 8, 16, 32):  # several shape keys a cycle, and phases
        with understudy.phase("prefill" if m > 8 else "decode"):
            torch.mm(a[:m], b)
            F.silu(x[:m])
            torch.topk(x[:m], 4)
    F.scaled_dot_product_attention(q, q, q)
    run_rms_norm(inputs, repeat=2)
    silu_and_mul(x)
    understudy.set_mode("rms_norm", "observe")
    understudy.report()
    understudy.disable()
    if c + 1 >= warmup:
        samples.append(sample())
print(json.dumps(samples))
"""


def test_host_memory_flat_over_enable_disable_cycles(tmp_path):
    """100 cycles of enable (shadow with a native and a torch-op candidate,
    observe, a periodic report, a state file, a hardware profile), traffic
    on several shape keys and phases, a mode change, a report, disable.
    After 10 warm-up cycles: RSS grows by less than 1 MiB over the other 90
    (one leaked route alone, its two histograms of 976 eight-byte buckets,
    would add 1.4 MB; a leaked report text of this traffic, about 12 KB,
    1 MB), and open files and threads are as many as after the warm-up (a
    candidate's memfd or the report writer's thread left behind shows at
    once)."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under ASan freed memory waits in its quarantine: RSS is measured in the plain run, "
                    "leaks by LeakSanitizer in the C runner")
    cycles, warmup = 100, 10
    r = subprocess.run([sys.executable, "-c", CPU_CYCLES, str(cycles), str(warmup), str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    samples = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(samples) == cycles - warmup + 1
    base, last = samples[0], samples[-1]
    growth = last["rss"] - base["rss"]
    print(f"RSS after the warm-up {base['rss'] / 2**20:.1f} MiB, after {cycles} cycles "
          f"{last['rss'] / 2**20:.1f} MiB ({growth / 1024:+.0f} KiB); every 10 cycles: "
          f"{[round((s['rss'] - base['rss']) / 1024) for s in samples[::10]]} KiB")
    assert growth < 2**20
    assert [s["fds"] for s in samples] == [base["fds"]] * len(samples)
    assert [s["threads"] for s in samples] == [base["threads"]] * len(samples)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["native", "torch_op"])
def test_device_memory_returns_to_baseline(us, kind):
    """enable, shadow traffic with a CUDA candidate (the native one, or a
    torch op), disable; 10 times. After every cycle torch's allocator holds
    exactly what it held before the first enable, and so does the device as
    cudaMemGetInfo sees it, which counts understudy's own cudaMalloc'd
    buffers too: while shadowing they are visible there (48 MiB on an H200),
    so a cycle that kept them would show."""
    from test_shadow import _rms, candidate_op, native, rms_inputs, routes, run_rms_norm, shadow_config

    if kind == "native":
        cand = native("rms_norm_cuda")
    else:
        def impl(out, input, weight, eps):
            out.copy_(_rms(input, weight, eps))
        cand = {"torch_op": candidate_op("ust_mem::rms_norm_cuda", impl, "_C::rms_norm"), "target": "_C::rms_norm"}
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((1, 4096), (64, 4096), (512, 4096), (3, 5, 128)))
    run_rms_norm(inputs)  # torch's own kernels and caches, before the baseline

    def settle():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]

    alloc0, free0 = settle()
    after = []
    for c in range(10):
        us.enable(shadow_config("rms_norm", cand))
        run_rms_norm(inputs, repeat=4)
        if c == 0:
            torch.cuda.synchronize()
            shadowing = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
        rep = us.report()
        us.disable()
        assert all(r["shadow"]["passed"] == 4 for r in routes(rep, "_C::rms_norm")), rep
        after.append(settle())
    print(f"{kind}: while shadowing {(shadowing[1] - free0) / 2**20:+.1f} MiB free, "
          f"{shadowing[0] - alloc0:+d} bytes in torch's allocator; after each cycle "
          f"{[((a - alloc0), (f - free0) / 2**20) for a, f in after]}")
    # the measurement sees the buffers shadowing needs, wherever they come from
    assert shadowing[0] > alloc0 or shadowing[1] < free0
    assert after == [(alloc0, free0)] * len(after)
