"""How long `understudy calibrate --quick` takes, and whether the ceilings it
measures hold what plain torch calls reach on the same machine.

Each run, in turn:
- the command itself, `python -m understudy calibrate --quick` in a child
  process, timed from start to exit (the time a user waits, torch's import
  included);
- calibrate(quick=True) in this process, timed around the call, then plain
  calls timed here with torch's own thread count: the best fp32 torch.mm
  rate over square sizes 256 to 2048 and the best copy rate over 256 KiB to
  64 MiB, each the best of a few repetitions. A ratio below 1 would be a
  call faster than the profile's floor.

    PYTHONPATH=python-shim python3 benchmarks/calibrate.py [--runs 5] [--device cpu]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch

import _results

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python-shim"))
from understudy.calibrate import TIME_BUDGET_S, calibrate  # noqa: E402


def plain_rates(device: str, reps: int = 3) -> tuple:
    """(best fp32 mm FLOP/s, best copy bytes/s) of plain torch calls."""
    def timed(fn):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    mm = copy = 0.0
    for n in (256, 512, 1024, 2048) if device == "cpu" else (2048, 4096, 8192):
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        torch.mm(a, b)
        for _ in range(reps):
            mm = max(mm, 2 * n ** 3 / timed(lambda: torch.mm(a, b)))
    for nbytes in (1 << 18, 1 << 22, 1 << 26) if device == "cpu" else (1 << 24, 1 << 28):
        src = torch.ones(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        for _ in range(reps):
            copy = max(copy, 2 * nbytes / timed(lambda: dst.copy_(src)))
    return mm, copy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    rows = []
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "understudy", "calibrate", "--quick", "--device", args.device,
                            "--out", os.path.join(d, "p.json")], env=env, check=True, capture_output=True)
            command_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        prof = calibrate(args.device, quick=True)
        measuring_s = time.perf_counter() - t0
        mm, copy = plain_rates(args.device)
        fp32, bw = prof["p_peak"]["fp32"], prof["b_peak"]
        rows.append([i + 1, round(command_s, 2), round(measuring_s, 2), round(fp32 / 1e9, 1), round(mm / 1e9, 1),
                     round(fp32 / mm, 2), round(bw / 1e9, 1), round(copy / 1e9, 1), round(bw / copy, 2)])
        print(rows[-1], flush=True)
    load = os.getloadavg()
    notes = [f"{torch.get_num_threads()} intra-op threads, {os.cpu_count()} cores; load average "
             f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; budget {TIME_BUDGET_S['quick']} s a figure"]
    table = _results.table("calibrate --quick: time, and its ceilings against plain torch calls",
                           ["run", "command s", "measuring s", "fp32 GFLOP/s", "plain mm GFLOP/s", "fp32 / mm",
                            "copy GB/s", "plain copy GB/s", "copy / plain"], rows)
    for r in rows:
        print(r)
    print(notes[0])
    _results.write("calibrate", [table], args=args, notes=notes, device=args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
