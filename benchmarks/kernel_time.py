"""In-situ accuracy of understudy's per-call device time, against torch.profiler.

HF decoders with random weights (2 layers, bf16: a Mistral-7B-shaped and a
Qwen2-MoE-shaped one, --models) generate --tokens new tokens greedily at
each --batch, six times on one GPU:

1. understudy at its default sampling, its timed calls held (timer.hold
   "auto", docs/timing.md);
2. understudy with timer.hold "off", every call sampled: the plain event
   pair around each call, launch gaps included;
3. understudy timed by the kernel tracer (CUPTI windows back to back:
   timer.kind "cupti", budget 0), every call sampled;
4. understudy with the kernel tracer at its default window and budget
   (timer.kind "cupti"), at the default sampling: the calls between its
   windows are timed by events;
5. understudy at its defaults (no configuration);
6. torch.profiler (the ground truth): for each call of a bound op, the sum of
   the durations of the kernels launched inside it (its device_time_total).

For each route (operator and shape key, prefill and decode) the table prints
the profiler's median per-call time and each timer's median over it. The
profiler's calls are keyed as understudy keys them: each definition's key
expressions evaluated on the schema's arguments of the call (routes whose key
is not a plain argument size are left out).

    PYTHONPATH=python-shim python3 benchmarks/kernel_time.py [--models mistral qwen-moe] [--batch 1 8]
"""
import argparse
import collections
import json
import pathlib
import re
import statistics
import sys

import torch

import _results
import models

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402


def generate(model, ids, tokens):
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=0)
    torch.cuda.synchronize()
    return out


def understudy_run(model, ids, tokens, config):
    import time
    understudy.enable({"report": {"window_s": 0}, **config})
    try:
        # the tracer's first window opens once a GPU call was seen (the worker
        # polls every 0.1 s): let it open before the measured run
        generate(model, ids, 1)
        time.sleep(0.3)
        generate(model, ids, tokens)
        rep = understudy.report()
    finally:
        understudy.disable()
    routes = {}
    for op in rep["operators"]:
        for s in op.get("shapes", []):
            if s.get("device") != "cuda" or not s.get("timed"):
                continue
            routes[(s["op"], tuple(sorted(s["dims"].items())), s.get("phase", "unknown"))] = s
    return rep, routes


def _definitions():
    defs = {}
    for f in sorted(understudy.problems_dir().glob("*.json")):
        d = json.loads(f.read_text())
        for b in d.get("bindings", []):
            if isinstance(b, dict) and b.get("op") and b.get("key") is not None:
                defs.setdefault(b["op"], b["key"])
    return defs


_INDEX = re.compile(r"^\s*([A-Za-z_]\w*)\s*\[\s*(-?\d+)\s*\]\s*$")


def _key_of(op, shapes, keyexpr):
    """The route key of a profiler call from its input shapes, where the key
    expressions are plain `arg[i]` (else None: matched by count)."""
    ns, _, name = op.partition("::")
    try:
        schema = getattr(getattr(torch.ops, ns), name).default._schema
    except (AttributeError, RuntimeError):
        return None
    args = {a.name: shapes[i] for i, a in enumerate(schema.arguments) if i < len(shapes)}
    dims = {}
    for dim, expr in keyexpr.items():
        m = _INDEX.match(str(expr))
        if not m or not args.get(m.group(1)):
            return None
        shp = args[m.group(1)]
        i = int(m.group(2))
        if not -len(shp) <= i < len(shp):
            return None
        dims[dim] = float(shp[i])
    return tuple(sorted(dims.items()))


def profiler_run(model, ids, tokens, ops):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        generate(model, ids, tokens)
    defs = _definitions()
    per_key = collections.defaultdict(list)
    by_name = collections.defaultdict(lambda: collections.defaultdict(list))
    bound_us = 0.0
    for e in prof.events():
        if e.name not in ops:
            continue
        # the outermost call of a bound op (a nested one is inside its parent's time)
        p, nested = e.cpu_parent, False
        while p is not None:
            nested |= p.name in ops
            p = p.cpu_parent
        if nested:
            continue
        us = e.device_time_total
        bound_us += us
        key = _key_of(e.name, e.input_shapes, defs.get(e.name, {}))
        if key is not None:
            per_key[(e.name, key)].append(us)
        by_name[e.name][tuple(map(tuple, e.input_shapes))].append(us)
    # kernels only (the tracer records kernels; copies and memsets are not)
    total_kernel_us = sum(e.device_time for e in prof.events()
                          if e.device_type == torch.autograd.DeviceType.CUDA
                          and not e.name.startswith(("Memcpy", "Memset")))
    return per_key, bound_us, total_kernel_us


def by_key(routes):
    """The routes of one run by (op, key): a key seen in two phases keeps
    the one with more timed calls (the profiler's calls carry no phase)."""
    out = {}
    for (op, key, phase), s in routes.items():
        if (op, key) not in out or s.get("timed", 0) > out[(op, key)].get("timed", 0):
            out[(op, key)] = dict(s, phase=phase)
    return out


