"""Native candidates qualifying in a process of their own
(candidate.qualify: "process"): the serving process never runs, nor even
loads, a candidate before it passed qualify_calls verifications on copies
of real arguments in a child; a crash, hang or wrong result there refuses it
with evidence. Ground truth: each call of the test candidates appends the id
of the process that ran it to $UST_TEST_CALL_LOG, /proc/self/maps shows what
this process mapped, and the calls' results are compared with the same calls
without understudy."""
import os
import sys
import time

import pytest
import torch
import torch.nn.functional as F

import understudy
from conftest import ROOT, candidate_dir


@pytest.fixture(autouse=True)
def signals_reach_the_child(monkeypatch):
    """Under the sanitized build the child runs with AddressSanitizer, whose
    handler would turn a crash into a report and exit status 1: the child
    is told to leave the signals alone, so a crash ends it as it ends an
    unsanitized one; and an allocation its memory limit refuses returns
    NULL, as glibc's does, instead of ending it with a report."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        opts = os.environ.get("ASAN_OPTIONS", "")
        monkeypatch.setenv("ASAN_OPTIONS", ":".join(filter(None, [opts, "handle_segv=0", "handle_sigbus=0",
                                                                  "allocator_may_return_null=1"])))


@pytest.fixture
def call_log(tmp_path, monkeypatch):
    path = tmp_path / "calls.log"
    monkeypatch.setenv("UST_TEST_CALL_LOG", str(path))
    return path


def ran_in(path):
    """The process ids that ran the candidate's calls, in call order."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def qualifying(lib, mode="shadow", sample=1.0, qualify_calls=3, guard=None, **op):
    cand = understudy.native(candidate_dir() / f"lib{lib}.so")
    cand.update(qualify="process", qualify_calls=qualify_calls)
    entry = {"mode": mode, "sample": sample, "candidate": cand, **op}
    if guard:
        entry["guard"] = guard
    return {"operators": {"silu": entry}, "report": {"interval_s": 0}}


def silu_state(rep):
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    (route,) = [s for s in op["shapes"] if s["op"] == "aten::silu"]
    return op["candidate"], route


def mapped_candidates():
    """Mappings of candidates understudy loaded into this process (they are
    loaded from a sealed memfd of this name)."""
    with open("/proc/self/maps") as f:
        return sum("ust-verified" in line for line in f)


