"""Measured ceilings of the present device, written as a hardware profile that
can be used instead of the datasheet's (problems/hardware/*.json format):

    python -m understudy calibrate --out my-device.json [--device cuda|cpu] [--quick]

Memory: the best copy bandwidth (bytes read + written per second) over a few
sizes (on the CPU, sizes that fit its caches among them, so that the floor
holds for data a small model keeps in cache). Compute: the best matrix-multiply rate per path (bf16, fp16, fp32; on
CUDA also tf32) over a few square sizes. Each figure is the best of several
timed repetitions (CUDA events on a GPU, the host clock on the CPU).
"""
from __future__ import annotations

import json
import platform
import time

import torch


def _time(fn, device: str, reps: int) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        return best
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "host CPU"


def calibrate(device: str = None, quick: bool = False) -> dict:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    reps = 3 if quick else 10
    copy_sizes = [1 << 24, 1 << 26] if quick else [1 << 26, 1 << 28]
    if device == "cpu":
        # a floor must hold for data in cache too: the best copy rate of any
        # level, one that fits a core's cache among the sizes
        copy_sizes = [1 << 18, 1 << 20] + copy_sizes
    b_peak = 0.0
    for nbytes in copy_sizes:
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1)
        dst = torch.empty_like(src)
        b_peak = max(b_peak, 2 * nbytes / _time(lambda: dst.copy_(src), device, reps))
    paths = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    sizes = ([256, 512] if quick else [1024, 2048]) if device == "cpu" else ([2048, 4096] if quick else [4096, 8192])
    p_peak = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        for name, dt in paths.items():
            best = 0.0
            for n in sizes:
                a = torch.randn(n, n, device=device).to(dt)
                b = torch.randn(n, n, device=device).to(dt)
                t = _time(lambda: torch.mm(a, b), device, reps)
                best = max(best, 2 * n ** 3 / t)
            p_peak[name] = best
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            n = sizes[-1]
            a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
            p_peak["tf32"] = 2 * n ** 3 / _time(lambda: torch.mm(a, b), device, reps)
            try:  # fp8 e4m3 through torch._scaled_mm, where the device has it
                fa = a.to(torch.float8_e4m3fn)
                fb = b.to(torch.float8_e4m3fn).t().contiguous().t()
                one = torch.ones((), device=device)
                p_peak["fp8_e4m3"] = 2 * n ** 3 / _time(
                    lambda: torch._scaled_mm(fa, fb, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, reps)
            except (RuntimeError, AttributeError, TypeError):
                pass
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    dev_name = (torch.cuda.get_device_name() if device == "cuda" else _cpu_name()).strip()
    # profile names and match words are at most 63 characters
    return {"schema_version": 1, "name": f"{dev_name[:52]} (measured)", "match": [dev_name[:63]],
            "p_peak": {k: float(f"{v:.4g}") for k, v in p_peak.items()}, "b_peak": float(f"{b_peak:.4g}"),
            "source": f"understudy calibrate on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
                      f"torch {torch.__version__}: best of {reps} (copy sizes {copy_sizes} bytes, mm sizes {sizes})"}


def main(out: str, device: str = None, quick: bool = False) -> int:
    prof = calibrate(device, quick)
    with open(out, "w") as f:
        json.dump(prof, f, indent=2)
        f.write("\n")
    print(f"{prof['name']}: copy {prof['b_peak'] / 1e9:.1f} GB/s; " +
          ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in prof["p_peak"].items()) + f"; written to {out}")
    return 0
