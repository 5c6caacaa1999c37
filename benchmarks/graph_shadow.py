"""Shadow inside CUDA graphs: verdicts that keep flowing under graph replay.

An HF Llama-8B-shaped decoder (2 layers, bf16, random weights, a static KV
cache), its RMSNorms routed through _C::rms_norm as vLLM's are, runs one
decode step (batch --batch) captured with torch.cuda.graph three times:
without understudy (the plain graph); with _C::rms_norm in shadow against
the native CUDA candidate examples/candidates/rms_norm_cuda.cu, so that each
captured rms_norm call carries its shadow beside the chain (a kernel in the
chain takes the copies it reads, its conditional node on a branch off it:
verify-only); and with the route in canary when captured, so that each call
holds both arms in the chain (guard/graph.c). Then, in one run:

1. verdicts: the plain and the beside graph replayed --replays times on the
   same inputs, the logits compared bit for bit after every replay; per
   route the replays verified (sample 1: every captured call of every
   replay) and passed;
2. rollback: a third graph captured with the candidate wrong on its last
   element (rms_norm_cuda_wrong_tail); one replay, then the route's mode; then
   --replays more, and the verifications they added (0: the gate closed);
3. cost: replay time of the plain graph; of the beside graph and of the
   chain graph with their gates closed (mode observe) and open (shadow,
   sample 1); of the chain graph in canary 0.25 and in live (both at sample
   1); interleaved over --rounds rounds of --batch-replays replays each,
   medians; beside it the kernel time the open gates add per replay, from
   torch.profiler's records of the same replays (the candidate's, the
   comparisons', the copies', the gates' and the ring's kernels);
4. serving: the chain graph's route set to canary 0.25, then live: the
   calls the candidate served (at sample 1 each is verified, and only
   those), per captured call and replay, and the logits against the plain
   graph's (the candidate computes as vLLM's kernel does: bit-equal).

With --capture compile the step is torch.compile(mode="reduce-overhead")'s
instead (a static cache, as HF's compiled decoding uses): its cudagraph trees
run the first call eagerly, record the second and replay every later one;
each graph above is a compiled step recorded in the same state, and every
"replay" is a call of the compiled step. A recording runs its graph once, so
in 2 the rollback comes at the recording, the graph's first replay.

With --gate device (shadow.graph_gate) every replay of the beside graph is
decided on the device by its kernels in the chain; by default (replay) the
host decides before each replay, through the package's hook on
torch.cuda.CUDAGraph.replay, and enables those kernels only in the replays
that verify.

Gated from the host, the shadow beside the chain is not in the graph: the
host starts it, as a graph of its own, behind each replay that verifies
(graphs.hosted, host_starts); with --host-start kernel
(shadow.graph_host_start) behind its kernel in the chain instead, an event
record node off that kernel, so that it runs under the rest of the replay. Decided on the device, with --beside-launch
device (shadow.graph_beside_launch) it is launched from the device by its
kernel in the chain instead of an IF node on a branch; torch.profiler
cannot trace such a graph, so the kernel times of 3 are left out.

    PYTHONPATH=python-shim python3 benchmarks/graph_shadow.py [--replays 1000] [--batch 1] [--beside-launch device]
        [--capture compile] [--gate device] [--host-start kernel]
"""
import argparse
import itertools
import pathlib
import statistics
import sys
import time
import types

import torch

import _results

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "python-shim"))
import understudy  # noqa: E402
from understudy import demo  # noqa: E402

PREFILL = 16


def candidate(name):
    lib = pathlib.Path(understudy.library_path()).parent / "candidates" / f"lib{name}.so"
    if not lib.exists():
        sys.exit(f"{lib} was not built (./run.sh build on a machine with nvcc)")
    return understudy.native(lib, target="_C::rms_norm")


def config(name, args):
    return {"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "canary": 0.25, "candidate": candidate(name)}},
            "shadow": {"graph_beside_launch": args.beside_launch, "graph_gate": args.gate,
                       "graph_host_start": args.host_start}, "report": {"interval_s": 0}}


