"""The CUPTI kernel timer on CUDA: per-call kernel time against torch.profiler's,
coverage, standing down for torch's profiler and resuming after it.
Skipped only where torch sees no CUDA device."""
import statistics
import time

import pytest
import torch

from conftest import calls_behind_queued_work

pytestmark = pytest.mark.gpu  # needs a CUDA device (conftest.py skips it without one)

ALWAYS = {"kind": "cupti", "budget": 0, "window_ms": 200}


def mm_calls(a, b, n):
    for _ in range(n):
        torch.mm(a, b)
    torch.cuda.synchronize()


def mm_for(a, seconds):
    """Calls for a while (longer than a window and the gap after it)."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, a)
        torch.cuda.synchronize()
        n += 1
    return n


def route(rep, op, **dims):
    for o in rep["operators"]:
        for s in o["shapes"]:
            if s["op"] == op and all(s["dims"].get(k) == v for k, v in dims.items()):
                return s
    return None


def profiler_mm_us(a, b, n, names=None):
    """torch.profiler's per-call kernel time of the same mm (the ground
    truth); names, a set, receives the names of the kernels it ran."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        mm_calls(a, b, n)
    per_call = [e.device_time_total for e in prof.events() if e.name == "aten::mm"]
    assert len(per_call) == n
    if names is not None:
        names.update(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return statistics.median(per_call)


@pytest.mark.parametrize("correlation", ["callbacks", "records"])  # callbacks first: before torch's profiler subscribed
def test_cupti_times_calls_by_their_kernels(us, correlation):
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    mm_calls(a, b, 20)
    # one window (5 s) for every call: it opens within the worker's idle poll
    # (0.1 s) once a GPU call was seen; a shorter one could close before the
    # 200 calls and the next open after them
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
               "timer": dict(ALWAYS, correlation=correlation, window_ms=5000)})
    with us.phase("decode"):  # the calls' and their kernels' phase
        mm_calls(a, b, 3)
        time.sleep(0.3)
        mm_calls(a, b, 200)
    rep = us.report()
    us.disable()
    tm = rep["timer"]
    # the callbacks see every launch and its thread's phase; records know none
    assert tm["phases"]["decode" if tm["correlation"] == "callbacks" else "unknown"]["kernel_ns"] == tm["kernel_ns"], tm
    assert tm["kind"] == "cupti", tm
    # callbacks need CUPTI's subscription: once torch's profiler took it, records
    assert tm["correlation"] == correlation or (correlation, tm["correlation"]) == ("callbacks", "records"), tm
    assert tm["windows"] >= 1 and tm["calls_timed"] >= 100, tm
    s = route(rep, "aten::mm", M=2048, N=2048, K=2048)
    assert s["calls"] == 203 and s["kernel_timed"] >= 100, s
    ours = s["latency_ns"]["p50"] / 1e3
    profiled = set()
    truth = profiler_mm_us(a, b, 200, profiled)
    served = s["served_by"]["production_kernels"]
    print(f"\nmm 2048^3 bf16 ({tm['correlation']}): understudy (CUPTI) p50 {ours:.2f} us, torch.profiler {truth:.2f} us, "
          f"{tm['windows']} windows, {tm['calls_timed']} calls timed by kernels; production's kernels {served}")
    # which kernels served the route: the ones torch.profiler saw the same mm run, named as it names them
    assert served and set(served) <= profiled, (served, profiled)
    assert abs(ours / truth - 1) < 0.10
    # the kernels' span is reported apart: one kernel, span = sum
    assert s["kernel_span_ns"] > 0


def test_coverage_names_the_kernels_no_bound_op_launched(us):
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64 << 20, device="cuda")
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "timer": ALWAYS})
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:  # past the first window (it opens once a GPU call was seen)
        torch.mm(a, a)
        x.mul_(1.0001)  # not bound: its kernels are unattributed
        torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    tm = rep["timer"]
    assert tm["kernel_ns"] > tm["attributed_ns"] > 0, tm
    assert 0 < tm["coverage"] < 1
    names = [u["name"] for u in tm["unattributed"]]
    assert any("elementwise" in n or "vectorized" in n or "mul" in n.lower() for n in names), names
    print(f"\ncoverage {tm['coverage']:.3f}; unattributed {names[:3]}")


