"""Per-call host cost of the dispatcher seam.

For a small op on each available device, measures in one run the host time
per call of: plain torch; understudy disabled (its interceptor stays
registered once it was ever enabled, and passes calls through); enabled with
the op's mode off; observing with every call keyed (key_every 1) and none
timed (the untimed path alone), 1 in 16 timed, every call timed (by the plain
event pair, and held: timer.hold "auto"); observing
with 1 call in 64 (the defaults) or 1 in 16 keyed at random and the
others tallied (none timed);
observing at the defaults; with the CUPTI kernel tracer, between its
windows and inside one (every call timed by its kernels, every launch
traced); and a pass-through Python TorchDispatchMode.

Three child processes measure on request, on equal footing (the same
core, one at a time, one torch thread): one that never loads understudy
(plain torch, the dispatch mode), one that does (the interceptor, once
registered, stays for the life of its process) and one for the kernel
tracer (CUPTI, once it traced, stays attached to its process). Rounds interleave the
variants; the table reports medians over rounds with the difference and
ratio to plain.

A call measured back to back with its like finds understudy's code and
data in the core's caches; a call in a model comes after other work has
evicted them. --cold MB writes MB megabytes of host memory before every
call (untimed; each call timed on its own), so that each call pays the
misses of the path it takes (with a few hundred --calls: each write takes
milliseconds).

    PYTHONPATH=python-shim python3 benchmarks/overhead.py [--calls N] [--rounds R] [--cold MB]
"""
import argparse
import statistics
import subprocess
import sys
import time
import pathlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import _results

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))  # after PYTHONPATH: another tree can be measured

VARIANTS = {  # name -> (child, understudy config or None)
    "plain": ("plain", None),
    "understudy disabled": ("understudy", None),
    "understudy, mode off": ("understudy", {"operators": {"gemm": "off"}}),
    # every call keyed (key_every 1): none timed, 1 in 16 timed, every one timed
    "understudy, observe, none timed": ("understudy", {"defaults": {"key_every": 1},
                                                       "operators": {"gemm": {"mode": "observe", "sample": 0}}}),
    "understudy, observe 1/16": ("understudy", {"defaults": {"key_every": 1},
                                                "operators": {"gemm": {"mode": "observe", "sample": 1 / 16}}}),
    # 1 call in 64 (the defaults' key_every) keyed at random from the first
    # call, the others tallied; none timed
    "understudy, observe, tallied": ("understudy", {"defaults": {"key_after": 0},
                                                    "operators": {"gemm": {"mode": "observe", "sample": 0}}}),
    # the same with 1 call in 16 keyed: against the row above, what keyed
    # calls cost among tallied ones (12 more in every 256 calls)
    "understudy, observe, 1 in 16 keyed": ("understudy", {"defaults": {"key_after": 0, "key_every": 16},
                                                          "operators": {"gemm": {"mode": "observe", "sample": 0}}}),
    # the defaults: a thread's first 4,096 calls keyed, then 1 in 64 (the
    # others tallied); of the keyed, a key's first 3 and those standing for a
    # call its sample would time (1 in 16 of the calls: every keyed one), 1 in
    # 256 past its steady_after
    "understudy, observe, defaults": ("understudy", {"operators": {"gemm": "observe"}}),
    "understudy, observe all": ("understudy", {"defaults": {"key_every": 1},
                                               "operators": {"gemm": {"mode": "observe", "sample": 1.0}}}),
    # every call timed by a held pair (timer.hold "auto"): against the row
    # above, what holding costs a timed call (a kernel launched more, the
    # release); on the CPU the same as the row above
    "understudy, observe all, held": ("understudy", {"defaults": {"key_every": 1},
                                                     "operators": {"gemm": {"mode": "observe", "sample": 1.0}},
                                                     "timer": {"hold": "auto"}}),
    # the kernel tracer (timer.kind "cupti"), in a process of its own: once
    # CUPTI traced API calls, every later launch of the process stays slower.
    # Between windows a call is counted and keyed (a key's first calls timed
    # by events): a 1 ms window spaced by a tiny budget leaves the measurement
    # outside; inside a window every call is timed by its kernels and every
    # launch of the process traced.
    "cupti, between windows": ("tracer", {"operators": {"gemm": "observe"},
                                          "timer": {"kind": "cupti", "window_ms": 1, "budget": 1e-6}}),
    "cupti, in a window": ("tracer", {"operators": {"gemm": "observe"},
                                      "timer": {"kind": "cupti", "window_ms": 600000, "budget": 0}}),
    # correlated through launch callbacks (no API records), in a process of its own
    "cupti callbacks, between windows": ("tracer_cb", {"operators": {"gemm": "observe"},
                                                       "timer": {"kind": "cupti", "correlation": "callbacks",
                                                                 "window_ms": 1, "budget": 1e-6}}),
    "cupti callbacks, in a window": ("tracer_cb", {"operators": {"gemm": "observe"},
                                                   "timer": {"kind": "cupti", "correlation": "callbacks",
                                                             "window_ms": 600000, "budget": 0}}),
    "python TorchDispatchMode": ("plain", "mode"),
}


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def per_call_us(fn, a, b, calls, device, junk=None):
    """Host µs per call of fn(a, b); with junk (a host tensor), junk is
    written before each call, untimed, and each call timed on its own."""
    if device == "cuda":
        torch.cuda.synchronize()
    if junk is None:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(a, b)
        took = time.perf_counter_ns() - t0
    else:
        took = 0
        for _ in range(calls):
            junk.add_(1.0)
            t0 = time.perf_counter_ns()
            fn(a, b)
            took += time.perf_counter_ns() - t0
    if device == "cuda":
        torch.cuda.synchronize()  # outside the timed region: host cost only
    return took / calls / 1e3