def wait_for(pred, timeout=60.0):
    """Whether pred() came true within timeout: a guard against a wait that
    never ends, long enough that only a broken promise runs into it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone as far as running code goes (and one reaped meanwhile is gone)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def inputs(n, seed=0, shape=(4, 8)):
    """n silu inputs with production's outputs for them, computed now (call
    it before enable: a reference computed under understudy would be one of
    the calls under test)."""
    assert not understudy.is_enabled()
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*shape, generator=g) for _ in range(n)]
    return [(x, x.clone(), F.silu(x)) for x in xs]


def run(batch):
    """Each input's call under test: (input, its value before, output, production's output)."""
    return [(x, before, F.silu(x), plain) for x, before, plain in batch]


def assert_production_served(seen):
    for x, before, y, plain in seen:
        assert torch.equal(x, before)
        assert torch.equal(y, plain)


def test_a_correct_candidate_runs_in_its_own_process_until_it_qualified_then_here(us, call_log):
    first, third, later = inputs(2), inputs(1, seed=1), inputs(4, seed=2)
    base_maps = mapped_candidates()
    us.enable(qualifying("silu_ok", qualify_calls=3))
    seen = run(first)
    cand, route = silu_state(us.report())
    child = cand["qualifying_process"]["pid"]
    assert isinstance(child, int) and child != os.getpid()
    assert ran_in(call_log) == [child, child]
    assert mapped_candidates() == base_maps  # not loaded here before a route qualified
    assert cand["qualify"] == "process" and not cand["qualifying_process"]["loaded_here"]
    seen += run(third)  # the third pass qualifies the route
    assert wait_for(lambda: silu_state(us.report())[0]["qualifying_process"]["loaded_here"])
    assert mapped_candidates() > base_maps
    seen += run(later)
    assert_production_served(seen)
    assert ran_in(call_log) == [child] * 3 + [os.getpid()] * 4
    cand, route = silu_state(us.report())
    q = cand["qualifying_process"]
    assert (q["runs"], q["passed"], q["routes_qualified"], q["refused"]) == (3, 3, 1, None)
    assert route["shadow"]["process_passed"] == 3
    assert route["shadow"]["passed"] == 7 and route["mode"] == "shadow"
    # the calls run there are not the kernel's time: only the 4 run here are
    assert route["shadow"]["candidate_latency_ns"]["count"] == 4
    us.disable()
    assert wait_for(lambda: gone(child))


def test_a_route_qualifies_on_its_own_shapes(us, call_log):
    """qualify_calls passes are needed per route: another shape runs in the
    child again, though the candidate is loaded here by then."""
    a, b = inputs(2), inputs(2, shape=(2, 16))
    us.enable(qualifying("silu_ok", qualify_calls=1))
    run(a[:1])
    assert wait_for(lambda: silu_state(us.report())[0]["qualifying_process"]["loaded_here"])
    child = silu_state(us.report())[0]["qualifying_process"]["pid"]
    seen = run(a[1:]) + run(b)  # b: a new route
    assert_production_served(seen)
    assert ran_in(call_log) == [child, os.getpid(), child, os.getpid()]


def test_a_candidate_crashing_there_is_refused_and_never_loaded_here(us, call_log):
    batch = inputs(6)
    base_maps = mapped_candidates()
    us.enable(qualifying("silu_crash_at_3", qualify_calls=5))
    seen = run(batch)
    assert_production_served(seen)
    cand, route = silu_state(us.report())
    q = cand["qualifying_process"]
    child = ran_in(call_log)[0]
    assert ran_in(call_log) == [child] * 3 and child != os.getpid()
    assert "SIGSEGV" in q["refused"] and q["pid"] is None and not q["loaded_here"]
    assert route["mode"] == "rolled_back"
    assert "SIGSEGV" in route["shadow"]["rollback"]["message"]
    assert gone(child)
    time.sleep(0.3)  # the engine's worker had its chance to load it
    assert mapped_candidates() == base_maps
    assert not silu_state(us.report())[0]["qualifying_process"]["loaded_here"]


def test_a_candidate_signalling_the_serving_process_from_there_is_killed_and_refused(us, call_log):
    """The qualifying process runs as the same user: a candidate there could
    send the serving process SIGKILL. It confines itself before loading the
    candidate: a signal to any process but itself kills it with SIGSYS."""
    batch = inputs(4)
    us.enable(qualifying("silu_signals_parent_at_2", qualify_calls=5))
    seen = run(batch)  # this process is alive to see it
    assert_production_served(seen)
    cand, route = silu_state(us.report())
    q = cand["qualifying_process"]
    assert "SIGSYS" in q["refused"] and not q["loaded_here"], q
    assert route["mode"] == "rolled_back"
    child = ran_in(call_log)[0]
    assert ran_in(call_log) == [child, child] and child != os.getpid()


def test_a_crash_there_is_seen_at_once_though_a_process_it_forked_keeps_the_socket(us, call_log, tmp_path,
                                                                                   monkeypatch):
    """A child that forked a process holding its socket, then crashed, was
    judged only at the deadline, and the forked process outlived it. The
    serving side watches the child itself (its process descriptor), and
    ends its whole process group."""
    forked = tmp_path / "forked.log"
    monkeypatch.setenv("UST_TEST_FORKED_LOG", str(forked))
    first, second = inputs(1), inputs(1, seed=1)
    us.enable(qualifying("silu_forks_and_crashes_at_2", guard={"deadline_ms": 20000}))
    seen = run(first)
    t0 = time.monotonic()
    seen += run(second)
    took = time.monotonic() - t0
    assert_production_served(seen)
    cand, route = silu_state(us.report())
    assert "SIGSEGV" in cand["qualifying_process"]["refused"], cand["qualifying_process"]
    assert took < 20.0, took  # seen before the deadline, not judged at it
    (kid,) = [int(line) for line in forked.read_text().split()]
    assert wait_for(lambda: gone(kid), timeout=30.0)  # ended, before its own 60 s sleep would have


def test_a_candidate_hanging_there_costs_one_deadline_and_is_refused(us, call_log):
    first, second, rest = inputs(1), inputs(1, seed=1), inputs(5, seed=2)
    # the child's start and first call within the deadline however loaded the machine, the hung call past it
    us.enable(qualifying("silu_hang_at_2", guard={"deadline_ms": 2000}))
    seen = run(first)
    t0 = time.monotonic()
    seen += run(second)
    took = time.monotonic() - t0
    assert 2.0 <= took  # it waited its deadline for the hung call (and the log below: no more calls ran)
    seen += run(rest)
    assert_production_served(seen)
    cand, route = silu_state(us.report())
    assert "did not answer within 2000 ms" in cand["qualifying_process"]["refused"]
    assert route["mode"] == "rolled_back"
    (child,) = set(ran_in(call_log))
    assert child != os.getpid() and len(ran_in(call_log)) == 2
    assert gone(child)


def test_a_wrong_result_there_is_refused_with_its_evidence(us, call_log):
    batch = inputs(5)
    us.enable(qualifying("silu_wrong_at_2", qualify_calls=3))
    assert_production_served(run(batch))
    cand, route = silu_state(us.report())
    q = cand["qualifying_process"]
    assert "failed verification (mismatch)" in q["refused"]
    assert (q["runs"], q["passed"], q["loaded_here"]) == (2, 1, False)
    ev = route["shadow"]["rollback"]
    assert route["mode"] == "rolled_back" and ev["reason"] == "mismatch"
    assert ev["first_mismatch"]["index"] == [0, 0] and ev["mismatches"] == 1
    assert len(ran_in(call_log)) == 2 and os.getpid() not in ran_in(call_log)


def test_a_candidate_writing_its_input_there_is_refused(us):
    batch = inputs(3)
    us.enable(qualifying("silu_cpu_writes_input"))
    assert_production_served(run(batch))
    cand, route = silu_state(us.report())
    assert "wrote input" in cand["qualifying_process"]["refused"]
    assert route["shadow"]["rollback"]["reason"] == "wrote input"


@pytest.mark.parametrize("mode", ["canary", "live"])
def test_a_serving_candidate_serves_only_after_it_qualified_there_and_loaded_here(us, call_log, mode):
    first, later = inputs(2), inputs(3, seed=1)
    extra = {"canary": 0.999} if mode == "canary" else {}
    us.enable(qualifying("silu_ok", mode=mode, sample=0.0, qualify_calls=2, **extra))
    assert_production_served(run(first))  # qualifying: production served them
    child = silu_state(us.report())[0]["qualifying_process"]["pid"]
    assert wait_for(lambda: silu_state(us.report())[0]["qualifying_process"]["loaded_here"])
    for x, before, y, plain in run(later):
        assert torch.equal(x, before)
        torch.testing.assert_close(y, plain, rtol=1e-6, atol=1e-6)
    cand, route = silu_state(us.report())
    served = route["rollout"]["served"]["candidate"]
    assert route["mode"] == mode and served == (3 if mode == "live" else served) and served >= 2
    assert ran_in(call_log) == [child, child] + [os.getpid()] * served


def test_a_crash_while_loading_there_fails_enable_naming_it(us):
    with pytest.raises(understudy.ConfigError, match=r"SIGSEGV.*loading the candidate|loading the candidate.*SIGSEGV"):
        us.enable(qualifying("silu_crash_on_load"))
    assert not us.is_enabled()


def test_a_pin_refused_there_fails_enable_naming_it(us):
    cfg = qualifying("silu_ok")
    cfg["operators"]["silu"]["candidate"]["sha256"] = "0" * 64
    with pytest.raises(understudy.ConfigError, match=r"qualifying in its own process\): .*SHA-256 is [0-9a-f]{64}, but the pin is 0{64}"):
        us.enable(cfg)


def test_the_qualifying_program_missing_is_a_config_error(us, monkeypatch):
    monkeypatch.setenv("UNDERSTUDY_QUALIFIER", "/nonexistent/understudy-qualify")
    with pytest.raises(understudy.ConfigError, match="/nonexistent/understudy-qualify cannot be run"):
        us.enable(qualifying("silu_ok"))


@pytest.mark.parametrize("cand, message", [
    ({"torch_op": "mylib::silu.out", "qualify": "process"}, "name the op without an overload"),
    ({"qualify": "elsewhere"}, "must be \"process\""),
    ({"qualify": "process", "qualify_calls": 0}, "whole number of calls from 1"),
    ({"qualify": "process", "qualify_calls": 2.5}, "whole number of calls from 1"),
    ({"qualify_calls": 3}, "applies only with \"qualify\": \"process\""),
])
def test_qualify_config_errors_name_the_field(us, cand, message):
    entry = cand if "torch_op" in cand else {**understudy.native(candidate_dir() / "libsilu_ok.so"), **cand}
    with pytest.raises(understudy.ConfigError, match="operators.silu.candidate.qualify") as e:
        us.enable({"operators": {"silu": {"mode": "shadow", "candidate": entry}}})
    assert message in str(e.value)


needs_cuda = pytest.mark.gpu


def rms_qualifying(lib, qualify_calls=2, **op):
    from test_shadow import native
    cand = native(lib)
    cand.update(qualify="process", qualify_calls=qualify_calls)
    entry = {"mode": "shadow", "sample": 1.0, "candidate": cand, **op}
    return {"operators": {"rms_norm": entry}, "report": {"interval_s": 0}}


def rms_state(rep):
    from test_shadow import routes
    (op,) = [o for o in rep["operators"] if o["name"] == "rms_norm"]
    return op["candidate"], sorted(routes(rep, "_C::rms_norm"), key=lambda r: r["key"])


def rms_cuda_inputs():
    from test_shadow import rms_inputs
    return rms_inputs("cuda", torch.bfloat16, shapes=((7, 4096), (64, 1024)))


@needs_cuda
def test_a_cuda_candidate_qualifies_in_its_own_process_through_ipc_then_runs_here(us):
    """CUDA calls qualify out of process: the child maps the serving
    process's copies (CUDA IPC) and runs the kernel in a context of its own;
    after qualify_calls passes per route the candidate is loaded here."""
    from test_shadow import run_rms_norm
    inputs = rms_cuda_inputs()
    want = run_rms_norm(inputs, repeat=3)
    base_maps = mapped_candidates()
    us.enable(rms_qualifying("rms_norm_cuda", qualify_calls=2))
    got = run_rms_norm(inputs, repeat=2)  # two passes per route, both in the child
    us.flush()
    cand, rs = rms_state(us.report())
    q = cand["qualifying_process"]
    assert q["refused"] is None and q["pid"] != os.getpid()
    assert (q["runs"], q["passed"], q["routes_qualified"]) == (4, 4, 2), q
    assert [r["shadow"]["process_passed"] for r in rs] == [2, 2]
    assert wait_for(lambda: rms_state(us.report())[0]["qualifying_process"]["loaded_here"])
    assert mapped_candidates() > base_maps
    got += run_rms_norm(inputs, repeat=1)  # here now
    us.flush()
    cand, rs = rms_state(us.report())
    assert cand["qualifying_process"]["runs"] == 4
    for r in rs:
        sh = r["shadow"]
        assert r["device"] == "cuda" and r["mode"] == "shadow"
        assert (sh["calls"], sh["verified"], sh["passed"], sh["failed"]) == (3, 3, 3, 0), sh
        assert sh["candidate_latency_ns"]["count"] == 1  # the call run here is the kernel's time; those there not
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    print(f"\nqualified through CUDA IPC: child {q['pid']}, runs {q['runs']}, passed {q['passed']}, "
          f"routes {q['routes_qualified']}")


@needs_cuda
def test_a_live_cuda_candidate_serves_only_after_it_qualified_there(us):
    """live, sampling nothing: each route's first call qualifies in the child
    (production serves it); once loaded here, the candidate serves."""
    from test_shadow import run_rms_norm
    inputs = rms_cuda_inputs()
    want = run_rms_norm(inputs, repeat=3)
    us.enable(rms_qualifying("rms_norm_cuda", qualify_calls=1, mode="live", sample=0.0))
    got = run_rms_norm(inputs, repeat=1)
    us.flush()
    assert all(torch.equal(w, g) for w, g in zip(want, got))  # production's, bit for bit
    assert wait_for(lambda: rms_state(us.report())[0]["qualifying_process"]["loaded_here"])
    got = run_rms_norm(inputs, repeat=2)
    us.flush()
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1.6e-2, atol=1e-2)
    cand, rs = rms_state(us.report())
    assert cand["qualifying_process"]["runs"] == 2 and cand["qualifying_process"]["routes_qualified"] == 2
    for r in rs:
        assert r["mode"] == "live" and r["rollout"]["served"]["candidate"] == 2, r["rollout"]


@needs_cuda
@pytest.mark.parametrize("lib, reason, evidence", [
    ("rms_norm_cuda_faults", "error", "the candidate's GPU work failed: an illegal memory access"),
    ("rms_norm_cuda_wrong_tail", "mismatch", "failed verification (mismatch)"),
    ("rms_norm_cuda_writes_input", "wrote input", "failed verification (wrote input)"),
])
def test_a_cuda_candidate_failing_there_is_refused_and_this_process_keeps_serving(us, lib, reason, evidence):
    """A kernel that faults loses the child's CUDA context, not this one's;
    a wrong result or a written input there refuses the candidate too. The
    caller's tensors and outputs are production's, bit for bit."""
    from test_shadow import run_rms_norm
    inputs = rms_cuda_inputs()
    before = [(x.clone(), w.clone()) for x, w in inputs]
    want = run_rms_norm(inputs, repeat=3)
    base_maps = mapped_candidates()
    us.enable(rms_qualifying(lib, qualify_calls=2))
    got = run_rms_norm(inputs, repeat=3)
    us.flush()
    cand, rs = rms_state(us.report())
    q = cand["qualifying_process"]
    assert q["refused"] is not None and evidence in q["refused"], q
    assert q["pid"] is None and not q["loaded_here"] and q["runs"] >= 1 and q["passed"] == 0
    # the route whose call failed there rolls back with what it did; a route
    # whose call was sent after the refusal, with the refusal
    back = [r["shadow"]["rollback"] for r in rs if r["mode"] == "rolled_back"]
    assert any(ev["reason"] == reason for ev in back), back
    assert all(ev["reason"] == reason or (ev["reason"] == "error" and evidence in ev["message"]) for ev in back), back
    # this process's CUDA context is whole: the calls were served, and new work runs
    torch.cuda.synchronize()
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    for (x, w), (x0, w0) in zip(inputs, before):
        assert torch.equal(x, x0) and torch.equal(w, w0)
    assert torch.equal(run_rms_norm(inputs, repeat=1)[0], want[0])
    assert float((torch.ones(4, device="cuda") * 2).sum()) == 8.0
    time.sleep(0.3)  # the engine's worker had its chance to load it
    assert mapped_candidates() == base_maps
    print(f"\n{lib}: refused: {q['refused']}")


def test_the_child_outlives_the_thread_that_enabled(us, call_log):
    """The child belongs to the serving process, not to the thread that
    started it: a thread that enables and ends leaves it serving."""
    import threading
    batch = inputs(2)
    t = threading.Thread(target=us.enable, args=(qualifying("silu_ok"),))
    t.start()
    t.join()
    time.sleep(0.3)
    assert_production_served(run(batch))
    cand, route = silu_state(us.report())
    assert cand["qualifying_process"]["refused"] is None
    assert route["shadow"]["process_passed"] == 2 and len(set(ran_in(call_log))) == 1


def test_the_child_ends_when_the_serving_process_dies_while_it_hangs(tmp_path):
    """kill -9 of the serving process while its candidate hangs in the
    child: the child ends by itself (nothing else would reap its hang)."""
    import signal
    import subprocess
    import sys
    lib = candidate_dir() / "libsilu_hang_at_2.so"
    script = tmp_path / "serve.py"
    script.write_text(f"""
