"""Observe mode on CUDA: counts, graph capture, and no host synchronisation.
Skipped only where torch sees no CUDA device."""
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import DispatchCounter, all_bindings, bound_ops, calls_behind_queued_work
from understudy.demo import TinyDecoder

pytestmark = pytest.mark.gpu  # needs a CUDA device (conftest.py skips it without one)


def run_model():
    torch.manual_seed(0)
    model = TinyDecoder().to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.inference_mode():
        return model.generate(ids, 6)


def test_cuda_counts_match_and_outputs_identical(us):
    plain = run_model()
    with DispatchCounter() as truth:
        counted = run_model()
    assert torch.equal(plain, counted)
    us.enable({"defaults": {"sample": 1.0}, "timer": {"kind": "events"}})  # every call timed (events)
    served = run_model()
    rep = us.report()  # flushes device timings
    assert torch.equal(plain, served)
    got = bound_ops(rep)
    bound = all_bindings(rep)
    expected = {op: n for op, n in truth.counts.items() if op in bound}
    assert {"aten::mm", "aten::silu", "aten::topk", "aten::_fused_rms_norm"} <= set(expected)
    for op in bound:
        assert got.get(op, 0) == expected.get(op, 0), op
    for op in rep["operators"]:
        for s in op["shapes"]:
            assert s["device"] == "cuda"
            assert s["timed"] == s["calls"] and s["captured"] == 0
            assert s["latency_ns"]["p50"] > 0


def _torch_events_ns(a, b, n=20):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        torch.mm(a, b)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / n * 1e6


def test_event_timing_agrees_with_torch_events(us):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    # torch's own events before and after understudy's run: the card's clocks
    # may still be ramping up from idle, so the reference is the range of both
    before = _torch_events_ns(a, b)
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "timer": {"kind": "events"}})
    for _ in range(20):
        torch.mm(a, b)
    (s,) = us.report()["operators"][0]["shapes"]
    us.disable()
    after = _torch_events_ns(a, b)
    assert s["timed"] == 20
    p50 = s["latency_ns"]["p50"]
    print(f"4096^3 bf16 mm: understudy p50 {p50 / 1e3:.1f} us, torch events mean {before / 1e3:.1f} us before, "
          f"{after / 1e3:.1f} us after")
    assert 0.7 * min(before, after) < p50 < 1.3 * max(before, after)


@pytest.mark.parametrize("config", [{}, {"defaults": {"key_every": 8, "key_after": 0}}],
                         ids=["defaults", "random_keying_from_the_first_call"])
def test_graph_capture_counts_captured_and_replays_match(us, config):
    """Captured calls are counted one by one, also where calls would be keyed
    at random: while the thread captures (the package's hooks on
    torch.cuda.CUDAGraph say so) its calls are each keyed, so that the
    graph's nodes map to routes."""
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) / 16
    w2 = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16) / 16
    nw = torch.ones(256, device="cuda", dtype=torch.bfloat16)

    def step(inp):
        h = F.rms_norm(inp, (256,), nw, 1e-6)
        return torch.mm(F.silu(torch.mm(h, w1)), w2)

    static_in = x.clone()
    with torch.inference_mode():
        want = [step(x * (i + 1)) for i in range(3)]
        us.enable(config)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step(static_in)  # warm-up before capture, as torch.cuda.graph requires
        torch.cuda.current_stream().wait_stream(s)
        before = bound_ops(us.report())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = step(static_in)
        got = []
        for i in range(3):
            static_in.copy_(x * (i + 1))
            g.replay()
            got.append(static_out.clone())
    torch.cuda.synchronize()
    rep = us.report()
    for w, g_ in zip(want, got):
        assert torch.equal(w, g_)
    after = bound_ops(rep)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    # one capture: each op once; replays never reach the dispatcher
    assert delta["aten::mm"] == 2 and delta["aten::silu"] == 1 and delta["aten::_fused_rms_norm"] == 1
    captured = sum(s["captured"] for op in rep["operators"] for s in op["shapes"])
    assert captured == 4
    assert rep["totals"]["captured"] == 4