def server(kind, device, calls, cpu, cold_mb):
    """Measures one variant per line read: its name in, a figure out. Both
    servers run on the same core (one at a time), so neither measures a
    colder or slower core than the other."""
    import os
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
        torch.set_num_threads(1)
    understudy = None
    if kind in ("understudy", "tracer", "tracer_cb"):
        import understudy
        understudy.enable({"operators": {"gemm": "off"}})  # registers the interceptor once
        understudy.disable()
    a, b = torch.randn(16, 16, device=device), torch.randn(16, 16, device=device)
    junk = torch.zeros(int(cold_mb * 2 ** 20) // 4) if cold_mb > 0 else None
    with torch.inference_mode():
        for line in sys.stdin:
            _, cfg = VARIANTS[line.strip()]
            if cfg == "mode":
                with PassThrough():
                    per_call_us(torch.mm, a, b, calls // 10, device, junk)
                    print(per_call_us(torch.mm, a, b, calls, device, junk), flush=True)
                continue
            if cfg is not None:
                understudy.enable(cfg)
                if "timer" in cfg and device == "cuda":
                    for _ in range(10):
                        torch.mm(a, b)
                    torch.cuda.synchronize()
                    time.sleep(0.25)  # the tracer's first window opens (worker poll: 0.1 s)
            try:
                per_call_us(torch.mm, a, b, calls // 10, device, junk)  # warm-up
                print(per_call_us(torch.mm, a, b, calls, device, junk), flush=True)
            finally:
                if cfg is not None:
                    understudy.disable()


def run(device, calls, rounds, wanted, cold_mb):
    import os
    cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1
    kids = {kind: subprocess.Popen([sys.executable, "-X", "faulthandler", __file__, "--server", kind, device, "--calls", str(calls),
                                    "--cpu", str(cpu), "--cold", str(cold_mb)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for kind in ("plain", "understudy", "tracer", "tracer_cb") if kind in wanted}
    variants = {name: v for name, v in VARIANTS.items() if v[0] in kids}
    samples = {k: [] for k in variants}
    for _ in range(rounds):
        for name, (kind, _) in variants.items():
            kids[kind].stdin.write(name + "\n")
            kids[kind].stdin.flush()
            line = kids[kind].stdout.readline()
            if not line:  # the child died: say which and how
                raise SystemExit(f"overhead: the {kind!r} child ended (exit status {kids[kind].wait()}) "
                                 f"while measuring {name!r}")
            samples[name].append(float(line))
    for k in kids.values():
        k.stdin.close()
        k.wait()
    base = statistics.median(samples["plain"])
    return [(device, name, statistics.median(s), statistics.median(s) - base, statistics.median(s) / base)
            for name, s in samples.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--kids", nargs="+", default=["plain", "understudy", "tracer", "tracer_cb"],
                    choices=["plain", "understudy", "tracer", "tracer_cb"],
                    help="the child processes to run (their variants only; plain always)")
    ap.add_argument("--devices", nargs="+", default=None, help="cpu, cuda (default: every one present)")
    ap.add_argument("--server", nargs=2, metavar=("KIND", "DEVICE"), help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--cold", type=float, default=0,
                    help="megabytes of host memory written before every call (0: calls back to back)")
    args = ap.parse_args()
    if args.server:
        server(args.server[0], args.server[1], args.calls, args.cpu, args.cold)
        return
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for d in devices:
        rows += run(d, args.calls, args.rounds, set(args.kids) | {"plain"}, args.cold)
    dev_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    cold = f"{args.cold:g} MB of host memory written before each call" if args.cold > 0 else "calls back to back"
    print(f"torch.mm 16x16 fp32, host time per call ({cold}); median of {args.rounds} rounds x {args.calls} calls; "
          f"torch {torch.__version__}; {dev_name}")
    print(f"{'device':<6} {'variant':<36} {'us/call':>9} {'+us':>8} {'ratio':>7}")
    for d, name, med, delta, ratio in rows:
        print(f"{d:<6} {name:<36} {med:>9.2f} {delta:>+8.2f} {ratio:>7.2f}")
    _results.write("overhead", [_results.table(
        f"torch.mm 16x16 fp32, host time per call ({cold}); median of {args.rounds} rounds x {args.calls} calls",
        ["device", "variant", "us/call", "+us", "ratio"],
        [(d, name, round(med, 3), round(delta, 3), round(ratio, 3)) for d, name, med, delta, ratio in rows],
        [None, None, ".2f", "+.2f", ".2f"])], args=args, device="cpu" if devices == ["cpu"] else None)


if __name__ == "__main__":
    main()