import threading, time, torch, torch.nn.functional as F, understudy
cand = understudy.native({str(lib)!r}); cand["qualify"] = "process"
understudy.enable({{"operators": {{"silu": {{"mode": "shadow", "sample": 1.0, "candidate": cand,
                   "guard": {{"deadline_ms": 600000}}}}}}, "report": {{"interval_s": 0}}}})
x = torch.randn(4, 8)
F.silu(x)
(op,) = [o for o in understudy.report()["operators"] if o["name"] == "silu"]
print(op["candidate"]["qualifying_process"]["pid"], flush=True)
threading.Thread(target=F.silu, args=(x,), daemon=True).start()
time.sleep(600)
""")
    calls = tmp_path / "calls.log"
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"), UST_TEST_CALL_LOG=str(calls)))
    try:
        child = int(p.stdout.readline())
        assert wait_for(lambda: len(ran_in(calls)) == 2)  # the second call is inside the hanging candidate now
        assert not gone(child)
        p.send_signal(signal.SIGKILL)
        p.wait(60)
        assert wait_for(lambda: gone(child))
    finally:
        p.kill()
        p.wait()


FAKE_CHILD = """#!{python} -ES
# A qualifying process that lies: it says hello as understudy-qualify does,
# then {behaviour}. (-ES: the standard library alone, and none of the
# sanitized pass's PYTHON* settings, so that it starts in milliseconds.)
import os, socket, struct, sys, time
sock = socket.socket(fileno=3)
name, target = b"fake", b"aten::silu"
behaviour = {behaviour!r}
if behaviour == "no hello":
    time.sleep(60)
