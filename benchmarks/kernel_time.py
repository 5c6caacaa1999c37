"""In-situ accuracy of understudy's per-call device time, against torch.profiler.

An HF Mistral-7B-shaped decoder (2 layers, bf16, random weights) generates
--tokens new tokens greedily at each --batch, three times on one GPU:

1. understudy observing every bound op, timed by the kernel tracer (CUPTI
   windows back to back: timer.budget 0);
2. understudy observing, timed by events around each call (timer.kind
   "events", every call sampled): the launch-inclusive figure;
3. torch.profiler (the ground truth): for each call of a bound op, the sum of
   the durations of the kernels launched inside it (its device_time_total).

For each route (operator and shape key) the table prints the median per-call
time of each, the ratios to the profiler's, and an isolated
triton.testing.do_bench of the same GEMM for reference. The profiler's calls
are keyed as understudy keys them: each definition's key expressions
evaluated on the schema's arguments of the call.

    PYTHONPATH=python-shim python3 benchmarks/kernel_time.py [--batch 1 8] [--tokens 64]
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

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402


def build_model(layers, device="cuda", dtype=torch.bfloat16, **config):
    """The HF Mistral-7B-shaped decoder of the benchmarks (random weights;
    bf16 on the GPU unless told otherwise); config overrides MistralConfig
    fields."""
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(**{"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": layers,
                           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                           "max_position_embeddings": 4096, **config})
    torch.manual_seed(0)
    with torch.device(device):
        model = MistralForCausalLM(cfg).to(dtype).eval()
    return model


def generate(model, ids, tokens):
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=0)
    torch.cuda.synchronize()
    return out


def understudy_run(model, ids, tokens, timer):
    import time
    understudy.enable({"defaults": {"sample": 1.0}, "timer": timer, "report": {"window_s": 0}})
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
            routes[(s["op"], tuple(sorted(s["dims"].items())))] = s
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


def do_bench_gemm(dims, dtype=torch.bfloat16):
    import triton.testing
    d = dict(dims)
    if not {"M", "K", "N"} <= d.keys():
        return None
    shape_a = (int(d["B"]), int(d["M"]), int(d["K"])) if "B" in d else (int(d["M"]), int(d["K"]))
    shape_b = (int(d["B"]), int(d["K"]), int(d["N"])) if "B" in d else (int(d["K"]), int(d["N"]))
    a = torch.randn(shape_a, device="cuda", dtype=dtype)
    b = torch.randn(shape_b, device="cuda", dtype=dtype)
    fn = torch.bmm if "B" in d else torch.mm
    return triton.testing.do_bench(lambda: fn(a, b)) * 1e3


def table(batch, tokens, layers, correlation):
    model = build_model(layers)
    ids = torch.randint(1, 32000, (batch, 16), device="cuda")
    generate(model, ids, 8)  # warm-up outside any measurement
    rep, cupti = understudy_run(model, ids, tokens, {"kind": "cupti", "budget": 0, "window_ms": 1000,
                                                             "correlation": correlation})
    _, events = understudy_run(model, ids, tokens, {"kind": "events"})
    ops = {k[0] for k in cupti} | {k[0] for k in events}
    per_key, bound_us, total_us = profiler_run(model, ids, tokens, ops)
    tm = rep.get("timer", {})
    print(f"\nbatch {batch}, {tokens} new tokens, {layers} layers: timer {tm.get('kind')} "
          f"({tm.get('why') or tm.get('state')}, {tm.get('correlation')}), {tm.get('windows', 0)} windows; coverage (bound ops' kernel time "
          f"/ all kernel time): understudy {tm.get('coverage', float('nan')):.3f} of "
          f"{tm.get('kernel_ns', 0) / 1e6:.2f} ms in its windows, torch.profiler {bound_us / total_us:.3f} of "
          f"{total_us / 1e3:.2f} ms")
    top = ", ".join(f"{u['name'][:40]} {u['ns'] / 1e6:.2f} ms" for u in tm.get("unattributed", [])[:3])
    print(f"top unattributed kernels: {top}")
    print(f"{'op':<42} {'key':<24} {'calls':>6} {'cupti us':>9} {'prof us':>9} {'ratio':>6} "
          f"{'events us':>9} {'ratio':>6} {'do_bench':>9}")
    ratios, rows = [], []
    for (op, key), s in sorted(cupti.items()):
        prof = per_key.get((op, key))
        if not prof:
            continue
        c_us = s["latency_ns"].get("p50", 0) / 1e3
        p_us = statistics.median(prof)
        ev = events.get((op, key))
        e_us = ev["latency_ns"].get("p50", 0) / 1e3 if ev else float("nan")
        db = do_bench_gemm(key) if op in ("aten::mm", "aten::bmm") else None
        kt = s.get("kernel_timed", 0)
        ratios.append(c_us / p_us if p_us > 0 else float("nan"))
        keytxt = ",".join(f"{k}={int(v)}" for k, v in key)
        print(f"{op:<42} {keytxt:<24} {s['calls']:>6.0f} {c_us:>9.2f} {p_us:>9.2f} {c_us / p_us:>6.2f} "
              f"{e_us:>9.2f} {e_us / p_us:>6.2f} {db if db is not None else float('nan'):>9.2f}"
              + ("" if kt == s.get("timed") else f"  ({kt:.0f} of {s.get('timed'):.0f} by kernels)"))
        rows.append((op, keytxt, s["calls"], round(c_us, 2), round(p_us, 2), round(c_us / p_us, 3) if p_us > 0 else None,
                     round(e_us, 2), round(e_us / p_us, 3) if p_us > 0 else None,
                     round(db, 2) if db is not None else None))
    if ratios:
        worst = max(abs(r - 1) for r in ratios)
        print(f"routes compared {len(ratios)}; cupti/profiler median ratio {statistics.median(ratios):.3f}, "
              f"worst |ratio - 1| {worst:.3f}")
    del model
    torch.cuda.empty_cache()
    return _results.table(
        f"batch {batch}, {tokens} new tokens, {layers} layers: per route, median time per call against "
        f"torch.profiler's kernels (timer {tm.get('kind')}, {tm.get('correlation')}; coverage: understudy "
        f"{tm.get('coverage', float('nan')):.3f}, torch.profiler {bound_us / total_us:.3f})",
        ["op", "key", "calls", "tracer µs", "profiler µs", "tracer / profiler", "events µs", "events / profiler",
         "do_bench µs"], rows, [None, None, ",.0f", ".2f", ".2f", ".2f", ".2f", ".2f", ".2f"])


def main():
    ap = argparse.ArgumentParser()
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
    tables = [table(b, args.tokens, args.layers, args.correlation) for b in args.batch]
    _results.write("kernel_time", tables, args=args)


if __name__ == "__main__":
    main()
