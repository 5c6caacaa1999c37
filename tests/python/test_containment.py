"""A candidate that acts against its guard: from inside its own call it asks
understudy to serve it live, reads its report, flushes. Every such call is
refused (UST_ESTATE, nothing changed), in every mode, from Python (a torch-op
candidate) and from C (a native one that finds the loaded library with
dlopen(RTLD_NOLOAD)); a shadow candidate that returns plainly wrong results
never has one served. Ground truth: torch's own silu, computed with
understudy disabled."""
import os

import pytest
import torch
import torch.nn.functional as F

import understudy
from conftest import ROOT, candidate_dir
from test_shadow import candidate_op, native

REFUSED = "inside an intercepted call"


def silu_route(rep):
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    (s,) = op["shapes"]
    return s


def _promoting(answers):
    def run(x):
        for what, act in (("set_mode", lambda: understudy.set_mode("silu", "live")),
                          ("report", understudy.report), ("reload", lambda: understudy.reload({})),
                          ("flush", understudy.flush)):
            try:
                act()
                answers.append(f"{what}: done")
            except understudy.UnderstudyError as e:
                answers.append(f"{what}: {e}")
        return F.silu(x) + 1  # plainly wrong

    return run


def test_a_shadow_candidate_cannot_promote_itself_nor_serve_a_wrong_result(us):
    answers = []
    name = candidate_op("ust_contain::silu_promoting", _promoting(answers), "aten::silu")
    x = torch.randn(4, 64)
    want = F.silu(x)
    us.enable({"operators": {"silu": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": name, "target": "aten::silu"}}}})
    wrong = sum(not torch.equal(F.silu(x), want) for _ in range(10000))
    rep = us.report()
    assert wrong == 0
    assert answers and all(REFUSED in a for a in answers), answers[:8]
    s = silu_route(rep)
    # the candidate ran (its wrong result rolled the route back); nothing it asked for happened
    assert s["rollout"]["mode"] == "rolled_back" and s["rollout"]["served"]["candidate"] == 0
    assert [o["mode"] for o in rep["operators"] if o["name"] == "silu"] == ["shadow"]


@pytest.mark.parametrize("mode", ["shadow", "canary", "live"])
def test_the_control_plane_refuses_a_candidate_in_every_mode(us, mode):
    answers = []

    def run(x):
        try:
            understudy.set_mode("silu", "off")
            answers.append("set_mode: done")
        except understudy.UnderstudyError as e:
            answers.append(str(e))
        return F.silu(x)  # correct: the route keeps running it

    name = candidate_op(f"ust_contain::silu_asking_{mode}", run, "aten::silu")  # its own answers
    # it raises and catches an error every call, many times silu's own time on
    # 256 floats: the shadow budget, not under test here, must not stop it
    op = {"mode": mode, "sample": 1.0, "candidate": {"torch_op": name, "target": "aten::silu"},
          "guard": {"max_slowdown": 1e6}}
    if mode == "canary":
        op["canary"] = 0.5
    us.enable({"operators": {"silu": op}})
    x = torch.randn(8, 32)
    for _ in range(200):
        assert torch.equal(F.silu(x), F.silu(x.clone()))
    rep = us.report()
    assert len(answers) >= 50 and all(REFUSED in a for a in answers), answers[:4]
    assert [o["mode"] for o in rep["operators"] if o["name"] == "silu"] == [mode]


def test_a_native_candidate_cannot_promote_itself_through_the_loaded_library(us, monkeypatch):
    monkeypatch.setenv("UNDERSTUDY_LIB", str(understudy.library_path()))
    x = torch.randn(4, 64)
    want = F.silu(x)
    us.enable({"operators": {"silu": {"mode": "shadow", "sample": 1.0, "candidate": native("silu_promotes_itself")}}})
    wrong = sum(not torch.equal(F.silu(x), want) for _ in range(10000))
    rep = us.report()
    assert wrong == 0
    s = silu_route(rep)
    assert s["rollout"]["mode"] == "rolled_back" and s["rollout"]["served"]["candidate"] == 0
    # its own account of what understudy answered: UST_ESTATE (-6) to both
    assert "set_mode -6, report -6" in s["shadow"]["rollback"]["message"], s["shadow"]["rollback"]
    assert [o["mode"] for o in rep["operators"] if o["name"] == "silu"] == ["shadow"]


def test_the_closure_is_resolved_with_the_search_path_the_loader_took_at_start_up(tmp_path):
    """ld.so reads LD_LIBRARY_PATH once, when the process starts; a host
    that clears it from os.environ before enable() changed what getenv says,
    not where dlopen searches. The candidate needs a system library
    (libanl.so.1) that an impostor of the same name shadows on the start-up
    search path: the check finds the impostor where the loader would, and
    refuses it; its constructor never runs. Ground truth: the impostor's
    mark file, and /proc/self/maps of the host."""
    import subprocess
    import sys
    cdir = candidate_dir()
    if not (cdir / "libsilu_needs_libanl.so").exists():
        pytest.skip("this build found no libanl.so.1 to link the test candidate against")
    impostor_dir = cdir / "anl_impostor"
    marker = tmp_path / "impostor-ran"
    script = tmp_path / "host.py"
    script.write_text(f"""
import os, sys
sys.path.insert(0, {str(ROOT / "python-shim")!r})
import torch, understudy
assert not any("libanl" in line for line in open("/proc/self/maps")), "the host loaded libanl already"
del os.environ["LD_LIBRARY_PATH"]  # the host clears it; its loader keeps the start-up value
cand = understudy.native({str(cdir / "libsilu_needs_libanl.so")!r})
def mapped():
    return sorted({{l.split()[-1] for l in open("/proc/self/maps") if "libanl" in l}})
try:
    understudy.enable({{"operators": {{"silu": {{"mode": "shadow", "candidate": cand}}}}}})
    print("enabled; libanl mapped:", mapped())
    understudy.disable()
except understudy.ConfigError as e:
    print("refused:", e)
    print("libanl mapped:", mapped())
""")
    env = dict(os.environ, LD_LIBRARY_PATH=str(impostor_dir), UST_DEP_MARKER=str(marker))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout
    assert f"which the loader would take from {impostor_dir}/libanl.so.1" in said, said
    assert "refused:" in said and "libanl mapped: []" in said, said
    assert not marker.exists()
    # the same host without LD_LIBRARY_PATH at start-up: the system's library, no pin needed
    env.pop("LD_LIBRARY_PATH")
    script.write_text(script.read_text().replace('del os.environ["LD_LIBRARY_PATH"]', ""))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("enabled; libanl mapped:")]
    assert "libanl.so.1" in line and "anl_impostor" not in line, out.stdout
    assert not marker.exists()


# ---- a candidate that hangs ------------------------------------------------------------

SERVERS = 8
AFTER = 10000  # calls each free thread completes while the hung call is still inside (and the measure)


def _serve(x, want, counts, i, stop, errors):
    try:
        while not stop.is_set():
            if not torch.equal(F.silu(x), want):
                errors.append(f"thread {i}: a wrong result")
            counts[i] += 1
    except Exception as e:  # noqa: BLE001 - said, not swallowed: the test fails on it
        errors.append(f"thread {i}: {e!r}")


def _until(pred, what, timeout=120.0):
    """Wait for pred(): a guard against a wait that never ends, not a timing
    assertion (the order of events is what the test checks)."""
    import time
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, what
        time.sleep(0.005)


def _free_threads_rate(counts, free, n):
    """Calls per second of the free threads while each completes n more."""
    import time
    c0, t0 = [counts[i] for i in free], time.perf_counter()
    _until(lambda: all(counts[i] - c >= n for i, c in zip(free, c0)), f"each free thread completes {n} calls")
    return sum(counts[i] - c for i, c in zip(free, c0)) / (time.perf_counter() - t0)


@pytest.mark.parametrize("mode, hang_from", [("shadow", 1), ("live", 1), ("live", 2)])
def test_a_hung_candidate_holds_its_threads_alone_and_its_route_rolls_back_at_the_deadline(us, mode, hang_from):
    """A candidate that never returns (until the test releases it) held
    every serving thread that reached its route, and the route read
    shadow/live until the call returned. Now a route admits one call of a
    candidate that has returned none in time (one more per call returned in
    time) and none while a call past its deadline is inside; the engine's
    worker rolls it back at the deadline, while the call is still inside.
    live from call 2: the first call qualifies on copies and returns, then
    the candidate serves the caller's arguments and hangs there. Ground
    truth: torch's silu computed before enable, the threads' own counts, and
    the order of events (the rollback is read while the hung call has not
    returned; every free thread completes AFTER calls after it)."""
    import threading
    release, entered, ran, on_callers = threading.Event(), [], [], []
    callers = []  # the serving threads' own input: a call that serves gets it, a call on copies does not

    def hang(x):
        ran.append(threading.current_thread().name)
        if len(ran) >= hang_from:
            on_callers.append(x.data_ptr() in callers)
            entered.append(threading.current_thread().name)
            release.wait(timeout=600)
        return F.silu(x)

    name = candidate_op(f"ust_contain::silu_hangs_{mode}_from_{hang_from}", hang, "aten::silu")
    x = torch.randn(16, 64)
    callers.append(x.data_ptr())
    want = F.silu(x)
    counts, errors, stop = [0] * SERVERS, [], threading.Event()
    threads = [threading.Thread(target=_serve, args=(x, want, counts, i, stop, errors), name=f"server-{i}")
               for i in range(SERVERS)]
    # plain: the same threads through an observed route
    us.enable({"operators": {"silu": "observe"}, "report": {"interval_s": 0}})
    for t in threads:
        t.start()
    plain = _free_threads_rate(counts, range(1, SERVERS), AFTER)
    stop.set()
    for t in threads:
        t.join()
    us.disable()

    us.enable({"operators": {"silu": {"mode": mode, "sample": 1.0, "guard": {"deadline_ms": 200},
                                      "candidate": {"torch_op": name, "target": "aten::silu"}}},
               "report": {"interval_s": 0}})
    counts[:], stop = [0] * SERVERS, threading.Event()
    threads = [threading.Thread(target=_serve, args=(x, want, counts, i, stop, errors), name=f"server-{i}")
               for i in range(SERVERS)]
    try:
        for t in threads:
            t.start()
        _until(lambda: entered, "a call entered the hanging candidate")
        _until(lambda: silu_route(us.report())["mode"] == "rolled_back", "the route rolled back")
        # no call is admitted after it: those admitted before are inside the candidate, each found past
        # its deadline in turn
        _until(lambda: (f := silu_route(us.report())["in_flight"])["inside"] == len(set(entered)) == f["swept"],
               "every call inside found past its deadline")
        hung = silu_route(us.report())
        assert not release.is_set()  # the hung calls have not returned: the rollback came at the deadline
        stuck = sorted(set(entered))
        free = [i for i in range(SERVERS) if f"server-{i}" not in stuck]
        before = {n: counts[int(n.split("-")[1])] for n in stuck}
        rate = _free_threads_rate(counts, free, AFTER)
        # the stuck threads are still inside: none of them completed a call meanwhile
        assert {n: counts[int(n.split("-")[1])] for n in stuck} == before
        assert not release.is_set() and len(entered) == len(stuck)
    finally:
        release.set()
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    # one thread held (two in live from call 2: the first call returned in time, earning a second)
    assert len(stuck) == 1 if hang_from == 1 else 1 <= len(stuck) <= 2, (stuck, ran, hung["in_flight"], hung["shadow"])
    f = hung["in_flight"]
    assert (f["inside"], f["overdue_inside"], f["swept"]) == (len(stuck), len(stuck), len(stuck)), f
    ev = hung["shadow"]["rollback"]
    assert ev["reason"] == "deadline" and "past its deadline of 200 ms" in ev["message"], ev
    # the rollback came at the deadline of a hung call that served the
    # caller's arguments (live, once qualified) or ran on copies (the first
    # call; or a call begun before the first verdict qualified the route):
    # with two inside, whichever began first (not always the first to
    # reach the candidate's body)
    assert ev["while_serving"] in on_callers and len(on_callers) == len(stuck), (ev, on_callers)
    if hang_from == 1:
        assert on_callers[0] is False
    after = silu_route(us.report())
    assert after["mode"] == "rolled_back" and after["shadow"]["overdue"] == len(stuck)
    assert after["in_flight"]["inside"] == 0 and after["in_flight"]["overdue_inside"] == 0
    assert after["rollout"]["served"]["candidate"] == 0  # the hung serving calls returned past the deadline
    print(f"\n{mode} (hangs from call {hang_from}): {len(stuck)} thread(s) held; the {len(free)} free threads "
          f"served {rate:.0f} calls/s while the hung call was inside, {plain:.0f} calls/s plain "
          f"(ratio {rate / plain:.2f}); held: {after['in_flight']['held']}")