def table(kind, batch, tokens, layers, correlation):
    model = models.build(kind, layers)
    ids = torch.randint(1, 32000, (batch, 16), device="cuda")
    generate(model, ids, 8)  # warm-up outside any measurement
    rep, held = understudy_run(model, ids, tokens, {"timer": {"hold": "auto"}})
    _, plain = understudy_run(model, ids, tokens, {"defaults": {"sample": 1.0}, "timer": {"hold": "off"}})
    trep, cupti = understudy_run(model, ids, tokens, {"defaults": {"sample": 1.0}, "timer": {
        "kind": "cupti", "budget": 0, "window_ms": 1000, "correlation": correlation}})
    brep, budget = understudy_run(model, ids, tokens, {"timer": {"kind": "cupti", "correlation": correlation}})
    _, dflt = understudy_run(model, ids, tokens, {})
    held, plain, cupti, budget, dflt = by_key(held), by_key(plain), by_key(cupti), by_key(budget), by_key(dflt)
    ops = {k[0] for k in held} | {k[0] for k in plain} | {k[0] for k in cupti}
    per_key, bound_us, total_us = profiler_run(model, ids, tokens, ops)
    hold = rep.get("timer", {}).get("hold", {})
    cal = ", ".join(f"GPU {d['device']} {d['calibration']} {d['pair_offset_ns'] / 1e3:.2f} us "
                    f"(IQR {d['pair_offset_spread_ns'] / 1e3:.2f})" for d in hold.get("devices", []))
    tm = trep.get("timer", {})
    print(f"\n{kind}, batch {batch}, {tokens} new tokens, {layers} layers: hold {hold.get('state')} "
          f"(pair offset {cal}; held {hold.get('held', 0):.0f}, expired {hold.get('expired', 0):.0f}); tracer "
          f"{tm.get('kind')} ({tm.get('why') or tm.get('state')}), coverage {tm.get('coverage', float('nan')):.3f}")
    bm = brep.get("timer", {})
    print(f"tracer at its default budget: {bm.get('windows', 0):.0f} windows, correlation {bm.get('correlation')}")
    print(f"{'op':<34} {'key':<26} {'phase':<7} {'prof us':>8} {'held':>8} {'/prof':>6} {'held n':>6} "
          f"{'events':>8} {'/prof':>6} {'tracer':>8} {'/prof':>6} {'budget':>6} {'kernel':>6} {'dflt':>6}")

    def med(s):
        return s["latency_ns"].get("p50", 0) / 1e3 if s else float("nan")

    rows, r_held, r_plain, r_cupti, r_budget, r_dflt = [], [], [], [], [], []
    for (op, key), s in sorted(held.items()):
        prof = per_key.get((op, key))
        if not prof:
            continue
        p_us = statistics.median(prof)
        if p_us <= 0:
            continue
        h_us, e_us, c_us = med(s), med(plain.get((op, key))), med(cupti.get((op, key)))
        b_us, d_us = med(budget.get((op, key))), med(dflt.get((op, key)))
        # of the default-budget run's timed calls, the share its windows timed by their kernels
        bs = budget.get((op, key)) or {}
        by_kernels = bs.get("timed_by", {}).get("kernels", 0) / bs["timed"] if bs.get("timed") else float("nan")
        keytxt = ",".join(f"{k}={int(v)}" for k, v in key)
        n_held = s.get("timed_by", {}).get("held_pair", 0)
        print(f"{op:<34} {keytxt:<26} {s['phase']:<7} {p_us:>8.2f} {h_us:>8.2f} {h_us / p_us:>6.2f} {n_held:>6.0f} "
              f"{e_us:>8.2f} {e_us / p_us:>6.2f} {c_us:>8.2f} {c_us / p_us:>6.2f} {b_us / p_us:>6.2f} "
              f"{by_kernels:>6.0%} {d_us / p_us:>6.2f}")
        r_held.append(h_us / p_us)
        r_plain.append(e_us / p_us)
        r_cupti.append(c_us / p_us)
        r_budget.append(b_us / p_us)
        r_dflt.append(d_us / p_us)
        rows.append((kind, batch, op, keytxt, s["phase"], round(p_us, 2), round(h_us / p_us, 3), n_held,
                     round(e_us / p_us, 3), round(c_us / p_us, 3), round(b_us / p_us, 3),
                     round(by_kernels, 3) if by_kernels == by_kernels else None, round(d_us / p_us, 3)))

    def summary(rs):
        rs = [r for r in rs if r == r]
        if not rs:
            return "none"
        return (f"median {statistics.median(rs):.3f}, range {min(rs):.2f}-{max(rs):.2f}, within 10 %: "
                f"{sum(abs(r - 1) <= 0.1 for r in rs)}/{len(rs)}")

    print(f"routes {len(rows)}; over torch.profiler: held pairs {summary(r_held)}; plain events {summary(r_plain)}; "
          f"tracer {summary(r_cupti)}; tracer at its default budget {summary(r_budget)}; defaults {summary(r_dflt)}")
    del model
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", choices=models.KINDS, default=["mistral", "qwen-moe"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--correlation", choices=["records", "callbacks"], default="records",
                    help="how the tracer joins kernels to calls (callbacks: only while it holds CUPTI, i.e. "
                         "before torch's profiler first ran in the process: the first batch)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernel_time.py needs a CUDA GPU")
    print(f"torch {torch.__version__}; {torch.cuda.get_device_name()}; understudy {understudy.__version__}")
    rows = [r for m in args.models for b in args.batch for r in table(m, b, args.tokens, args.layers,
                                                                          args.correlation)]
    tables = [_results.table(
        f"per route, median time per call over torch.profiler's kernels ({args.tokens} new tokens, {args.layers} "
        f"layers, bf16): held event pairs at the default sampling, plain event pairs, the kernel tracer (windows "
        f"back to back), the tracer at its default budget (and the share of its timed calls its windows timed), "
        f"understudy at its defaults",
        ["model", "batch", "op", "key", "phase", "profiler µs", "held / profiler", "held calls",
         "events / profiler", "tracer / profiler", "tracer at its budget / profiler", "timed in windows",
         "defaults / profiler"], rows,
        [None, None, None, None, None, ".2f", ".2f", ",.0f", ".2f", ".2f", ".2f", ".0%", ".2f"])]
    _results.write("kernel_time", tables, args=args)


if __name__ == "__main__":
    main()