def test_profiler_started_mid_run_takes_cupti_and_understudy_resumes(us):
    from torch.profiler import ProfilerActivity, profile
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "timer": ALWAYS})
    torch.mm(a, a)
    time.sleep(0.3)
    mm_for(a, 0.5)
    before = us.report()["timer"]
    assert before["kind"] == "cupti" and before["calls_timed"] > 0, before
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            mm_calls(a, a, 20)
            time.sleep(0.02)
    during = us.report()["timer"]
    # the profiler got its kernels: understudy did not take them
    kernels = [e for e in prof.events() if e.name == "aten::mm"]
    assert len(kernels) == 400 and all(e.device_time_total > 0 for e in kernels)
    assert during["yields"] >= 1, during
    time.sleep(1.5)  # it asks again once the profiler has stopped
    mm_for(a, 0.6)
    after = us.report()["timer"]
    us.disable()
    print(f"\nbefore {before['calls_timed']} timed; during: {during.get('why')!r}, yields {during['yields']}; "
          f"after {after['calls_timed']} timed, state {after.get('state')}")
    assert after["calls_timed"] > during["calls_timed"], (during, after)


def test_a_window_never_makes_a_call_wait_for_the_device(us):
    """Inside a window calls push and pop an id; nothing waits for queued
    work. Each of those calls is then timed by its kernels or, when the
    window concluded before its kernels ran (the report closes the window;
    the tracer does not know yet when queued work is done), dropped and
    counted: never a figure from a partial record."""
    a = torch.randn(256, 256, device="cuda")
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
               "timer": {"kind": "cupti", "budget": 0, "window_ms": 5000}})
    torch.mm(a, a)
    time.sleep(0.3)  # the window opens within the worker's idle poll (0.1 s) and stays open 5 s
    torch.cuda.synchronize()
    host_s, still_running, _ = calls_behind_queued_work(lambda: torch.mm(a, a), cycles=1_000_000_000)
    rep = us.report()
    us.disable()
    s = route(rep, "aten::mm", M=256, N=256, K=256)
    print(f"\n10 calls in a window returned after {host_s * 1e3:.2f} ms; {s['kernel_timed']} timed by kernels")
    assert still_running  # the calls returned while the queued work still ran
    assert rep["timer"]["windows"] >= 1, rep["timer"]
    assert s["calls"] == 11 and s["kernel_timed"] + s["timing_dropped"] == 10, s


def _replayed_in_a_window(us, x, graph, replays):
    """mm observed, every call timed, the tracer's window (5 s) opened by
    calls on x; then graph() (captured now, or before enable) replayed
    inside it; the report after them."""
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
               "timer": dict(ALWAYS, window_ms=5000)})
    mm_for(x, 1.0)  # GPU calls seen: the window (5 s) opens
    g = graph()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    return rep


def test_a_graph_captured_before_enable_is_reported_as_unknown(us):
    """A graph captured before understudy was enabled ran no dispatcher
    code it saw: its replays count no call of any route, and the tracer
    reports their kernels as graph_unknown_kernels (graphs no bound op was
    seen captured into), never attributed. Ground truth: the test's replay
    count (each replay runs the same kernels)."""
    _captured_before_enable(us, eager=0)


def test_a_graph_captured_before_enable_makes_the_route_that_runs_its_kernels_observe_only(us):
    """The same graph, with eager calls of the captured shape in the
    window: the route learns its production kernels' names, and every
    kernel of the graph's replays (all of them the mm's) counts on it as
    unseen; its graph status is observe-only, the reason naming the graphs
    understudy did not see captured. No replay becomes a call of it."""
    _captured_before_enable(us, eager=3)