def build(batch):
    """The model, and make(): a decode step over a cache of its own (the
    cache's write position lives on the device and each replay advances
    it), with rewind(), which puts it back where the step was captured."""
    from transformers import StaticCache
    demo.define_vllm_rms_norm()  # with what torch.compile traces (vLLM registers its own)
    _, _, vocab, model = demo.build_model("cuda", model="llama-8b-shaped")
    demo.use_vllm_rms_norm(model, True)
    tok = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    ids = torch.randint(1, vocab, (batch, PREFILL), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def make():
        tok.zero_()  # every cache's warm-up steps write the same token's keys and values
        cache = StaticCache(config=model.config, max_cache_len=PREFILL + 512)
        with torch.inference_mode():
            model(ids, past_key_values=cache, cache_position=torch.arange(PREFILL, device="cuda"), use_cache=True)
        pos = torch.tensor([PREFILL], device="cuda")
        saved = []

        def step():
            return model(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits

        def mark():
            saved[:] = [(layer.cumulative_length, layer.cumulative_length.clone()) for layer in cache.layers
                        if hasattr(layer, "cumulative_length")]

        def rewind():
            with torch.inference_mode():  # the cache's tensors are inference tensors
                for t, v in saved:
                    t.copy_(v)
        return step, mark, rewind
    return make, tok, vocab


def capture(made, before=None):
    """made's step captured (after a warm-up on a side stream, then
    before()): .replay(), .out (the logits it writes), .rewind()."""
    step, mark, rewind = made
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        mark()
        if before is not None:
            before()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step()
    return types.SimpleNamespace(replay=g.replay, out=out, rewind=rewind, graph=g)


_recorded = itertools.count()  # names the steps' code objects


def record(made, before=None):
    """made's step under torch.compile(mode="reduce-overhead"): the first
    call compiles it and runs eagerly, the second (after before()) records
    its CUDA graph and runs it, every later call replays it. The same
    namespace as capture's; .replay() is one call of the compiled step."""
    step, mark, rewind = made
    # dynamo keeps compiled code per code object, and every step's differs
    # from the others' only in its cache: on one code object the second step
    # would run the first one's compiled code and recording
    own = step.__code__.replace(co_name=f"step_{next(_recorded)}")
    fn = torch.compile(types.FunctionType(own, step.__globals__, own.co_name, step.__defaults__, step.__closure__),
                       mode="reduce-overhead")
    g = types.SimpleNamespace(rewind=rewind, out=None)

    def replay():
        torch.compiler.cudagraph_mark_step_begin()  # the last call's outputs are dead: no new recording
        with torch.inference_mode():  # as when compiled: no recompilation
            g.out = fn()
    g.replay = replay
    replay()
    torch.cuda.synchronize()
    mark()
    if before is not None:
        before()
    replay()
    torch.cuda.synchronize()
    return g


def settle():
    torch.cuda.synchronize()
    understudy.flush()  # judges the replays so far and writes every gate from its route


def started_by(graphs, host_start):
    """How the report says the shadows beside the chain start."""
    if graphs["hosted"]:
        return ("the host, each behind its kernel in the chain" if host_start == "kernel" else
                "the host, behind the replays") + " that verify"
    return "a launch from the device" if graphs["launched"] else "an IF node"


def rms_routes(rep):
    return [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "_C::rms_norm"]


def per_replay_us(g, n):
    g.rewind()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / n


def kernel_us(g, n):
    """Device time per replay of every kernel, copy and memset the replays
    ran (torch.profiler's records), by name."""
    from torch.profiler import ProfilerActivity, profile
    g.rewind()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    by = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name] = by.get(e.name, 0.0) + e.device_time / n
    return by


def print_kernel_breakdown(ks, med):
    """The kernel time open gates add per replay, by kernel, for each
    layout; and what live adds over shadow (torch.profiler's records)."""
    for layout in ("beside", "chain"):
        opened, closed = ks[f"{layout}, gates open"], ks[f"{layout}, gates closed"]
        added = sorted(((opened.get(k, 0) - closed.get(k, 0), k) for k in opened), reverse=True)
        print(f"kernel time the open gates add per replay, {layout}, by kernel:")
        for us_, name in added:
            if us_ > 0.05:
                print(f"  {us_:8.2f} us  {name[:100]}")
        print(f"  {sum(u for u, _ in added if u > 0):8.2f} us  in all; replay time added "
              f"{med[f'{layout}, gates open'] - med[f'{layout}, gates closed']:.2f} us")
    opened, live_k = ks["chain, gates open"], ks["chain, live"]
    live_added = sum(v - opened.get(k, 0) for k, v in live_k.items() if v > opened.get(k, 0))
    print(f"live adds {live_added:.2f} us of kernel time per replay over shadow (the candidate's results copied "
          f"over production's); production's kernels still run in every replay")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch-replays", type=int, default=200)
    ap.add_argument("--beside-launch", choices=["device", "conditional"], default="conditional",
                    help="how a shadow beside the chain starts (shadow.graph_beside_launch)")
    ap.add_argument("--gate", choices=["replay", "device"], default="replay",
                    help="who decides a replay beside the chain (shadow.graph_gate)")
    ap.add_argument("--host-start", choices=["replay", "kernel"], default="replay",
                    help="a shadow the host starts waits for the replay, or for its kernel in the chain "
                         "(shadow.graph_host_start)")
    ap.add_argument("--capture", choices=["graph", "compile"], default="graph",
                    help="the step captured with torch.cuda.graph, or torch.compile(mode=\"reduce-overhead\")'s")
    args = ap.parse_args()
    grab = record if args.capture == "compile" else capture
    make, tok, vocab = build(args.batch)
    plain = grab(make())
    understudy.enable(config("rms_norm_cuda", args))
    shadowed = grab(make())  # in shadow: beside the chain
    chained = grab(make(), lambda: understudy.set_mode("rms_norm", "canary"))  # both arms in the chain
    understudy.set_mode("rms_norm", "shadow")
    settle()
    base = {s["key"]: s["shadow"]["verified"] for s in rms_routes(understudy.report())}

    def replay_both(g, n, seed):
        """n steps on the plain graph's and g's caches, each on a fresh
        token, then settled: the replays whose logits were bit-equal."""
        gen = torch.Generator("cuda").manual_seed(seed)
        equal = 0
        for _ in range(n):
            tok.copy_(torch.randint(1, vocab, tok.shape, device="cuda", generator=gen))
            plain.rewind()
            plain.replay()
            a = plain.out.clone()
            g.rewind()
            g.replay()
            equal += bool(torch.equal(a, g.out))
        settle()
        return equal
    t0 = time.perf_counter()
    equal = replay_both(shadowed, args.replays, 2)
    took = time.perf_counter() - t0
    rep = understudy.report()
    print(f"torch {torch.__version__}; {torch.cuda.get_device_name()}; understudy {understudy.__version__}")
    how = "torch.compile(mode=\"reduce-overhead\")" if args.capture == "compile" else "torch.cuda.graph"
    print(f"HF Llama-8B-shaped decode step (2 layers, bf16, batch {args.batch}, static cache), captured with {how}; "
          f"_C::rms_norm in shadow (native rms_norm_cuda, sample 1); beside the chain, started by "
          f"{started_by(rep['graphs'], args.host_start)} (graphs: hosted {rep['graphs']['hosted']}, launched "
          f"{rep['graphs']['launched']}, refused {rep['graphs']['refused']}); its replays gated "
          f"{'from the host' if args.gate == 'replay' else 'on the device'} (graphs: gated "
          f"{rep['graphs']['gated']}, gated_replays {rep['graphs']['gated_replays']}, "
          f"gate_failed {rep['graphs']['gate_failed']}, host_starts {rep['graphs']['host_starts']})")
    print(f"\n1. verdicts: {args.replays} replays of the beside graph in {took:.1f} s, logits bit-equal to the plain "
          f"graph's on {equal} of {args.replays}")
    print(f"{'route':<44} {'sites':>5} {'verified':>9} {'x replays':>10} {'passed':>7} {'failed':>7}")
    verdicts = []
    for s in rms_routes(rep):
        sh = s["shadow"]
        v = sh["verified"] - base.get(s["key"], 0)
        n_sites = sh["graph"]["beside"]
        print(f"{s['key'][:44]:<44} {n_sites:>5} {v:>9} {v / max(n_sites, 1) / args.replays:>10.3f} "
              f"{sh['passed'] - base.get(s['key'], 0):>7} {sh['failed']:>7}")
        verdicts.append((s["key"], n_sites, v, round(v / max(n_sites, 1) / args.replays, 3),
                         sh["passed"] - base.get(s["key"], 0), sh["failed"]))

    # 4. serving under replay: the chain graph, its route set to canary, then
    # live (the candidate qualified in 1). At sample 1 every replay the
    # candidate serves is verified (and only those): the verifications count
    # the served calls; the logits are compared with the plain graph's
    before = {s["key"]: dict(s["shadow"]) for s in rms_routes(understudy.report())}
    understudy.set_mode("rms_norm", "canary")  # its share: the config's 0.25
    settle()
    canary_equal = replay_both(chained, args.replays, 3)
    canary = rms_routes(understudy.report())
    understudy.set_mode("rms_norm", "live")
    settle()
    live_equal = replay_both(chained, args.replays // 5, 4)
    serving = rms_routes(understudy.report())

    # 3. cost (before the rollback phase: that one ends this enable)
    rows = {"plain": (plain, None), "beside, gates closed": (shadowed, "observe"),
            "beside, gates open": (shadowed, "shadow"), "chain, gates closed": (chained, "observe"),
            "chain, gates open": (chained, "shadow"), "chain, canary 0.25": (chained, "canary"),
            "chain, live": (chained, "live")}

    def timed(row):
        g, mode = rows[row]
        if mode is not None:
            understudy.set_mode("rms_norm", mode)  # canary: its share, the config's 0.25
            settle()
        return per_replay_us(g, args.batch_replays)
    for m in rows:  # warm
        timed(m)
    times = {m: [] for m in rows}
    for _ in range(args.rounds):
        for m in rows:
            times[m].append(timed(m))
    # torch.profiler's kernel tracing fails every launch of a graph holding a
    # kernel that launches graphs from the device (the context is lost)
    profiled = rep["graphs"]["launched"] == 0
    ks = {}
    if profiled:
        for m in ("beside, gates closed", "beside, gates open", "chain, gates closed", "chain, gates open",
                  "chain, live"):
            g, mode = rows[m]
            understudy.set_mode("rms_norm", mode)
            settle()
            ks[m] = kernel_us(g, 20)
    settle()
    understudy.disable()
    if profiled:
        ks["plain"] = kernel_us(plain, 20)
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"\n3. cost: replay time, median of {args.rounds} interleaved rounds of {args.batch_replays} replays; "
          f"kernel time per replay (torch.profiler)")
    print(f"{'graph':<24} {'us/replay':>10} {'vs plain':>9} {'added us':>9} {'kernel us':>10}")
    cost = []
    for m in rows:
        k = f"{sum(ks[m].values()):>10.2f}" if m in ks else f"{'':>10}"
        print(f"{m:<24} {med[m]:>10.2f} {med[m] / med['plain']:>9.4f} {med[m] - med['plain']:>9.2f} {k}")
        cost.append((m, round(med[m], 2), round(med[m] / med["plain"], 4), round(med[m] - med["plain"], 2),
                     round(sum(ks[m].values()), 2) if m in ks else None))
    if profiled:
        print_kernel_breakdown(ks, med)
    else:
        print("kernel time: not taken (CUPTI's kernel tracing fails a graph whose kernels launch graphs from the "
              "device)")

    print(f"\n4. serving under replay (the chain graph, not captured again; sample 1: a call is verified when, and "
          f"only when, the candidate serves it): canary 0.25 for {args.replays} replays, then live for "
          f"{args.replays // 5}; logits bit-equal to the plain graph's on {canary_equal} of {args.replays} and "
          f"{live_equal} of {args.replays // 5}")
    print(f"{'route':<44} {'sites':>5} {'canary served':>14} {'x replays':>10} {'live served':>12} {'x replays':>10} "
          f"{'failed':>7}")
    served = []
    for s, t in zip(canary, serving):
        b = before.get(s["key"], {"verified": 0})
        n_sites = max(s["shadow"]["graph"]["shadowed"] - s["shadow"]["graph"]["beside"], 1)
        c = s["shadow"]["verified"] - b["verified"]
        v = t["shadow"]["verified"] - s["shadow"]["verified"]
        print(f"{s['key'][:44]:<44} {n_sites:>5} {c:>14} {c / n_sites / args.replays:>10.3f} {v:>12} "
              f"{v / n_sites / max(args.replays // 5, 1):>10.3f} {t['shadow']['failed']:>7}")
        served.append((s["key"], n_sites, c, round(c / n_sites / args.replays, 3), v,
                       round(v / n_sites / max(args.replays // 5, 1), 3), t["shadow"]["failed"]))

    # 2. rollback: the warm-up observed (an eager shadow call would roll it
    # back before the capture)
    understudy.enable(config("rms_norm_cuda_wrong_tail", args))
    understudy.set_mode("rms_norm", "observe")
    wrong = grab(make(), lambda: understudy.set_mode("rms_norm", "shadow"))
    settle()
    plain.rewind()
    plain.replay()
    a = plain.out.clone()
    wrong.rewind()
    wrong.replay()
    same = torch.equal(a, wrong.out)
    settle()
    first = rms_routes(understudy.report())
    for _ in range(args.replays):
        wrong.rewind()
        wrong.replay()
    settle()
    later = rms_routes(understudy.report())
    understudy.disable()
    recorded = " (the recording, which ran it, and one call)" if args.capture == "compile" else ""
    print(f"\n2. rollback: a candidate wrong on its last element, captured; after one replay{recorded} (logits equal "
          f"to the plain graph's: {same}):")
    rollback = []
    for s, t in zip(first, later):
        sh = s["shadow"]
        ev = sh["rollback"] or {}
        print(f"  {s['key']}: mode {s['mode']}, verified {sh['verified']}, failed {sh['failed']}, rollback "
              f"{ev.get('reason')} at {ev.get('first_mismatch', {}).get('index')}; after {args.replays} more "
              f"replays: verified {t['shadow']['verified']} (+{t['shadow']['verified'] - sh['verified']})")
        rollback.append((s["key"], s["mode"], sh["verified"], sh["failed"], ev.get("reason"),
                         str(ev.get("first_mismatch", {}).get("index")), t["shadow"]["verified"] - sh["verified"]))
    _results.write("graph_shadow", [
        _results.table(f"verdicts: {args.replays} replays of the graph with the shadow beside the chain (sample 1); "
                       f"logits bit-equal to the plain graph's on {equal} of {args.replays}",
                       ["route", "sites", "verified", "× replays", "passed", "failed"], verdicts,
                       [None, None, ",", ".3f", ",", ","]),
        _results.table(f"cost: replay time, median of {args.rounds} interleaved rounds of {args.batch_replays} "
                       f"replays; kernel time per replay (torch.profiler)",
                       ["graph", "µs/replay", "vs plain", "added µs", "kernel µs"], cost,
                       [None, ".2f", ".4f", "+.2f", ".2f"]),
        _results.table(f"serving under replay: canary 0.25 for {args.replays} replays, then live for "
                       f"{args.replays // 5}; logits bit-equal on {canary_equal} of {args.replays} and {live_equal} "
                       f"of {args.replays // 5}",
                       ["route", "sites", "canary served", "× replays", "live served", "× replays", "failed"],
                       served, [None, None, ",", ".3f", ",", ".3f", ","]),
        _results.table(f"rollback: a candidate wrong on its last element, captured; logits after one replay "
                       f"equal to the plain graph's: {same}",
                       ["route", "mode", "verified", "failed", "reason", "first mismatch",
                        f"verified in {args.replays} more replays"], rollback)],
        args=args, notes=[f"beside the chain, started by {started_by(rep['graphs'], args.host_start)}; graphs: "
                          + ", ".join(f"{k} {rep['graphs'][k]}" for k in ("hosted", "launched", "refused", "gated",
                                                                         "gated_replays", "gate_failed",
                                                                         "host_starts"))])


if __name__ == "__main__":
    main()
