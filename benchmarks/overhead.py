"""Per-call host cost of the dispatcher seam.

For a small op on each available device, measures in one run the host time
per call of: plain torch; understudy disabled (its interceptor stays
registered once it was ever enabled, and passes calls through); enabled with
the op's mode off; observing with the default sampling (every call counted
and keyed, 1 in 16 timed); timing every call; and a pass-through Python
TorchDispatchMode. Plain torch is measured in a child process that never
loads understudy (in this one the interceptor stays once registered); rounds
interleave the variants, and the table reports medians over rounds with the
difference and ratio to plain.

    PYTHONPATH=python-shim python3 benchmarks/overhead.py [--calls N] [--rounds R]
"""
import argparse
import statistics
import subprocess
import sys
import time
import pathlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def per_call_us(fn, a, b, calls, device):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn(a, b)
    t1 = time.perf_counter_ns()
    if device == "cuda":
        torch.cuda.synchronize()  # outside the timed region: host cost only
    return (t1 - t0) / calls / 1e3


def operands(device):
    n = 16
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)


def plain_server(device, calls):
    """Measures plain torch on request: one line in, one figure out."""
    a, b = operands(device)
    with torch.inference_mode():
        for _ in sys.stdin:
            per_call_us(torch.mm, a, b, calls // 10, device)
            print(per_call_us(torch.mm, a, b, calls, device), flush=True)


def run(device, calls, rounds):
    a, b = operands(device)
    plain = subprocess.Popen([sys.executable, __file__, "--plain-server", device, "--calls", str(calls)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    variants = {
        "plain": "plain",
        "understudy disabled": None,
        "understudy, mode off": {"operators": {"gemm": "off"}},
        "understudy, observe 1/16": {"operators": {"gemm": "observe"}},
        "understudy, observe all": {"operators": {"gemm": {"mode": "observe", "sample": 1.0}}},
        "python TorchDispatchMode": "mode",
    }
    samples = {k: [] for k in variants}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, cfg in variants.items():
                if cfg == "plain":
                    plain.stdin.write("go\n")
                    plain.stdin.flush()
                    samples[name].append(float(plain.stdout.readline()))
                    continue
                if cfg == "mode":
                    with PassThrough():
                        per_call_us(torch.mm, a, b, calls // 10, device)
                        samples[name].append(per_call_us(torch.mm, a, b, calls, device))
                    continue
                if cfg is not None:
                    understudy.enable(cfg)
                try:
                    per_call_us(torch.mm, a, b, calls // 10, device)  # warm-up
                    samples[name].append(per_call_us(torch.mm, a, b, calls, device))
                finally:
                    understudy.disable()
    plain.stdin.close()
    plain.wait()
    base = statistics.median(samples["plain"])
    rows = []
    for name, s in samples.items():
        med = statistics.median(s)
        rows.append((device, name, med, med - base, med / base))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--plain-server", metavar="DEVICE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_server:
        plain_server(args.plain_server, args.calls)
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for d in devices:
        rows += run(d, args.calls, args.rounds)
    dev_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"torch.mm 16x16 fp32, host time per call; median of {args.rounds} rounds x {args.calls} calls; "
          f"torch {torch.__version__}; {dev_name}")
    print(f"{'device':<6} {'variant':<26} {'us/call':>9} {'+us':>8} {'ratio':>7}")
    for d, name, med, delta, ratio in rows:
        print(f"{d:<6} {name:<26} {med:>9.2f} {delta:>+8.2f} {ratio:>7.2f}")


if __name__ == "__main__":
    main()
