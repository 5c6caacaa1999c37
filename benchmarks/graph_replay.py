"""Graph replays, attributed: a decode step run eagerly and replayed from a CUDA graph.

An HF Mistral-7B-shaped decoder (2 layers, bf16, random weights, a static KV
cache) prefills 16 tokens, then one decode step (batch --batch, one new token
each) runs in two ways, each under understudy observing every bound op with the
kernel tracer (one window over the whole run):

1. eagerly, --steps times: every call dispatched and timed by its kernels;
2. captured once with torch.cuda.graph, then the graph replayed --steps times
   (or, with --compile, by torch.compile(mode="reduce-overhead"), called
   --steps + 1 times: a warm-up call, then a recording that replays once, then
   replays): the calls are dispatched once (captured) and every replay runs
   them again without the dispatcher; understudy attributes the replays'
   kernels to their routes through the graph's node ids.

Per route (operator and shape key) the table prints the eager calls and their
median kernel time, the captured calls, the replayed calls (which must be
--steps times the captured ones), the replays' median kernel time, the ratio
of the two medians, and S (the roofline score) from the replays.

    PYTHONPATH=python-shim python3 benchmarks/graph_replay.py [--batch 1] [--steps 50] [--compile]
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

import _results

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402

PREFILL = 16
CONFIG = {"defaults": {"sample": 1.0}, "report": {"window_s": 0},
          "timer": {"kind": "cupti", "budget": 0, "window_ms": 600000}}


def build(layers, batch, steps):
    from models import mistral
    from transformers import StaticCache
    model = mistral(layers, sliding_window=None)  # a full (not rolling) static cache
    cfg = model.config
    # each eager step (and each warm-up before capture) writes the next cache slot
    cache = StaticCache(config=cfg, max_cache_len=PREFILL + 2 * steps + 16)
    ids = torch.randint(1, 32000, (batch, PREFILL), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    with torch.inference_mode():
        out = model(ids, past_key_values=cache, cache_position=torch.arange(PREFILL, device="cuda"),
                    use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)  # static inputs of the step: one token each, one position
    pos = torch.tensor([PREFILL], device="cuda")

    def step():
        return model(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
    return step


def window_opens():
    """GPU calls for a while: the tracer's window opens once one was seen."""
    x = torch.randn(8, 8, device="cuda")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        torch.mm(x, x)
        torch.cuda.synchronize()


def routes(rep):
    out = {}
    for op in rep["operators"]:
        for s in op.get("shapes", []):
            if s.get("device") == "cuda" and s["dims"].get("M") != 8:
                out[(s["op"], tuple(sorted(s["dims"].items())))] = s
    return out


def observed(workload):
    """understudy observing every bound op, the tracer's window open, while
    workload() runs; its report."""
    understudy.enable(CONFIG)
    try:
        window_opens()
        workload()
        torch.cuda.synchronize()
        return understudy.report()
    finally:
        understudy.disable()


def run(step, steps, how):
    """The step run steps times: "eager"; "graph" (torch.cuda.graph, after a
    warm-up on a side stream as it asks); "compile" (torch.compile's graph
    trees: a warm-up call, a recording that replays once, then replays)."""
    with torch.inference_mode():
        if how == "eager":
            return observed(lambda: [step() for _ in range(steps)])
        if how == "compile":
            fn = torch.compile(step, mode="reduce-overhead")
            return observed(lambda: [fn() for _ in range(steps + 1)])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

        def capture_and_replay():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            for _ in range(steps):
                g.replay()
        return observed(capture_and_replay)


def p50_us(s):
    q = s["latency_ns"].get("p50")
    return q / 1e3 if q else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--compile", action="store_true",
                    help="the graph by torch.compile(mode=\"reduce-overhead\") instead of torch.cuda.graph")
    ap.add_argument("--timer", choices=["cupti", "events"], default="cupti",
                    help="events: no replay is seen (a baseline for the eager figures)")
    args = ap.parse_args()
    CONFIG["timer"]["kind"] = args.timer
    step = build(args.layers, args.batch, args.steps)
    eager = run(step, args.steps, "eager")
    graph = run(step, args.steps, "compile" if args.compile else "graph")
    tm = graph["timer"]
    print(f"torch {torch.__version__}; {torch.cuda.get_device_name()}; understudy {understudy.__version__}")
    print(f"batch {args.batch}, {args.steps} decode steps, {args.layers} layers; graph run: timer {tm['kind']} "
          f"({tm.get('correlation')}), {tm['windows']} windows, {tm.get('calls_replayed', 0)} replayed calls, "
          f"coverage {tm.get('coverage', float('nan')):.3f}")
    print(f"{'op':<28} {'key':<26} {'eager':>6} {'eager us':>9} {'capt':>5} {'replayed':>9} {'x steps':>8} "
          f"{'replay us':>10} {'ratio':>6} {'S':>6}")
    e, g = routes(eager), routes(graph)
    ratios, exact, rows = [], 0, []
    for key in sorted(g):
        s = g[key]
        if not s.get("captured"):
            continue
        # compiled code calls the out= overloads (aten::mm.out for aten::mm)
        es = e.get(key) or e.get((key[0].removesuffix(".out"), key[1]))
        ep, gp = (p50_us(es) if es else float("nan")), p50_us(s)
        ratio = gp / ep if es else float("nan")
        per = s["replayed"] / s["captured"]
        exact += per == args.steps
        if es:
            ratios.append(ratio)
        roof = s.get("roofline") or {}
        sv = roof.get("S")
        sv = f"{sv:.3f}" if isinstance(sv, (int, float)) else "-"
        dims = ",".join(f"{k}={v}" for k, v in key[1])
        print(f"{key[0]:<28} {dims[:26]:<26} {es['calls'] if es else 0:>6} {ep:>9.2f} {s['captured']:>5} "
              f"{s['replayed']:>9} {per:>8.1f} {gp:>10.2f} {ratio:>6.2f} {sv:>6}")
        rows.append((key[0], dims, es["calls"] if es else 0, round(ep, 2), s["captured"], s["replayed"], round(per, 1),
                     round(gp, 2), round(ratio, 3), round(roof["S"], 3) if isinstance(roof.get("S"), (int, float))
                     else None))
    captured = sum(1 for s in g.values() if s.get("captured"))
    print(f"routes captured {captured}; replayed = {args.steps} x captured on {exact}; "
          f"replay/eager median ratio {statistics.median(ratios) if ratios else float('nan'):.3f}, "
          f"worst |ratio - 1| {max((abs(r - 1) for r in ratios), default=float('nan')):.3f}")
    how = "torch.compile(mode=\"reduce-overhead\")" if args.compile else "torch.cuda.graph"
    _results.write("graph_replay", [
        _results.table(f"a decode step eagerly and replayed from {how}: per route, median kernel time",
                       ["op", "key", "eager", "eager µs", "captured", "replayed", "× steps", "replay µs", "ratio",
                        "S"], rows, [None, None, None, ".2f", None, None, ".1f", ".2f", ".2f", ".3f"]),
        _results.table(f"over the routes, {args.steps} steps, timer {tm['kind']} ({tm.get('correlation')})",
                       ["routes captured", "replayed = steps × captured on", "replay/eager median",
                        "worst |ratio − 1|", "coverage"],
                       [(captured, exact, round(statistics.median(ratios), 3) if ratios else None,
                         round(max(abs(r - 1) for r in ratios), 3) if ratios else None,
                         round(tm["coverage"], 3) if isinstance(tm.get("coverage"), (int, float)) else None)],
                       [None, None, ".3f", ".3f", ".3f"])], args=args)


if __name__ == "__main__":
    main()