def _captured_before_enable(us, eager):
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 64, device="cuda")
    mm_calls(a, b, 5)  # cuBLAS initialised before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.mm(a, b)
    replays = 20

    def eager_then_graph():
        mm_calls(a, b, eager)
        return g

    rep = _replayed_in_a_window(us, x, eager_then_graph, replays)
    tm = rep["timer"]
    s = route(rep, "aten::mm", M=2048, N=2048, K=2048)
    print(f"\ngraph captured before enable: {replays} replays, graph_unknown_kernels {tm['graph_unknown_kernels']}, "
          f"graph_unknown_ns {tm['graph_unknown_ns']}, route {s and (s['calls'], s['captured'], s['replayed'])}, "
          f"graph {s and s['graph']}")
    assert s is None or (s["calls"], s["captured"], s["replayed"]) == (eager, 0, 0), s
    n = tm["graph_unknown_kernels"]
    assert n >= replays and n % replays == 0, tm
    assert tm["graph_unknown_ns"] > 0 and tm["calls_replayed"] == 0, tm
    assert rep["graphs"]["unseen"] == 1, rep["graphs"]  # the package's replay hook: one graph not seen captured
    if eager == 0:
        return
    assert s["kernel_timed"] >= 1, s  # its kernels named: learned in the window
    assert s["graph"]["unseen_kernels"] == n and s["graph"]["unseen_ns"] == tm["graph_unknown_ns"], (s, tm)
    assert s["graph"]["status"] == "observe-only", s
    assert s["graph"]["reason"].startswith(f"{n} of its kernels ran in graphs understudy did not see captured"), s
    other = route(rep, "aten::mm", M=64, N=64, K=64)  # its kernels are another shape's: none counts on it
    assert other["graph"]["unseen_kernels"] == 0 and other["graph"]["status"] is None, other


def _cudart():
    """The CUDA runtime torch loaded (by its soname: the copy already mapped)."""
    import ctypes
    rt = ctypes.CDLL(f"libcudart.so.{torch.version.cuda.split('.')[0]}")
    rt.cudaGraphExecUpdate.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    rt.cudaGraphExecUpdate.restype = ctypes.c_int
    return rt


def changed_in_place():
    """Two mm shapes captured into two kept graphs inside a window; the
    first's executable graph updated in place (cudaGraphExecUpdate from its
    own graph: a change CUDA accepts), once; both replayed. Prints the two
    routes' graph figures and the window's correlation as JSON."""
    import ctypes
    import json
    import understudy
    understudy.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
                       "timer": dict(ALWAYS, window_ms=5000)})
    x = torch.randn(64, 64, device="cuda")
    mm_for(x, 1.0)  # the window (5 s) opens; what follows happens inside it
    graphs = []
    for n in (256, 512):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        mm_calls(a, a, 3)
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g):
            torch.mm(a, a)
        g.instantiate()
        graphs.append(g)
    info = (ctypes.c_byte * 64)()
    rc = _cudart().cudaGraphExecUpdate(graphs[0].raw_cuda_graph_exec(), graphs[0].raw_cuda_graph(), info)
    for g in graphs:
        for _ in range(5):
            g.replay()
    torch.cuda.synchronize()
    rep = understudy.report()
    understudy.disable()
    print(json.dumps({"rc": rc, "correlation": rep["timer"].get("correlation"),
                      "routes": [route(rep, "aten::mm", M=n, N=n, K=n) for n in (256, 512)]}))