if behaviour == "garbage hello":
    sock.sendall(b"not the protocol at all" * 4)
    time.sleep(60)
sock.sendall(struct.pack("<IiIIII", 0x51545355, 0, 2, len(name), len(target), 0) + name + target)
sock.recv(1 << 16)  # a call: its first part; then the rest, sent in several writes, until the serving side waits
sock.settimeout(0.5)
try:
    while sock.recv(1 << 16):
        pass
except (socket.timeout, BlockingIOError):
    pass
sock.settimeout(None)
if behaviour == "huge message":
    sock.sendall(struct.pack("<IiIi", 0x51545355, 0, 1 << 30, 0))
elif behaviour == "wrong magic":
    sock.sendall(struct.pack("<IiIi", 0xdeadbeef, 0, 0, 0))
elif behaviour == "unsent":
    sock.sendall(struct.pack("<IiIi", 0x51545355, -1001, 4, 0) + b"nope")
elif behaviour == "half an answer":
    sock.sendall(struct.pack("<IiIi", 0x51545355, 0, 0, 0) + b"xx")
    sys.exit(0)
time.sleep(60)
"""


# The deadline (guard.deadline_ms) bounds the child's start and hello as well
# as each call: a behaviour the serving side must see through the deadline
# gets a short one; every other a minute, so that no slow start of the fake
# child on a loaded machine is taken for the behaviour under test.
PROMPT_MS = 60000


@pytest.mark.parametrize("behaviour, deadline_ms, evidence", [
    ("no hello", 300, "did not answer within 300 ms while loading the candidate"),
    ("garbage hello", PROMPT_MS, "answered out of protocol while loading the candidate"),
])
def test_a_child_that_does_not_say_hello_fails_enable(us, tmp_path, monkeypatch, behaviour, deadline_ms, evidence):
    fake = tmp_path / "fake-qualify"
    fake.write_text(FAKE_CHILD.format(python=sys.executable, behaviour=behaviour))
    fake.chmod(0o755)
    monkeypatch.setenv("UNDERSTUDY_QUALIFIER", str(fake))
    t0 = time.monotonic()
    with pytest.raises(understudy.ConfigError, match=evidence):
        us.enable(qualifying("silu_ok", guard={"deadline_ms": deadline_ms}))
    assert time.monotonic() - t0 < 60.0  # the deadline ended the wait, before the child's 60 s sleep did
    assert not us.is_enabled()


@pytest.mark.parametrize("behaviour, deadline_ms, evidence", [
    ("huge message", PROMPT_MS, "answered out of protocol"),
    ("wrong magic", PROMPT_MS, "answered out of protocol"),
    ("unsent", PROMPT_MS, "answered out of protocol"),  # "not taken" is for GPU calls only
    ("half an answer", PROMPT_MS, "broke off while the candidate ran; the qualifying process exited with status 0"),
    # the hello within the deadline, the call past it
    ("silence", 3000, "did not answer within 3000 ms while the candidate ran; killed by understudy"),
])
def test_a_child_answering_out_of_protocol_is_refused(us, tmp_path, monkeypatch, behaviour, deadline_ms, evidence):
    """The serving process trusts nothing the child says: lengths are
    bounded and a broken answer loses the child, refusing the candidate;
    the caller gets production's result."""
    fake = tmp_path / "fake-qualify"
    fake.write_text(FAKE_CHILD.format(python=sys.executable, behaviour=behaviour))
    fake.chmod(0o755)
    monkeypatch.setenv("UNDERSTUDY_QUALIFIER", str(fake))
    batch = inputs(3)
    us.enable(qualifying("silu_ok", guard={"deadline_ms": deadline_ms}))
    assert_production_served(run(batch))
    cand, route = silu_state(us.report())
    assert evidence in cand["qualifying_process"]["refused"]
    assert route["mode"] == "rolled_back" and cand["qualifying_process"]["runs"] == 1
