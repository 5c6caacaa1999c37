"""What an intercepted call costs understudy in instructions and cache lines, cold.

A call in a model finds understudy's code and data evicted by the work
between two intercepted calls; its cost is then its cache misses more than
its instructions. This counts both, deterministically, under Valgrind's
Callgrind with its cache model (32 KiB L1 instruction and 48 KiB L1 data
caches, a 4 MiB last level): a child process makes 16x16 CPU torch.mm calls,
each after writing 8 MB of host memory (more than the last level), and
Callgrind counts the whole call from torch's entry point
(at::_ops::mm::call), only the arithmetic left out (collection toggled off
around structured_mm_out_cpu::impl): the dispatcher, torch boxing the call
when the interceptor is boxed, understudy's view, key, lookup, decision and
counters, the result's allocation; plain torch (understudy not loaded) is
the baseline. (A typed interceptor calls production inline, so no toggle
inside understudy's code would leave production out.)
Each variant runs twice, with --calls and with twice as many;
the difference divided by --calls is the cost of one cold call, without
the warm-up and one-time costs (a route's creation). The table prints, per
call, instructions (Ir) and last-level misses on code (ILmr) and data (DLmr
reads, DLmw writes): for the whole call, and for the part of it spent in
understudy's library itself (torch's part moves by tens of instructions
between runs, with its allocations; understudy's does not). "tallied"
keys 1 call in 64 at random, as the defaults do, so its rows move with the
draw; "tallied-only" keys none (1 in 65535): the tallied path alone.

    PYTHONPATH=python-shim python3 benchmarks/footprint.py [--calls 100]
        [--variants plain off none observe tallied tallied-only] [--op mm|sdpa]

--op sdpa measures sdpa's CPU kernel as F.scaled_dot_product_attention
reaches it instead (seven arguments, a tuple of two results; its arithmetic,
flash_attention_kernel_impl, left out).

Needs valgrind (Debian's package) and takes minutes: torch's import runs
under Callgrind too. UNDERSTUDY_LIB selects the library measured.
"""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import _results

VARIANTS = {  # name -> the measured operator's settings (None: understudy not loaded)
    "plain": None,
    "off": "off",
    "none": {"mode": "observe", "sample": 0},
    "observe": {"mode": "observe", "sample": 1 / 16},
    "tallied": {"mode": "observe", "sample": 0},  # past the warm-up from the first call (DEFAULTS)
    "tallied-only": {"mode": "observe", "sample": 0},  # the same, keyed 1 in 65535: none, almost surely
}
# variant -> the config's defaults: calls of "tallied" keyed 1 in 64 at random
# from the first (key_after 0), the others counted without a key; every other
# variant's calls fall in the thread's warm-up, each keyed
# ("tallied-only": the tallied path alone, deterministically: a call is keyed
# at random with probability 1/65535, so 300 calls draw none 99.5 % of the
# time)
DEFAULTS = {"tallied": {"key_after": 0}, "tallied-only": {"key_after": 0, "key_every": 65535}}
# --op: (understudy's operator, collection toggled on at torch's entry point
# and off around the arithmetic, the call)
OPS = {
    "mm": ("gemm", ["at::_ops::mm::call*", "at::native::structured_mm_out_cpu::impl*"], "16x16 CPU torch.mm"),
    # sdpa's CPU kernel as a model reaches it (F.scaled_dot_product_attention):
    # seven arguments and a tuple of two results
    "sdpa": ("sdpa", ["at::_ops::_scaled_dot_product_flash_attention_for_cpu::call*",
                      "at::native::(anonymous namespace)::flash_attention_kernel_impl*"],
             "CPU F.scaled_dot_product_attention (1x4x1x32 query, 16 keys)"),
}
LABELS = {"plain": "plain torch", "off": "mode off",
          "none": "observe, none timed", "observe": "observe, 1 in 16 timed",
          "tallied": "observe, none timed, 1 in 64 keyed", "tallied-only": "observe, tallied alone"}
EVENTS = ("Ir", "ILmr", "DLmr", "DLmw")
SCRUB_MB = 8


