"""Does the promotion policy promote a candidate that is not faster? Real runs, CPU and GPU.

Production and the candidate are torch ops defined here (torch-op candidates
registered with understudy.register_candidate), doing the same work scaled
by a known ratio, in shadow mode with the promotion policy at its shipped
defaults (min_verified 100, alpha 0.05, delta 0.05, max_samples 1000, A/A
at guard.aa_sample's default). Each route (a shape key of its own) is
called until its test decides: promoted (the route moves to canary),
rejected, or inconclusive. Rows:

- identical, sleep: both hold the call with time.sleep;
- identical, compute: both multiply x (64 x N) by its transpose REPS times;
- identical, compute, two CPU-bound processes beside it (`yes`, started
  here and killed after the row);
- 10 % faster, 10 % slower: the candidate does 0.9 or 1.1 times
  production's matrix products.

With --device cuda the rows are a Triton kernel's instead (Triton is
imported only then): production and the candidate launch the same kernel,
which writes 3 x and spends its time in a chain of dependent multiply-adds
per element (--iters of them, about --kernel-us microseconds; the run
measures and prints the kernel's own time first), the candidate with 1.0,
0.9 or 1.1 times production's chain.

Targets (issue 51): false promotions at most 5 % in every identical row;
10 % faster promoted and 10 % slower rejected in at least 90 % of the
routes, within max_samples. The table prints the counts (inconclusive, and
of those the routes whose own A/A spread was larger than delta), the
median paired samples a decision took and the median delta it was judged
with (production's own A/A spread widens it).

    PYTHONPATH=python-shim python3 benchmarks/promotion.py [--routes 100] [--threads 4]
    PYTHONPATH=python-shim python3 benchmarks/promotion.py --device cuda

Routes run one after another, but for the sleep row (--threads at a time:
sleeping routes do not compete for the cores). The machine is shared and
noisy: the figures are for this run, on this machine.
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

import _results

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))  # after PYTHONPATH
import understudy  # noqa: E402

REPS = 10        # production's matrix products per call (64 x N: about 0.4 ms on one core)
ROWS_X = 64      # x is ROWS_X x N, N the route's key
SLEEP_S = 0.005  # the sleep rows' hold
ROWS = [  # name, work, the candidate's share of production's work, CPU hogs beside it
    ("identical, sleep", "sleep", 1.0, 0),
    ("identical, compute", "compute", 1.0, 0),
    ("identical, compute, 2 CPU hogs", "compute", 1.0, 2),
    ("10 % faster, compute", "compute", 0.9, 0),
    ("10 % slower, compute", "compute", 1.1, 0),
]
GPU_ROWS = [
    ("identical, Triton", "triton", 1.0, 0),
    ("10 % faster, Triton", "triton", 0.9, 0),
    ("10 % slower, Triton", "triton", 1.1, 0),
]

_lib = torch.library.Library("ust_bench_promo", "DEF")
_lib.define("sleep(Tensor x) -> Tensor")
_lib.define("compute(Tensor x) -> Tensor")
_lib.define("triton(Tensor x) -> Tensor")


def hold(seconds):
    time.sleep(seconds)


def products(x, reps):
    for _ in range(reps):
        x @ x.T


def prod_sleep(x):
    hold(SLEEP_S)
    return x * 3


def prod_compute(x):
    products(x, REPS)
    return x * 3


_lib.impl("sleep", prod_sleep, "CPU")
_lib.impl("compute", prod_compute, "CPU")

_triton = {}  # "kernel": the jitted kernel, "iters": production's chain (set by use_triton)


def use_triton(iters):
    """Define the Triton kernel and production's CUDA implementation."""
    import triton
    import triton.language as tl

    @triton.jit
    def burn(x_ptr, y_ptr, spin_ptr, n, iters, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        acc = x
        for _ in range(iters):  # a dependent chain: time in proportion to iters
            acc = acc * 0.999 + 0.001
        tl.store(y_ptr + offs, x * 3, mask=mask)
        tl.store(spin_ptr + offs, acc, mask=mask)  # keeps the chain live

    _triton.update(kernel=burn, iters=iters)
    _lib.impl("triton", lambda x: launch(x, iters), "CUDA")


def launch(x, iters):
    y = torch.empty_like(x)
    spin = torch.empty_like(x)
    n = x.numel()
    _triton["kernel"][((n + 255) // 256,)](x, y, spin, n, iters, BLOCK=256)
    return y


def kernel_us(iters, n):
    """The kernel's own time for an N-wide route: the median of 50 event-timed launches."""
    x = torch.randn(ROWS_X, n, device="cuda")
    for _ in range(5):
        launch(x, iters)
    times = []
    for _ in range(50):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        launch(x, iters)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


PROBLEMS = {work: {"schema_version": 1, "operator": f"promo_{work}", "description": "a benchmark's op",
                   "bindings": [{"op": f"ust_bench_promo::{work}", "key": {"N": "x[-1]"}}]}
            for work in ("sleep", "compute", "triton")}


_candidates = {}


def candidate(work, share):
    """A torch-op candidate doing share of production's work (registered once)."""
    name = f"ust_bench_promo_cand::{work}_{int(round(share * 100))}"
    if name in _candidates:
        return _candidates[name]
    if work == "sleep":
        def run(x):
            hold(SLEEP_S * share)
            return x * 3
    elif work == "triton":
        iters = round(_triton["iters"] * share)

        def run(x):
            return launch(x, iters)
    else:
        reps = round(REPS * share)

        def run(x):
            products(x, reps)
            return x * 3
    _candidates[name] = understudy.register_candidate(name, run, like=f"ust_bench_promo::{work}")
    return _candidates[name]


def route_state(rep, key):
    for op in rep["operators"]:
        for s in op["shapes"]:
            if s["key"] == key:
                return s
    return None


def decided(s):
    """'promoted', 'rejected', 'inconclusive' or 'noisy' (inconclusive for
    production's own spread past delta), or None while the test runs; with
    the samples it took and the delta it judged with."""
    ro = s["rollout"]
    pr = ro.get("promotion") or {}
    if ro["mode"] == "canary":
        reason = ro["last_transition"]["reason"]  # "faster: n 123: ..., delta 0.05 (A/A ...), alpha 0.05"
        return "promoted", samples_of(reason), float(re.search(r", delta ([0-9.e+-]+)", reason).group(1))
    if pr.get("state") in ("rejected", "inconclusive"):
        state = "noisy" if pr["note"].startswith("A/A spread") else pr["state"]
        return state, samples_of(pr["note"]), pr["delta_used"]
    return None


def samples_of(text):
    return int(re.search(r"\bn (\d+): ", text).group(1))


def run_route(work, n, max_calls, check_every, lock, out):
    # one torch thread in this thread too: OpenMP's count is the calling
    # thread's, and two threads spinning at a barrier on a loaded two-core
    # machine took a 0.2 ms product to 160 ms
    torch.set_num_threads(1)
    try:
        calls_until_decided(work, n, max_calls, check_every, lock, out)
    except Exception as e:  # a route that broke is counted, not lost
        print(f"route N={n}: {e!r}", file=sys.stderr)
        out.append(("error", 0, float("nan")))


def calls_until_decided(work, n, max_calls, check_every, lock, out):
    x = torch.randn(ROWS_X, n, device="cuda" if work == "triton" else "cpu")
    op = getattr(torch.ops.ust_bench_promo, work)
    key = None
    for i in range(1, max_calls + 1):
        op(x)
        if i % check_every and i != max_calls:
            continue
        with lock:
            rep = understudy.report()
        if key is None:
            key = next(s["key"] for o in rep["operators"] for s in o["shapes"] if s["key"].endswith(f"N={n}"))
        d = decided(route_state(rep, key))
        if d is not None:
            out.append(d)
            return
    out.append(("undecided", max_calls, float("nan")))


def run_row(name, work, share, hogs, args):
    problems = pathlib.Path(tempfile.mkdtemp(prefix="ust-promo-")) / "problems"
    problems.mkdir()
    (problems / f"promo_{work}.json").write_text(json.dumps(PROBLEMS[work]))
    understudy.enable({"operators": {f"promo_{work}": {
        "mode": "shadow", "sample": 1.0,
        "candidate": {"torch_op": candidate(work, share), "target": f"ust_bench_promo::{work}"},
        "promotion": {}}},  # the shipped defaults
        "report": {"interval_s": 0}}, problems=problems)
    procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(hogs)]
    outcomes, lock = [], threading.Lock()
    t0 = time.perf_counter()
    try:
        threads = args.threads if work == "sleep" else 1
        sizes = iter(range(args.first_n, args.first_n + args.routes))
        done = False
        while not done:
            batch = []
            for _ in range(threads):
                n = next(sizes, None)
                if n is None:
                    done = True
                    break
                batch.append(threading.Thread(target=run_route, args=(work, n, args.max_calls, args.check_every,
                                                                       lock, outcomes)))
            if len(batch) == 1:  # one at a time: in this thread
                batch[0].run()
                continue
            for t in batch:
                t.start()
            for t in batch:
                t.join()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        understudy.disable()
    secs = time.perf_counter() - t0
    count = {k: sum(o[0] == k for o in outcomes)
             for k in ("promoted", "rejected", "inconclusive", "noisy", "undecided", "error")}
    if count["error"]:
        print(f"{name}: {count['error']} routes broke (said above)", file=sys.stderr)
    samples = statistics.median(o[1] for o in outcomes)
    deltas = [o[2] for o in outcomes if o[2] == o[2]]
    delta = statistics.median(deltas) if deltas else float("nan")
    if share == 1.0:
        target, met = "promoted <= 5 %", count["promoted"] <= 0.05 * len(outcomes)
    elif share < 1.0:
        target, met = "promoted >= 90 %", count["promoted"] >= 0.9 * len(outcomes)
    else:
        target, met = "rejected >= 90 %", count["rejected"] >= 0.9 * len(outcomes)
    inconclusive = count["inconclusive"] + count["noisy"]
    row = [name, share, len(outcomes), count["promoted"], count["rejected"], inconclusive, count["noisy"],
           count["undecided"], samples, delta, target, "yes" if met else "NO", round(secs)]
    print(f"{name:<32} {share:>5.2f} {len(outcomes):>6} {count['promoted']:>8} {count['rejected']:>8} "
          f"{inconclusive:>12} {count['noisy']:>9} {count['undecided']:>9} {samples:>14.0f} {delta:>11.3f}  "
          f"{target:<18} {row[11]:<4} {secs:>5.0f}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routes", type=int, default=100, help="routes per row")
    ap.add_argument("--threads", type=int, default=4, help="sleep routes run at a time")
    ap.add_argument("--max-calls", type=int, default=1300, help="calls a route gets to decide in")
    ap.add_argument("--check-every", type=int, default=10, help="calls between looks at the report")
    ap.add_argument("--first-n", type=int, default=64, help="the first route's N (its key): N, N+1, ...")
    ap.add_argument("--rows", nargs="*", default=None, help="rows to run, by name (default: the device's)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: the sleep and matrix-product rows; cuda: the Triton rows")
    ap.add_argument("--iters", type=int, default=40000, help="cuda: production's multiply-adds per element")
    args = ap.parse_args()
    table_rows = GPU_ROWS if args.device == "cuda" else ROWS
    if args.rows is None:
        args.rows = [r[0] for r in table_rows]
    notes = [f"compute: {REPS} products of a {ROWS_X} x N float32 matrix by its transpose, one torch thread; "
             f"sleep: {SLEEP_S * 1e3:g} ms", "true ratio: the candidate's work over production's"]
    title = "shadow promotions of torch-op candidates on the CPU, shipped defaults"
    if args.device == "cuda":
        use_triton(args.iters)
        first, last = kernel_us(args.iters, args.first_n), kernel_us(args.iters, args.first_n + args.routes - 1)
        print(f"production's kernel: {first:.1f} us at N={args.first_n}, {last:.1f} us at "
              f"N={args.first_n + args.routes - 1} ({torch.cuda.get_device_name()})", flush=True)
        notes = [f"triton: one launch over {ROWS_X} x N float32 elements, {args.iters} dependent multiply-adds "
                 f"per element in production; its own time (CUDA events, median of 50): {first:.1f} us at the "
                 f"first route, {last:.1f} us at the last", "true ratio: the candidate's chain over production's"]
        title = "shadow promotions of Triton torch-op candidates on the GPU, shipped defaults"
    torch.set_num_threads(1)  # one core per route's work: the other is the hogs' (or another tenant's)
    columns = ["row", "true ratio", "routes", "promoted", "rejected", "inconclusive", "of which noise > delta",
               "undecided", "median samples", "median delta", "target", "met", "seconds"]
    print(f"{'row':<32} {'ratio':>5} {'routes':>6} {'promoted':>8} {'rejected':>8} {'inconclusive':>12} "
          f"{'by noise':>9} {'undecided':>9} {'median samples':>14} {'median delta':>11}  {'target':<18} {'met':<4} "
          f"{'s':>5}")
    rows = [run_row(*r, args) for r in table_rows if r[0] in args.rows]
    _results.write("promotion", [_results.table(
        title, columns, rows,
        [None, ".2f", None, None, None, None, None, None, ".0f", ".3f", None, None, None])], args=args,
        notes=notes, device=args.device)


if __name__ == "__main__":
    main()
