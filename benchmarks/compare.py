"""Bandwidth of the guard's comparison kernel against a device-to-device copy.

For bf16 and fp32 outputs of >= 256 MB each, in two cases: a candidate
within the dtype's default tolerance (noise well below it: the steady state
of shadowing a correct candidate) and one far outside it (about half the
elements mismatch: what a wrong candidate shows once, before it is rolled
back), measures in one run:
- the copy bandwidth of the device (dst.copy_(src): reads and writes N bytes),
  timed with CUDA events around a burst of copies;
- the comparison (one pass reading production and candidate: 2N bytes),
  timed on the device by ust_compare_sync's own events (memset of the result,
  the kernel, nothing of the host's; work queued ahead keeps launch gaps out),
  median over rounds;
and prints both in GB/s with their ratio. Rounds interleave the two.

On a machine without CUDA it measures the host loop against a host copy
instead (a smaller size; the figures are for reference only).

    PYTHONPATH=python-shim python3 benchmarks/compare.py [--mb 256] [--rounds 9]
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

import _results

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402


def copy_gbps(src, dst, reps):
    if src.is_cuda:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        stop.record()
        stop.synchronize()
        secs = start.elapsed_time(stop) / 1e3 / reps
    else:
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        secs = (time.perf_counter() - t0) / reps
    return 2 * src.numel() * src.element_size() / secs / 1e9


def compare_gbps(p, c):
    if p.is_cuda:
        # Work queued ahead (about a millisecond of spinning) so that the
        # result reset and the kernel are both queued before the device
        # reaches them: the events then time the device, not launch gaps,
        # as the burst of copies does for the copy.
        torch.cuda._sleep(2_000_000)
    r = understudy.compare(p, c)
    assert r["elements"] == p.numel()
    return 2 * p.numel() * p.element_size() / (r["device_time_ns"] / 1e9) / 1e9, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=None, help="size of each tensor in MB (default 256 on CUDA, 64 on CPU)")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mb = args.mb or (256 if device == "cuda" else 64)
    name = torch.cuda.get_device_name() if device == "cuda" else "host"
    print(f"understudy compare benchmark on {name}, torch {torch.__version__}, {mb} MB per tensor, "
          f"median of {args.rounds} rounds")
    print(f"{'dtype':>8} {'candidate':>17} {'elements':>10} {'mismatching':>11} {'copy GB/s':>10} "
          f"{'compare GB/s':>13} {'ratio':>6}")
    # Noise added to production: well within the default tolerance
    # (atol 1e-2, rtol 5e-2 for bf16; 1e-4, 1e-3 for fp32), and far outside it.
    cases = [(torch.bfloat16, "within tolerance", 1e-3), (torch.bfloat16, "outside", 1e-1),
             (torch.float32, "within tolerance", 1e-5), (torch.float32, "outside", 1e-3)]
    rows = []
    for dtype, case, noise in cases:
        n = mb * (1 << 20) // torch.tensor([], dtype=dtype).element_size()
        g = torch.Generator(device=device).manual_seed(0)
        p = torch.randn(n, device=device, dtype=dtype, generator=g)
        c = p + torch.randn(n, device=device, dtype=dtype, generator=g) * noise
        dst = torch.empty_like(p)
        copy_gbps(p, dst, 2)
        r = compare_gbps(p, c)[1]  # warm-up
        copies, compares = [], []
        for _ in range(args.rounds):
            copies.append(copy_gbps(p, dst, 10 if device == "cuda" else 2))
            compares.append(compare_gbps(p, c)[0])
        cp, cm = statistics.median(copies), statistics.median(compares)
        print(f"{str(dtype).replace('torch.', ''):>8} {case:>17} {n:>10} {r['mismatches'] / n:>11.1%} {cp:>10.0f} "
              f"{cm:>13.0f} {cm / cp:>6.2f}")
        rows.append((str(dtype).replace("torch.", ""), case, n, round(r["mismatches"] / n, 4), round(cp), round(cm),
                     round(cm / cp, 3)))
        del p, c, dst
        if device == "cuda":
            torch.cuda.empty_cache()
    _results.write("compare", [_results.table(
        f"comparison kernel against a device copy, {mb} MB per tensor, median of {args.rounds} rounds",
        ["dtype", "candidate", "elements", "mismatching", "copy GB/s", "compare GB/s", "ratio"], rows,
        [None, None, ",", ".1%", ",", ",", ".2f"])], args=args, device=device)


if __name__ == "__main__":
    main()