def child(variant, calls, op):
    import torch
    torch.set_num_threads(1)
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
    if VARIANTS[variant] is not None:
        import understudy
        understudy.enable({"operators": {OPS[op][0]: VARIANTS[variant]}, "defaults": DEFAULTS.get(variant, {})})
    if op == "mm":
        a, b = torch.randn(16, 16), torch.randn(16, 16)

        def call():
            torch.mm(a, b)
    else:
        q, k = torch.randn(1, 4, 1, 32), torch.randn(1, 4, 16, 32)

        def call():
            torch.nn.functional.scaled_dot_product_attention(q, k, k)
    junk = torch.zeros(SCRUB_MB * 2 ** 20 // 4)
    with torch.inference_mode():
        for _ in range(20):
            call()
        for _ in range(calls):
            junk.add_(1.0)
            call()


def totals(path):
    """The event totals of a Callgrind output file."""
    names = totals_line = None
    for line in open(path):
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:") or line.startswith("summary:"):
            totals_line = [int(x) for x in line.split()[1:]]
    if names is None or totals_line is None:
        raise SystemExit(f"footprint: no totals in {path}")
    got = dict(zip(names, totals_line))
    return {e: got.get(e, 0) for e in EVENTS}


def own_totals(path, lib):
    """The event totals of the code in understudy's library alone (its own
    code: the view, key, lookup, plan and counts, and what it inlines from
    headers, its own and torch's), read from the Callgrind file's cost lines
    under the library's object: torch's part of the same call moves by tens
    of instructions between runs (its allocations), understudy's does not.
    (callgrind_annotate's per-function lines do not all name their object:
    code inlined from a header is listed under the header alone.)"""
    names, events, obj, call_cost = {}, None, None, False
    got = dict.fromkeys(EVENTS, 0)

    def name(spec):  # "(id) name" defines id, "(id)" refers to it (--compress-strings)
        if not spec.startswith("("):
            return spec
        ident, _, rest = spec.partition(")")
        rest = rest.strip()
        if rest:
            names[ident] = rest
        return names.get(ident, "")

    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("ob="):
            obj = name(line[3:])
        elif line.startswith("cob="):
            name(line[4:])  # the callee's object: a definition to keep, not the object of the lines below
        elif line.startswith("calls="):
            call_cost = True  # the next cost line is the call's inclusive cost, not this object's own
        elif line and (line[0].isdigit() or line[0] in "+-*"):
            if call_cost:
                call_cost = False
            elif obj is not None and obj.endswith("/" + lib):
                for e, v in zip(events, line.split()[1:]):
                    if e in got:
                        got[e] += int(v)
    return got


def measure(variant, calls, workdir, op):
    out = os.path.join(workdir, f"cg.{variant}.{calls}")
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--I1=32768,8,64", "--D1=49152,12,64",
           "--LL=4194304,16,64", *(f"--toggle-collect={f}" for f in OPS[op][1]), f"--callgrind-out-file={out}",
           sys.executable, __file__, "--child", variant, "--calls", str(calls), "--op", op]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or not os.path.exists(out):
        raise SystemExit(f"footprint: the {variant!r} child failed (exit status {r.returncode}):\n{r.stdout[-2000:]}")
    lib = os.path.basename(os.environ.get("UNDERSTUDY_LIB", "libunderstudy.so"))
    return totals(out), own_totals(out, lib)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--op", choices=list(OPS), default="mm", help="the call measured")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.calls, args.op)
        return
    if shutil.which("valgrind") is None:
        sys.exit("footprint.py needs valgrind (apt-get install valgrind)")
    variants = list(dict.fromkeys(args.variants))
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        jobs = {(v, n): pool.submit(measure, v, n, workdir, args.op) for v in variants for n in (args.calls, 2 * args.calls)}
        per_call, own = {}, {}
        for v in variants:
            (lo, lo_own), (hi, hi_own) = jobs[(v, args.calls)].result(), jobs[(v, 2 * args.calls)].result()
            per_call[v] = {e: (hi[e] - lo[e]) / args.calls for e in EVENTS}
            own[v] = {e: (hi_own[e] - lo_own[e]) / args.calls for e in EVENTS}
    import torch
    print(f"torch {torch.__version__}; a {OPS[args.op][2]} from {OPS[args.op][1][0].rstrip('*')} (its arithmetic left out), "
          f"each call after {SCRUB_MB} MB written; Callgrind, L1 32 KiB code + 48 KiB data, last level 4 MiB; "
          f"per cold call, from {args.calls} and {2 * args.calls} calls")
    print(f"{'':<26}{'the whole call':^36}{'of it, in understudy itself':^36}")
    print(f"{'variant':<26}" + "".join(f"{e:>9}" for e in EVENTS) * 2)
    for v in variants:
        print(f"{LABELS[v]:<26}" + "".join(f"{per_call[v][e]:>9.1f}" for e in EVENTS)
              + "".join(f"{own[v][e]:>9.1f}" for e in EVENTS))
    lib = os.environ.get("UNDERSTUDY_LIB")
    _results.write("footprint", [_results.table(
        f"a {OPS[args.op][2]}, each call after {SCRUB_MB} MB written; Callgrind (L1 32 KiB code + 48 KiB data, "
        f"last level 4 MiB); per cold call, from {args.calls} and {2 * args.calls} calls",
        ["variant", *(f"{e}, whole call" for e in EVENTS), *(f"{e}, understudy's own" for e in EVENTS)],
        [(LABELS[v], *(round(per_call[v][e], 1) for e in EVENTS), *(round(own[v][e], 1) for e in EVENTS))
         for v in variants], [None] + [",.1f"] * (2 * len(EVENTS)))],
        args=args, device="cpu", notes=[f"UNDERSTUDY_LIB={lib}"] if lib else [])

if __name__ == "__main__":
    main()
