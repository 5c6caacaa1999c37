"""Measured ceilings of the present device, written as a hardware profile that
can be used instead of the datasheet's (problems/hardware/*.json format):

    python -m understudy calibrate --out my-device.json [--device cuda|cpu] [--quick]

A floor is honest only if no call of the host beats it, so each figure is the
best rate this process reaches, measured the way the host's calls run: in the
same torch, with the intra-op thread count torch uses (torch.get_num_threads(),
which OMP_NUM_THREADS and torch.set_num_threads set), over sizes that grow
until the rate stops rising or the time runs out.

Memory: the best copy bandwidth (bytes read + written per second) over sizes
from ones that fit a core's cache (on the CPU: a floor must hold for data a
small model keeps in cache) to ones far past the last level. Compute: the best
matrix-multiply rate per path (bf16, fp16, fp32; on CUDA also tf32 and fp8
where torch has it) over square sizes.

Time: each figure has a budget (TIME_BUDGET_S, per figure; quick or full), and
the measuring stops when it is spent, so a busy machine gets fewer repetitions,
not a longer run. A size is tried only when the rate of the size before it says
that a warm-up and two timed calls fit in what is left: a path emulated in
software (bf16 on a CPU without bf16 instructions runs at about a GFLOP/s)
stops at small sizes instead of running for minutes. The time left after the
sweep goes to repeating the size that did best: on a shared machine the best
of many repetitions is the one another tenant did not slow down.
"""
from __future__ import annotations

import json
import platform
import time

import torch

# seconds of measuring per figure (the copy rate and each matmul path)
TIME_BUDGET_S = {"quick": 0.6, "full": 3.0}

