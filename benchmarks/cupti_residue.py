"""What a kernel tracer's window leaves behind in the process: the host cost
of a kernel launch after each step understudy's tracer takes with CUPTI,
over its cost before, each variant in a fresh process
(benchmarks/cupti_residue.cu says what each step is).

Builds the program with nvcc, finds libcupti.so.13 (the one torch's wheels
bring, else the CUDA toolkit's), runs every variant for runtime and driver
launches, in rounds that take the variants in turn, and prints per variant
the launch's host cost before the step and the ratios during and after it
(median of the rounds, and their range). Needs a CUDA device.

    python3 benchmarks/cupti_residue.py [--rounds 5] [--variants none cycles ...]
"""
from __future__ import annotations

import argparse
import glob
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

import _results
import torch  # noqa: F401 (the GPU and CUDA the results name)

HERE = pathlib.Path(__file__).resolve().parent
VARIANTS = ["none", "load", "subscribe", "callbacks", "kernels", "window", "records", "window+final",
            "kernels+final", "cycles", "cycles+final", "cycles+exit"]


def libcupti() -> str:
    """libcupti.so.13: torch's wheel's, else the toolkit's."""
    found = []
    for p in sys.path:
        found += glob.glob(os.path.join(p, "nvidia", "**", "libcupti.so.13"), recursive=True)
    for root in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
        found += glob.glob(os.path.join(root, "**", "libcupti.so.13"), recursive=True)
    if not found:
        sys.exit("cupti_residue: libcupti.so.13 not found (torch's nvidia-cuda-cupti wheel or the CUDA toolkit)")
    return found[0]


def build(out: pathlib.Path) -> pathlib.Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cuda = pathlib.Path(nvcc).resolve().parent.parent
    exe = out / "cupti_residue"
    subprocess.run([nvcc, "-O2", "-arch=sm_90", f"-I{cuda}/include", "-o", str(exe), str(HERE / "cupti_residue.cu"),
                    "-lcuda", "-ldl"], check=True)
    return exe


def run(exe: pathlib.Path, variant: str, launch: str, lib: str) -> dict:
    """One process's medians, or {"failed": why} when it did not end well
    (a crash is a finding: the table counts it)."""
    try:
        r = subprocess.run([str(exe), variant, launch, lib], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"failed": "no exit in 120 s"}
    if r.returncode != 0:
        why = f"exit {r.returncode}: {r.stderr.strip()[-200:]}"
        print(f"cupti_residue: {variant} {launch}: {why}", file=sys.stderr)
        return {"failed": why}
    fields = dict(kv.split("=") for kv in r.stdout.split()[2:])
    return {k: float(v) for k, v in fields.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    args = ap.parse_args()
    lib = libcupti()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(pathlib.Path(tmp))
        runs = {(v, l): [] for v in args.variants for l in ("runtime", "driver")}
        for _ in range(args.rounds):
            for key in runs:
                runs[key].append(run(exe, key[0], key[1], lib))
    rows = []
    for (v, l), all_rs in runs.items():
        rs = [r for r in all_rs if "failed" not in r]
        failed = f"{len(all_rs) - len(rs)} of {len(all_rs)}"
        if not rs:
            rows.append([v, l, None, None, None, "", failed])
            continue
        during = [r["during_ns"] / r["before_ns"] for r in rs]
        after = [r["after_ns"] / r["before_ns"] for r in rs]
        rows.append([v, l, round(statistics.median(r["before_ns"] for r in rs), 1),
                     round(statistics.median(during), 3), round(statistics.median(after), 3),
                     f"{min(after):.3f}-{max(after):.3f}", failed])
    cols = ["step", "launch", "before ns", "during / before", "after / before", "after: range", "processes failed"]
    title = (f"host cost of an empty kernel's launch after each CUPTI step, over its cost before "
             f"(median of {args.rounds} processes each)")
    print(title)
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(x) for x in r))
    _results.write("cupti_residue", [_results.table(title, cols, rows)], args=args,
                   notes=[f"libcupti: {lib}"], device="cuda")


if __name__ == "__main__":
    main()