def test_a_graph_changed_in_place_makes_its_captured_routes_observe_only():
    """A graph library's change in place of an executable graph holding a
    captured call (changed_in_place, in a process of its own: callbacks need
    CUPTI's subscription, which torch's profiler, run by other tests here,
    keeps for the life of a process). The kernel tracer's callbacks see it:
    the changed route's captured call counts as changed and the route is
    observe-only, naming the change; the other route, untouched, stays
    observed. Ground truth: the update the test made, once."""
    import json
    import os
    import subprocess
    import sys
    from conftest import ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python-shim"), str(ROOT / "tests" / "python")]))
    out = subprocess.run([sys.executable, "-c", "import test_kernel_timer_cuda as t; t.changed_in_place()"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    changed, kept = got["routes"]
    print(f"\ngraph changed in place ({got['correlation']}): {changed['graph']}; beside it: {kept['graph']}; "
          f"replayed {changed['replayed']}, {kept['replayed']}")
    assert got["rc"] == 0 and got["correlation"] == "callbacks", got
    assert changed["captured"] == 1 and kept["captured"] == 1, (changed, kept)
    assert changed["graph"]["changed"] == 1 and changed["graph"]["status"] == "observe-only", changed["graph"]
    assert changed["graph"]["reason"].startswith("1 of its captured calls changed in place in an executable graph")
    assert kept["graph"]["changed"] == 0 and kept["graph"]["status"] == "observed", kept["graph"]


def test_graph_replays_are_counted_and_timed_by_their_kernels(us):
    """Two mm calls captured into a CUDA graph (torch.cuda.graph), replayed
    R times inside a window: every replay of each is a replayed call of the
    route, timed by its kernel; the relu between them is a node no bound op
    added (unattributed). Ground truth: the test's own replay count, and
    torch.profiler's time of the same mm run eagerly."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 64, device="cuda")
    mm_calls(a, b, 5)  # cuBLAS initialised before capture
    def capture():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            c = torch.mm(a, b).relu()
            torch.mm(c, b)
        return g
    replays = 40
    rep = _replayed_in_a_window(us, x, capture, replays)
    tm = rep["timer"]
    s = route(rep, "aten::mm", M=2048, N=2048, K=2048)
    print(f"\ngraph: captured {s['captured']}, eager {s['eager']}, replayed {s['replayed']}, "
          f"kernel_timed {s['kernel_timed']}, calls_replayed {tm['calls_replayed']}, coverage {tm['kernel_ns'] and tm['attributed_ns'] / tm['kernel_ns']:.3f}")
    assert s["calls"] == 2 and s["captured"] == 2 and s["eager"] == 0, s
    assert s["replayed"] == 2 * replays and s["kernel_timed"] == 2 * replays, s
    assert tm["calls_replayed"] == 2 * replays, tm
    assert any("elementwise" in u["name"] for u in tm["unattributed"]), tm["unattributed"]  # the relu node
    ours = s["latency_ns"]["p50"] / 1e3
    truth = profiler_mm_us(a, b, 100)
    print(f"replayed mm 2048^3 bf16: understudy p50 {ours:.2f} us, torch.profiler (eager) {truth:.2f} us")
    assert abs(ours / truth - 1) < 0.10


def test_replays_of_torch_compile_reduce_overhead_are_counted(us):
    """torch.compile(mode="reduce-overhead") captures its graph on the
    second call and replays it after: the mm it runs through the dispatcher
    at capture (aten::mm.out, an extern kernel) is replayed on every later
    call, each seen in the window."""
    w = torch.randn(1024, 1024, device="cuda")
    fn = torch.compile(lambda x: torch.mm(x, w).relu() + 1, mode="reduce-overhead")
    x = torch.randn(256, 1024, device="cuda")
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
               "timer": dict(ALWAYS, window_ms=60000)})
    mm_for(x[:64, :64], 1.0)  # GPU calls seen: the window (60 s) opens
    n = 30
    for _ in range(n):
        fn(x)
    torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    shapes = [s for o in rep["operators"] for s in o["shapes"] if s["dims"].get("M") == 256 and s["dims"].get("N") == 1024]
    print("\nreduce-overhead:", [(s["op"], s["calls"], s["captured"], s["replayed"]) for s in shapes])
    captured = [s for s in shapes if s["captured"] > 0]
    assert captured, shapes
    # the first call warms up and the second records (and replays once): all but the first replay
    assert sum(s["replayed"] for s in captured) == n - 1, captured