def test_past_the_warm_up_calls_on_any_stream_are_tallied_and_a_captures_keyed_one_by_one(us):
    """Past a thread's warm-up a CUDA call may be tallied on torch's default
    stream and on any other (its stream is not asked); a call the thread
    makes while it captures a graph (torch.cuda.graph: the package's hooks
    say so) is keyed, so that its node maps to its route: that key's count
    is exact, while the others are estimates whose keyed calls and tallies
    add up to every call."""
    a, b, c, d = (torch.randn(16, n, device="cuda") for n in (16, 16, 8, 4))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.mm(a, d)  # cuBLAS's state for the captured shape, before understudy counts
    torch.cuda.synchronize()
    us.enable({"defaults": {"key_every": 8, "key_after": 0}, "operators": {"gemm": "observe"},
               "timer": {"kind": "events"}})
    for _ in range(800):
        torch.mm(a, b)
    with torch.cuda.stream(side):
        for _ in range(800):
            torch.mm(a, c)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(100):
            torch.mm(a, d)
    torch.cuda.synchronize()
    (op,) = [o for o in us.report()["operators"] if o["name"] == "gemm"]
    keys = {s["key"].split("|")[-1]: s for s in op["shapes"]}
    on_default, on_side, captured = keys["M=16,K=16,N=16"], keys["M=16,K=16,N=8"], keys["M=16,K=16,N=4"]
    assert (captured["calls"], captured["estimated"], captured["captured"]) == (100, 0, 100)
    for s in (on_default, on_side):
        # 800 calls, each keyed with probability 1/8: 100 +- 9.4 (sd); 5 sd
        assert s["estimated"] % 7 == 0 and abs(s["estimated"] // 7 - 100) <= 47, s
    seen = sum(s["calls"] - s["estimated"] for s in (on_default, on_side))
    assert op["tallied"] + seen == 1600


def test_observed_call_does_not_wait_for_queued_work(us):
    a = torch.randn(256, 256, device="cuda")
    torch.mm(a, a)
    torch.cuda.synchronize()
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "timer": {"kind": "events"}})
    torch.mm(a, a)  # first call: timer slots are created outside the measurement
    torch.cuda.synchronize()
    host_s, still_running, t0 = calls_behind_queued_work(lambda: torch.mm(a, a))
    torch.cuda.synchronize()
    gpu_total = time.perf_counter() - t0
    print(f"10 observed calls returned after {host_s * 1e3:.2f} ms; queued work finished after {gpu_total * 1e3:.0f} ms")
    assert still_running, "the queued work finished before the calls returned: something synchronised"
    assert gpu_total > 10 * host_s
    rep = us.report()
    (s,) = rep["operators"][0]["shapes"]
    assert s["calls"] == 11 and s["timed"] == 11


def _capture_mode_of_this_thread():
    """The calling thread's stream-capture mode, read from the driver (the
    mode is the driver's per-thread state, whichever runtime set it):
    0 global (the default), 1 thread-local, 2 relaxed."""
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    mode = ctypes.c_int(0)
    assert cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    was = mode.value
    assert cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0  # put it back
    return was


def test_flush_and_report_leave_the_threads_capture_mode_alone(us):
    """A flush switched the calling thread to the relaxed capture mode for
    good: a graph captured by that thread afterwards no longer caught calls
    that are unsafe during capture."""
    a = torch.randn(256, 256, device="cuda")
    assert _capture_mode_of_this_thread() == 0
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}})
    for _ in range(5):
        torch.mm(a, a)
    us.flush()
    assert _capture_mode_of_this_thread() == 0
    us.report()
    assert _capture_mode_of_this_thread() == 0
    us.disable()
    assert _capture_mode_of_this_thread() == 0


def test_a_flush_never_blocks_a_thread_that_times_calls(us):
    """A flush held the timer pool's lock while it waited for device events:
    a serving thread timing a call waited for the device too."""
    import threading
    a = torch.randn(256, 256, device="cuda")
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "timer": {"kind": "events"}})
    torch.mm(a, a)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time queued ahead
    for _ in range(20):
        torch.mm(a, a)  # timings pending behind the sleep
    flusher = threading.Thread(target=us.flush)
    flusher.start()
    time.sleep(0.05)  # the flush is waiting on the device now
    t0 = time.perf_counter()
    for _ in range(10):
        torch.mm(a, a)
    serving_s = time.perf_counter() - t0
    still_flushing = flusher.is_alive()
    flusher.join()
    print(f"10 timed calls beside a waiting flush took {serving_s * 1e3:.2f} ms")
    # the serving calls returned while the flush still waited for the device
    assert still_flushing, "the flush returned before the serving calls: the device was not waited for"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_shadow_marks_follow_the_tensors_device_not_the_threads(us):
    """A thread whose current device differed from its tensors' recorded the
    production marks on the wrong device: every shadow of its calls was
    skipped, silently."""
    from test_shadow import native, rms_inputs, routes, run_rms_norm, shadow_config
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        inputs = rms_inputs("cuda:1", torch.bfloat16, shapes=((7, 4096), (64, 4096)))
    want = run_rms_norm(inputs)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    got = run_rms_norm(inputs)
    us.flush()
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    rs = routes(us.report(), "_C::rms_norm")
    assert len(rs) == len(inputs)
    for r in rs:
        sh = r["shadow"]
        assert (sh["calls"], sh["verified"], sh["passed"], sh["skipped"]) == (3, 3, 3, 0), sh


_EXIT_ENABLED = """
import sys, torch, understudy
understudy.enable({"operators": {"gemm": "observe"}, "defaults": {"sample": 1.0}, "log_level": "info"})
a = torch.randn(64, 64, device="cuda")
for _ in range(int(sys.argv[1])):
    a = torch.mm(a, a).tanh_()
print("made")
"""


def test_a_process_that_exits_while_its_calls_are_timed_exits_cleanly():
    """Processes that exit with understudy enabled while the worker is still
    harvesting event timings of the calls just made (every call timed, the
    last ones still queued on the device): each exits 0, its worker stopped
    before the CUDA runtime's teardown (said at log level info)."""
    import os
    import subprocess
    import sys
    from conftest import ROOT
    env = {k: v for k, v in os.environ.items() if k != "UNDERSTUDY_CONFIG"}
    env["PYTHONPATH"] = str(ROOT / "python-shim")
    for n in (200, 2000, 5000, 2000, 200):
        p = subprocess.run([sys.executable, "-c", _EXIT_ENABLED, str(n)], env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and p.stdout.strip() == "made", (n, p.returncode, p.stderr[-2000:])
        assert "process exit: the worker stopped" in p.stderr, p.stderr[-2000:]