_CPU_MM = [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
_GPU_MM = [1024, 2048, 4096, 8192, 16384]
_CPU_COPY = [1 << k for k in range(16, 29, 2)]   # 64 KiB .. 256 MiB
_GPU_COPY = [1 << k for k in range(22, 32, 2)]   # 4 MiB .. 1 GiB


def _timer(device: str):
    """A function that runs fn once and returns its time in seconds: CUDA
    events on a GPU (the device's time), the host clock on the CPU."""
    if device == "cuda":
        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return run

    def run(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


def _best_rate(device: str, sizes, make, amount, budget_s: float) -> tuple:
    """The best rate (amount per second) over sizes, within budget_s seconds.

    make(n) returns a function running one call of size n (or None: the
    size cannot run, e.g. out of memory) and amount(n) the work one call
    does. Returns (rate, the size that reached it, seconds spent, calls
    timed)."""
    run = _timer(device)
    t_end = time.perf_counter() + budget_s
    best, best_n, timed = 0.0, None, 0
    prev_n, prev_t = None, None  # the last size tried and its fastest call
    fns = {}
    for n in sizes:
        left = t_end - time.perf_counter()
        # the last size's fastest call predicts this size's as growing with
        # n squared: a small call is mostly overhead, which does not grow
        # with n, and a large one's work grows with n cubed, which the next
        # size's warm-up (below) catches. A warm-up and two timed calls must
        # fit in what is left.
        if left <= 0 or (prev_t is not None and 3 * prev_t * (n / prev_n) ** 2 > left):
            break
        try:
            fn = make(n)
        except (RuntimeError, MemoryError):
            fn = None
        if fn is None:
            break
        fns[n] = fn
        # the warm-up (first-call set-up: allocations, kernel selection; the
        # first size's also the library's own, a cuBLAS handle) is not a
        # sample, but past the first size its time bounds a call's: where
        # the rate falls with size (a path emulated in software) it stops
        # the sweep here
        warm = run(fn)
        if best_n is not None and 2 * warm > t_end - time.perf_counter():
            break
        fastest = warm
        for _ in range(2):
            t = run(fn)
            timed += 1
            fastest = min(fastest, t)
            rate = amount(n) / max(t, 1e-9)
            if rate > best:
                best, best_n = rate, n
        prev_n, prev_t = n, fastest
    # the rest of the budget repeats the best size: the best of many
    # repetitions is the one nothing else on the machine slowed down
    if best_n is not None:
        fn = fns[best_n]
        per_call = amount(best_n) / best
        while time.perf_counter() + per_call < t_end:
            rate = amount(best_n) / max(run(fn), 1e-9)
            timed += 1
            best = max(best, rate)
    fns.clear()
    return best, best_n, budget_s - (t_end - time.perf_counter()), timed


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
    """Measure the device and return its profile (the hardware/*.json
    format). Spends about TIME_BUDGET_S per figure: 4 figures on a CPU
    (copy, bf16, fp16, fp32), up to 6 on CUDA (tf32, fp8). Leaves torch's
    settings (thread count, TF32) as it found them."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    budget = TIME_BUDGET_S["quick" if quick else "full"]
    t_start = time.perf_counter()
    on_cpu = device == "cpu"
    threads = torch.get_num_threads()
    where = {}  # figure -> (size, threads) of its best

    def measure(figure, sizes, make, amount) -> float:
        """The figure's best rate for torch's thread count. On a CPU with N
        > 1 intra-op threads, half the budget runs them all, as the host's
        calls do, and half one thread, whose rate counts N times: the rate
        N threads reach when the cores are theirs (one core's turbo clock is
        the fastest, so no more than that). On a busy machine a parallel
        call waits for its slowest thread to be scheduled (a small matmul
        then reads tens of milliseconds) while one thread's rate is measured
        in the gaps other tenants leave."""
        plans = [threads, 1] if on_cpu and threads > 1 else [threads]
        best = 0.0
        for t in plans:
            if on_cpu:
                torch.set_num_threads(t)
            try:
                rate, n, _, _ = _best_rate(device, sizes, make, amount, budget / len(plans))
            finally:
                if on_cpu:
                    torch.set_num_threads(threads)
            if rate * threads / t > best:
                best, where[figure] = rate * threads / t, (n, t)
        return best

    def make_copy(nbytes):
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    b_peak = measure("copy", _CPU_COPY if on_cpu else _GPU_COPY, make_copy, lambda nbytes: 2.0 * nbytes)

    def make_mm(dt):
        def make(n):
            a = torch.randn(n, n, device=device).to(dt)
            b = torch.randn(n, n, device=device).to(dt)
            return lambda: torch.mm(a, b)
        return make

    def make_fp8(n):  # fp8 e4m3 through torch._scaled_mm, where the device has it
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    flops = lambda n: 2.0 * n ** 3  # noqa: E731
    sizes = _CPU_MM if on_cpu else _GPU_MM
    p_peak = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
            p_peak[name] = measure(name, sizes, make_mm(dt), flops)
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            p_peak["tf32"] = measure("tf32", sizes, make_mm(torch.float32), flops)
            try:
                p_peak["fp8_e4m3"] = measure("fp8_e4m3", sizes, make_fp8, flops)
            except (RuntimeError, AttributeError, TypeError):
                pass
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    p_peak = {k: v for k, v in p_peak.items() if v > 0}
    seconds = time.perf_counter() - t_start
    dev_name = (torch.cuda.get_device_name() if device == "cuda" else _cpu_name()).strip()
    best_at = ", ".join(f"{k} {'at ' + str(n) + (' bytes' if k == 'copy' else '')}"
                        + (f" on {t} thread{'s' if t > 1 else ' (times ' + str(threads) + ')'}" if on_cpu else "")
                        for k, (n, t) in where.items())
    how = (f"torch's {threads} intra-op threads (and 1), " if on_cpu else "") + \
        f"best over {budget:g} s a figure, {seconds:.1f} s in all; best: {best_at}"
    # profile names and match words are at most 63 characters
    return {"schema_version": 1, "name": f"{dev_name[:52]} (measured)", "match": [dev_name[:63]],
            "p_peak": {k: float(f"{v:.4g}") for k, v in p_peak.items()}, "b_peak": float(f"{b_peak:.4g}"),
            "source": f"understudy calibrate on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
                      f"torch {torch.__version__}: {how}"}


def main(out: str, device: str = None, quick: bool = False) -> int:
    t0 = time.perf_counter()
    prof = calibrate(device, quick)
    with open(out, "w") as f:
        json.dump(prof, f, indent=2)
        f.write("\n")
    print(f"{prof['name']}: copy {prof['b_peak'] / 1e9:.1f} GB/s; " +
          ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in prof["p_peak"].items()) +
          f"; measured in {time.perf_counter() - t0:.1f} s; written to {out}")
    return 0
