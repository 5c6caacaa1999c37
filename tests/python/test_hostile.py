"""Hostile candidates: what generated kernels get wrong, tried as an attacker
would. The promise under test: shadow cannot hurt the caller, a candidate
that misbehaves is caught before (or when) it serves, production keeps
serving. Ground truth: the same calls without understudy."""
import os

import pytest
import torch
import torch.nn.functional as F

import understudy
from conftest import ROOT, candidate_dir
from test_shadow import candidate_op


def native(name):
    return understudy.native(candidate_dir() / f"lib{name}.so")


def silu_config(mode, candidate, sample=1.0, **extra):
    op = {"mode": mode, "sample": sample, "candidate": candidate, **extra}
    return {"operators": {"silu": op}, "report": {"interval_s": 0}}


def waiting_silu(name, seconds, after=0):
    """A silu torch-op candidate that, once called (past its first `after`
    calls), waits until released (or seconds pass): (its name, the event it
    sets when called, the one that releases it)."""
    import threading
    entered, release, calls = threading.Event(), threading.Event(), [0]

    def run(x):
        calls[0] += 1
        if calls[0] > after:
            entered.set()
            release.wait(seconds)
        return F.silu(x)

    return candidate_op(name, run, "aten::silu"), entered, release


def silu_route(rep):
    (r,) = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "aten::silu"]
    return r


def _writes_input_after(x):
    y = F.silu(x)
    x.add_(1)  # computed from the original values, then writes its input
    return y


def writes_input_op():
    return {"torch_op": candidate_op("ust_hostile::silu_writes_input", _writes_input_after, "aten::silu"),
            "target": "aten::silu"}


@pytest.mark.parametrize("kind", ["native", "torch_op"])
def test_shadow_candidate_writing_its_input_never_touches_the_callers(us, kind):
    """A candidate that writes its input (x[0] = 1234 natively, x.add_(1) as a
    torch op, both after a correct result): in shadow it runs on private
    copies, so the caller's tensors stay bit-equal to a run without
    understudy, every served output is production's, and the route is rolled
    back with "wrote input"."""
    cand = native("silu_cpu_writes_input") if kind == "native" else writes_input_op()
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(4, 8, generator=g) for _ in range(4)]
    plain_in = [x.clone() for x in xs]
    plain_out = [F.silu(x) for x in plain_in]
    us.enable(silu_config("shadow", cand))
    outs = [F.silu(x) for x in xs]
    r = silu_route(us.report())
    for x, p in zip(xs, plain_in):
        assert torch.equal(x, p)
    for y, p in zip(outs, plain_out):
        assert torch.equal(y, p)
    assert r["mode"] == "rolled_back"
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "wrote input" and ev["output"] == "self", ev
    assert "wrote input 'self'" in ev["message"]
    assert r["shadow"]["bytes_copied"] >= 4 * 8 * 4  # the candidate's copy of its input


@pytest.mark.parametrize("mode", ["canary", "live"])
@pytest.mark.parametrize("kind", ["native", "torch_op"])
def test_serving_candidate_writing_its_input_is_rolled_back_before_it_serves(us, mode, kind):
    """Canary and live: before its first served call the candidate qualifies
    on copies; one that writes an input is rolled back there and never runs
    on the caller's tensors."""
    cand = native("silu_cpu_writes_input") if kind == "native" else writes_input_op()
    extra = {"canary": 0.5} if mode == "canary" else {}
    us.enable(silu_config(mode, cand, sample=0.0, **extra))
    g = torch.Generator().manual_seed(8)
    for _ in range(6):
        x = torch.randn(4, 8, generator=g)
        before = x.clone()
        y = F.silu(x)
        assert torch.equal(x, before) and torch.equal(y, F.silu(before))
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["rollback"]["reason"] == "wrote input"
    assert r["rollout"]["served"]["candidate"] == 0 and r["rollout"]["qualified"] is False


_STATE = {"calls": 0}


def _goes_bad(x):
    """Correct while it qualifies, then writes its input on every call."""
    _STATE["calls"] += 1
    y = F.silu(x)
    if _STATE["calls"] > 2:
        x.mul_(0)
    return y


def test_verified_serving_call_that_writes_an_input_is_undone(us):
    """Live, every call verified: a candidate that starts writing its input
    after it qualified is caught on the call; the caller's input is restored
    and production's result is served (host comparisons conclude before the
    call returns)."""
    _STATE["calls"] = 0
    name = candidate_op("ust_hostile::silu_goes_bad", _goes_bad, "aten::silu")
    us.enable(silu_config("live", {"torch_op": name, "target": "aten::silu"}, sample=1.0))
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        x = torch.randn(4, 8, generator=g)
        before = x.clone()
        y = F.silu(x)
        assert torch.equal(x, before) and torch.allclose(y, F.silu(before))
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["rollback"]["reason"] == "wrote input"
    assert r["shadow"]["rollback"]["while_serving"] is True
    assert r["rollout"]["served"]["candidate"] == 1  # call 2; call 3 was caught and undone


def _wrong_structure(kind):
    calls = {"n": 0}

    def cand(x):
        calls["n"] += 1
        y = F.silu(x)
        if calls["n"] <= 2:  # right while it qualifies and on its first served call
            return y
        if kind == "shape":
            return y.reshape(-1)
        if kind == "dtype":
            return y.double()
        if kind == "strides":
            return y.t().contiguous().t()
        return x  # its input itself
    return cand


@pytest.mark.parametrize("kind", ["shape", "dtype", "strides", "input"])
def test_unverified_results_are_checked_for_structure(us, kind):
    """Live with sample 0: unverified results of the wrong shape ([32] for
    [4, 8]), dtype (float64), strides, or the candidate's input tensor itself
    reached the caller. Every served result is now checked against the
    layout production showed for the call's signature; a mismatch serves
    production and rolls the route back."""
    name = candidate_op(f"ust_hostile::silu_{kind}", _wrong_structure(kind), "aten::silu")
    us.enable(silu_config("live", {"torch_op": name, "target": "aten::silu"}, sample=0.0))
    x = torch.randn(4, 8) if kind != "strides" else torch.randn(8, 8)
    outs = []
    for _ in range(5):
        v = x.clone()
        y = F.silu(v)
        outs.append(y)
        assert torch.equal(v, x)
        want = F.silu(x)
        assert y.shape == want.shape and y.dtype == want.dtype and y.stride() == want.stride()
        assert y.data_ptr() != v.data_ptr()
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back", r["rollout"]
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "schema" and ev["while_serving"] is True, ev
    assert r["rollout"]["served"]["candidate"] == 1  # the one right served call; the third was caught
    print(ev["message"])


def test_a_hanging_candidate_wedges_nothing(us, tmp_path):
    """A candidate that never returns on one thread: disable() waited forever
    and, holding the engine lock, blocked report(), set_mode(), is_enabled()
    and metrics scrapes on every other thread. Now the control plane answers
    at once, disable() returns at its deadline saying how many calls are
    still inside, and finishes (the final report) when they return. The
    candidate hangs until the test releases it (30 s at most): each answer
    came while the hung call was still inside, so none waited for it,
    however long the machine took to give it."""
    import threading
    import time
    name, entered, release = waiting_silu("ust_hostile::silu_hangs", 30)
    report = tmp_path / "final.json"
    us.enable({"operators": {"silu": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": name, "target": "aten::silu"}},
                             "gemm": "observe"},
               "report": {"path": str(report), "interval_s": 0}, "disable_timeout_s": 0.5})
    import urllib.request
    server = us.serve_metrics(port=0)
    x = torch.randn(4, 8)
    got = {}
    caller = threading.Thread(target=lambda: got.setdefault("y", F.silu(x)))
    caller.start()
    try:
        assert entered.wait(60)

        def scrape():
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=60) as r:
                assert b"understudy_" in r.read()

        for what, fn in [("report", lambda: us.report(flush_timings=False)), ("is_enabled", us.is_enabled),
                         ("set_mode", lambda: us.set_mode("gemm", "off")), ("metrics scrape", scrape)]:
            fn()
            assert "y" not in got, f"{what} returned only once the hung call had"
        torch.mm(torch.randn(2, 2), torch.randn(2, 2))  # other ops keep working
        t0 = time.perf_counter()
        with pytest.raises(understudy.UnderstudyError, match="1 intercepted call had not returned after 0.5 s"):
            us.disable()
        took = time.perf_counter() - t0
        assert took > 0.4 and "y" not in got, took  # its deadline, not the hung call
        assert not us.is_enabled() and not report.exists()
    finally:
        release.set()
        caller.join(60)
        server.stop()
    assert torch.equal(got["y"], F.silu(x))  # production served the hung call once it returned
    deadline = time.monotonic() + 60  # a guard: the report comes with the call's return
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert report.exists(), "the final report is written once the last call returned"
    us.enable({"operators": {"silu": "observe"}, "report": {"interval_s": 0}})
    F.silu(x)
    assert silu_route(us.report())["calls"] == 1


def test_a_candidate_call_over_its_deadline_is_overdue_and_rolled_back(us):
    """A candidate call that took longer than its deadline is counted once
    and rolls its route back: at its deadline while it runs (the engine's
    worker found it, "deadline") or as it returns ("overdue"), whichever
    comes first; production's result is what the caller gets."""
    import time

    def slow(x):
        time.sleep(0.08)
        return F.silu(x)

    name = candidate_op("ust_hostile::silu_slow", slow, "aten::silu")
    us.enable(silu_config("shadow", {"torch_op": name, "target": "aten::silu"}, guard={"deadline_ms": 20}))
    x = torch.randn(4, 8)
    for _ in range(3):
        assert torch.equal(F.silu(x), F.silu(x.clone()))
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["overdue"] == 1
    ev = r["shadow"]["rollback"]
    assert ev["reason"] in ("deadline", "overdue") and "its deadline of 20 ms" in ev["message"], ev


def test_a_candidate_calling_disable_is_refused_not_deadlocked(us):
    """A candidate that called understudy.disable() waited for its own call
    for ever. Called from inside an intercepted call, enable and disable are
    refused with an error; the candidate's exception is its failure."""
    seen = {}

    def calls_disable(x):
        try:
            understudy.disable()
        except understudy.UnderstudyError as e:
            seen["error"] = str(e)
            raise
        return F.silu(x)

    name = candidate_op("ust_hostile::silu_disables", calls_disable, "aten::silu")
    us.enable(silu_config("shadow", {"torch_op": name, "target": "aten::silu"}))
    x = torch.randn(4, 8)
    assert torch.equal(F.silu(x), F.silu(x.clone()))
    assert "from inside an intercepted call" in seen["error"]
    assert us.is_enabled()
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["rollback"]["reason"] == "raised"


HOSTILE_PATHS = """
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import understudy
d = sys.argv[2]
fifo = os.path.join(d, "fifo")
os.mkfifo(fifo)
sparse = os.path.join(d, "sparse.so")
with open(sparse, "wb") as f:
    f.truncate(6 << 30)
pin = "0" * 64
understudy.enable({"operators": {"silu": "observe"}})  # torch and the library loaded: timings are enable's own
understudy.disable()
for name, cfg in [
    ("candidate fifo", {"operators": {"silu": {"mode": "shadow", "candidate": {"native": fifo, "sha256": pin}}}}),
    ("candidate /dev/zero", {"operators": {"silu": {"mode": "shadow", "candidate": {"native": "/dev/zero", "sha256": pin}}}}),
    ("candidate 6 GiB", {"operators": {"silu": {"mode": "shadow", "candidate": {"native": sparse, "sha256": pin}}}}),
    ("state fifo", {"operators": {"silu": "observe"}, "state": {"path": fifo}}),
]:
    t0, rss0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        understudy.enable(cfg)
        print(name, "accepted")
    except understudy.UnderstudyError as e:
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0  # KiB, at its peak
        print(name, "|", round(time.perf_counter() - t0, 3), "|", grew, "|", e)
    assert not understudy.is_enabled()
"""


def test_paths_that_block_or_exhaust_are_refused_at_once(tmp_path):
    """A FIFO as the candidate or state path blocked enable() for ever;
    /dev/zero or a 6 GiB sparse file as the candidate was read into memory
    before being refused. Paths must be regular files of bounded size,
    opened without blocking: each enable returns (a blocked one would run
    into the child's timeout), with the peak of the process's memory grown
    by less than 64 MiB (not read), and says why."""
    import subprocess
    import sys
    from conftest import ROOT
    script = tmp_path / "paths.py"
    script.write_text(HOSTILE_PATHS)
    out = subprocess.run([sys.executable, str(script), str(ROOT / "python-shim"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    print(out.stdout)
    rows = {line.split(" |")[0]: line.split(" | ") for line in out.stdout.splitlines()}
    assert set(rows) == {"candidate fifo", "candidate /dev/zero", "candidate 6 GiB", "state fifo"}, out.stdout
    for name, (_, took, grew_kib, msg) in rows.items():
        assert int(grew_kib) < 64 << 10, (name, took, grew_kib)
    assert "is not a regular file" in rows["candidate fifo"][3]
    assert "is not a regular file" in rows["candidate /dev/zero"][3]
    assert "more than the" in rows["candidate 6 GiB"][3]
    assert "is not a regular file" in rows["state fifo"][3]


def test_configs_built_to_hurt_are_refused_quickly_and_by_name(us, tmp_path):
    """200,000 operators took 152 s to refuse (a quadratic duplicate check);
    a deeply nested config raised Python's RecursionError; trailing garbage
    was accepted; "silu\\u0000x" read as "silu"; a FIFO as the config path
    blocked. The refusal of 200,000 costs about what writing that config as
    JSON costs (twice as much here, a few times under ASan; 300 times when the
    check was quadratic): the fastest of three of each, measured in the same
    run, so the ratio holds on a slow machine as on a fast one."""
    import json
    import os
    import time

    def fastest(fn):
        took = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            took.append(time.perf_counter() - t0)
        return min(took)

    def refuse():
        with pytest.raises(understudy.ConfigError, match="lists 200000 operators; at most 4096"):
            us.enable(big)

    big = {"operators": {f"op{i}": "observe" for i in range(200_000)}}
    written, refused = fastest(lambda: json.dumps(big)), fastest(refuse)
    print(f"200,000 operators written as JSON in {written:.3f} s, refused in {refused:.3f} s")
    assert refused < 20 * written, (written, refused)
    with pytest.raises(understudy.ConfigError, match="no operator named 'op0'"):
        us.enable({"operators": {f"op{i}": "observe" for i in range(4096)}})
    deep = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(understudy.ConfigError):
        us.enable(deep)
    with pytest.raises(understudy.ConfigError, match="not valid JSON"):
        us.enable('{"operators": {"silu": "observe"}} {"more": 1}')
    with pytest.raises(understudy.ConfigError, match="NUL character"):
        us.enable('{"operators": {"silu\\u0000x": "observe"}}')
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    with pytest.raises(understudy.ConfigError, match="is not a regular file"):
        us.enable(str(fifo))
    # a raw NUL byte: a C string ends there, and what follows was never read
    with pytest.raises(understudy.ConfigError, match="NUL character at offset 34"):
        us.enable('{"operators": {"silu": "observe"}}\x00 {"garbage": ')
    nul_file = tmp_path / "nul.json"
    nul_file.write_bytes(b'{"operators": {"silu": "observe"}}\x00{"garbage": ')
    with pytest.raises(understudy.ConfigError, match="NUL character at offset 34"):
        us.enable(str(nul_file))
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "silu.json").write_bytes((ROOT / "problems" / "silu.json").read_bytes() + b"\x00 trailing")
    with pytest.raises(understudy.ProblemError, match="holds a NUL byte"):
        us.enable({"operators": {"silu": "observe"}}, problems=problems)
    state = tmp_path / "state.json"
    state.write_bytes(b'{"schema": "understudy.state v1", "routes": []}\x00 garbage')
    with pytest.raises(understudy.ConfigError, match="state file: .*holds a NUL byte"):
        us.enable({"operators": {"silu": "observe"}, "state": {"path": str(state)}})
    # routes given modes by key are bounded as the route table is
    keys = {f"aten::silu|cpu|f32|M={i},N=8": "off" for i in range(40)}
    with pytest.raises(understudy.ConfigError, match="40 shape keys under the operators' 'routes', more than 'max_routes' \\(16\\)"):
        us.enable({"max_routes": 16, "operators": {"silu": {"mode": "observe", "routes": keys}}})
    assert not us.is_enabled()


def test_temp_files_a_killed_writer_left_are_cleaned_at_enable(us, tmp_path):
    """kill -9 during report writes left temp files behind (11 files, 9 MB
    after 30 aimed kills) and nothing cleaned them. Those of understudy's own
    naming beside the report and state paths are removed at enable; nothing
    else is touched."""
    report, state = tmp_path / "r.json", tmp_path / "s.json"
    stale = [tmp_path / "r.json.tmp.a1B2c3", tmp_path / "s.json.tmp.XyZ987"]
    keep = [tmp_path / "r.json.tmp.notours", tmp_path / "other.json.tmp.a1B2c3", tmp_path / "r.json"]
    for p in stale + keep:
        p.write_text("{}")
    us.enable({"operators": {"silu": "observe"}, "report": {"path": str(report), "interval_s": 0},
               "state": {"path": str(state)}})
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)


def test_a_slow_candidate_stops_being_shadowed(us):
    """A candidate that sleeps 50 ms made each shadowed call take 50 ms
    instead of 0.03; nothing bounded it. Past its shadow budget (its median
    over production's, guard.max_slowdown) it is not shadowed on that route
    any more, and the report says so."""
    import time
    runs = {"n": 0}

    def slow(x):
        runs["n"] += 1
        time.sleep(0.003)
        return F.silu(x)

    name = candidate_op("ust_hostile::silu_sleeps", slow, "aten::silu")
    x = torch.randn(4, 8)
    want = F.silu(x)
    us.enable(silu_config("shadow", {"torch_op": name, "target": "aten::silu"}, guard={"max_slowdown": 10}))
    for _ in range(30):
        assert torch.equal(F.silu(x), want)
    r = silu_route(us.report())
    sh = r["shadow"]
    assert runs["n"] == 5 and sh["calls"] == 5 and sh["passed"] == 5, (runs, sh)
    assert sh["paused"]["slowdown"] > 10
    assert r["mode"] == "shadow" and r["calls"] == 30
    # the 25 calls after the pause would have been shadowed (sample 1): skipped for the budget
    assert sh["skipped"] == 25 and sh["skipped_by"] == {"no_slot": 0, "error": 0, "budget": 25, "capture": 0}


def test_a_pinned_candidates_dependencies_are_pinned_too(us, tmp_path, monkeypatch):
    """The SHA-256 pin covered the candidate file only: swapping an unpinned
    library it depends on ran the attacker's constructor under a valid pin.
    Every library a native candidate needs (recursively) must be a system
    library, one the process loaded already, or pinned in candidate.deps;
    pinned ones are checked and loaded from their checked bytes first."""
    import shutil
    build = candidate_dir()
    marker = tmp_path / "attacker-ran"
    monkeypatch.setenv("UST_DEP_MARKER", str(marker))
    # the candidate beside its library, as it would be deployed
    d = tmp_path / "deploy"
    d.mkdir()
    shutil.copy(build / "libsilu_with_dep.so", d)
    shutil.copy(build / "libust_dep.so", d)
    cand = understudy.native(d / "libsilu_with_dep.so")
    good = understudy.sha256_of(build / "libust_dep.so")
    with pytest.raises(understudy.ConfigError, match="needs libust_dep.so, which the loader would take from .*"
                                                     "outside the system's trusted directories; pin it"):
        us.enable(silu_config("shadow", cand))
    # pinned: it loads, and its calls pass
    dep = str(d / "libust_dep.so")
    x = torch.randn(4, 8)
    want = F.silu(x)
    us.enable(silu_config("shadow", dict(cand, deps={dep: good})))
    assert torch.equal(F.silu(x), want)
    r = silu_route(us.report())
    assert r["shadow"]["passed"] == 1, r["shadow"]
    us.disable()
    # the attacker swaps the library on disk: refused, its constructor never runs
    shutil.copy(build / "evil" / "libust_dep.so", d / "libust_dep.so")
    with pytest.raises(understudy.ConfigError, match="its dependency libust_dep.so: .*SHA-256 is"):
        us.enable(silu_config("shadow", dict(cand, deps={dep: good})))
    with pytest.raises(understudy.ConfigError, match="needs libust_dep.so"):
        us.enable(silu_config("shadow", cand))
    # a pinned library the loader would not know by the needed name (no
    # DT_SONAME): the loader would search the disk and take the evil twin
    # beside the candidate, under a valid pin
    plain = tmp_path / "pinned" / "libust_dep.so"
    plain.parent.mkdir()
    shutil.copy(build / "nosoname" / "libust_dep.so", plain)
    with pytest.raises(understudy.ConfigError, match="pinned as the dependency libust_dep.so, but its DT_SONAME is "
                                                     "missing: the loader would not take the pinned bytes"):
        us.enable(silu_config("shadow", dict(cand, deps={str(plain): understudy.sha256_of(plain)})))
    assert not marker.exists()


def test_a_symlink_at_a_temp_name_is_never_followed(us, tmp_path):
    """Reports and state were written through PATH.tmp.<pid>.<seq>, opened
    O_CREAT|O_TRUNC without O_EXCL: a symlink planted at that predictable
    name made another file receive the report. Temp names are now random
    and created exclusively."""
    import os
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    report = tmp_path / "r.json"
    for seq in range(4):
        os.symlink(victim, f"{report}.tmp.{os.getpid()}.{seq}")
    us.enable({"operators": {"silu": "observe"}, "report": {"path": str(report), "interval_s": 0}})
    F.silu(torch.randn(4))
    us.write_report()
    us.disable()
    assert victim.read_text() == "precious"
    assert report.exists() and not report.is_symlink()


def test_a_full_disk_keeps_the_previous_report_and_state_file(tmp_path):
    """Writes that run out of room (here the file size limit: EFBIG, as a
    full disk gives ENOSPC) fail with an error naming the file and leave the
    previous report and state file whole, with no temporary file behind;
    production keeps serving."""
    import subprocess
    import sys
    script = tmp_path / "serve.py"
    script.write_text(f"""
import ctypes, os, resource, signal, sys, time, torch, torch.nn.functional as F, understudy
d = {str(tmp_path)!r}
report, state = os.path.join(d, "report.json"), os.path.join(d, "state.json")
said = []
def sink(level, msg, user):  # understudy's log, kept (to wait for a line) and on stderr as before
    said.append(msg.decode())
    print(msg.decode(), file=sys.stderr, flush=True)
sink = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(sink)
understudy._load().ust_set_log(sink, None, 1)  # warnings
def wait_for(what, done):  # however long the worker takes; a minute at most, a guard against never
    t0 = time.monotonic()
    while not done():
        assert time.monotonic() - t0 < 60, what
        time.sleep(0.02)
understudy.enable({{"operators": {{"silu": "observe"}}, "report": {{"path": report, "interval_s": 0}},
                   "state": {{"path": state}}}})
x = torch.randn(4, 8)
F.silu(x)
understudy.write_report()
key = [s["key"] for o in understudy.report()["operators"] for s in o["shapes"] if s["op"] == "aten::silu"][0]
understudy.set_mode(key=key, mode="off")
wait_for("the worker saved the state", lambda: os.path.exists(state))
time.sleep(0.3)
old_report, old_state = open(report, "rb").read(), open(state, "rb").read()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
understudy.set_mode(key=key, mode="observe")
y = F.silu(x)
assert torch.equal(y, x * torch.sigmoid(x)) or torch.allclose(y, x * torch.sigmoid(x))
try:
    understudy.write_report()
    raise SystemExit("a report larger than the limit was written")
except understudy.UnderstudyError as e:
    assert "report.json" in str(e), str(e)
    print("report error:", e)
wait_for("the worker tried to save the state", lambda: any("state file" in m for m in said))
try:
    understudy.disable()  # its final report and state fail too, and it says so
    raise SystemExit("disable did not report the failed writes")
except understudy.UnderstudyError as e:
    assert "File too large" in str(e), str(e)
assert not understudy.is_enabled()
assert open(report, "rb").read() == old_report
assert open(state, "rb").read() == old_state
print("files:", sorted(os.listdir(d)))
""")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "report error:" in p.stdout
    assert "files: ['report.json', 'serve.py', 'state.json']" in p.stdout, p.stdout
    assert "state file" in p.stderr  # the failing state write was said


def test_reports_and_state_files_stay_whole_through_kill_9(tmp_path):
    """A serving process killed with SIGKILL at random moments while it
    writes its report (every 10 ms, a few hundred routes) and its state file
    (a mode change every few calls): after each kill both files parse whole;
    the next enable removes every temporary file the kills left."""
    import json
    import random
    import signal
    import subprocess
    import sys
    import time
    report, state = tmp_path / "r.json", tmp_path / "s.json"
    script = tmp_path / "serve.py"
    script.write_text(f"""
import torch, torch.nn.functional as F, understudy
understudy.enable({{"operators": {{"silu": "observe"}}, "report": {{"path": {str(report)!r}, "interval_s": 0.01}},
                   "state": {{"path": {str(state)!r}}}}})
xs = [torch.randn(1, n) for n in range(1, 300)]
for x in xs:
    F.silu(x)
keys = [s["key"] for o in understudy.report()["operators"] for s in o["shapes"] if s["op"] == "aten::silu"]
understudy.write_report()
understudy.set_mode(key=keys[0], mode="observe")
import os, time
t0 = time.monotonic()
while not os.path.exists({str(state)!r}) and time.monotonic() - t0 < 30:
    time.sleep(0.01)  # the worker saves the state after a change: both files exist before the kills begin
print("ready", flush=True)
i = 0
while True:
    i += 1
    understudy.set_mode(key=keys[i % len(keys)], mode="off" if i % 2 else "observe")
    F.silu(xs[i % len(xs)])
""")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    rng = random.Random(11)
    for _ in range(6):
        p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert p.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.4))
            p.send_signal(signal.SIGKILL)
            p.wait(30)
        finally:
            p.kill()
            p.wait()
        rep = json.loads(report.read_text())
        assert rep["schema"].startswith("understudy") and rep["operators"]
        st = json.loads(state.read_text())
        assert st["schema"] == "understudy.state v1" and st["routes"]
    understudy.enable({"operators": {"silu": "observe"}, "report": {"path": str(report), "interval_s": 0},
                       "state": {"path": str(state)}})
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "s.json", "serve.py"]
    finally:
        understudy.disable()


def test_a_call_finding_every_slot_taken_is_skipped_for_that_reason(us):
    """shadow.max_inflight 1: while one thread's shadow call holds the slot
    (its candidate waits), another thread's call is served by production and
    counted as skipped for want of a slot. (The candidate's first call
    returns: a candidate runs a second call at once only once it returned
    one in time, guard.md.)"""
    import threading
    name, inside, release = waiting_silu("ust_hostile::silu_waits", 60, after=1)
    x = torch.randn(4, 8)
    want = F.silu(x)
    cfg = silu_config("shadow", {"torch_op": name, "target": "aten::silu"})
    cfg["shadow"] = {"max_inflight": 1}
    us.enable(cfg)
    assert torch.equal(F.silu(x), want)
    first = threading.Thread(target=lambda: F.silu(x))
    first.start()
    assert inside.wait(60)
    try:
        for _ in range(3):
            assert torch.equal(F.silu(x), want)  # production, at once
    finally:
        release.set()
        first.join(60)
    sh = silu_route(us.report())["shadow"]
    assert (sh["calls"], sh["passed"]) == (2, 2)
    assert sh["skipped"] == 3 and sh["skipped_by"] == {"no_slot": 3, "error": 0, "budget": 0, "capture": 0}


def test_a_child_forked_while_enabled_passes_calls_through_and_can_enable_afresh(tmp_path):
    """A forked child has none of the engine's threads, and locks other
    threads held stay held in it: disable() there hung for good (the worker
    it joins did not come along). Now the child's calls pass through, its
    disable returns at once, the parent's report file is left to the parent,
    and enable() in the child starts an engine of its own; the parent counts
    on, exactly."""
    import json
    import subprocess
    import sys
    report = tmp_path / "parent.json"
    script = tmp_path / "fork.py"
    script.write_text(f"""
import json, os, threading, time, torch, torch.nn.functional as F, understudy
understudy.enable({{"operators": {{"silu": {{"sample": 1.0}}}}, "report": {{"path": {str(report)!r}, "interval_s": 0.01}}}})
x = torch.randn(4, 8)
want = F.silu(x)
stop = threading.Event()
def busy():  # another thread inside intercepted calls at the fork
    while not stop.is_set():
        F.silu(x)
t = threading.Thread(target=busy)
t.start()
time.sleep(0.2)
pid = os.fork()
if pid == 0:
    out = {{}}
    t0 = time.monotonic()
    out["same"] = all(torch.equal(F.silu(x), want) for _ in range(20))
    out["enabled"] = understudy.is_enabled()
    understudy.disable()
    out["disable_s"] = time.monotonic() - t0
    understudy.enable({{"operators": {{"silu": {{"sample": 1.0}}}}}})
    for _ in range(7):
        F.silu(x)
    out["child_calls"] = [s["calls"] for o in understudy.report()["operators"] for s in o["shapes"]]
    understudy.disable()
    print(json.dumps(out), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
stop.set()
t.join()
before = [s["calls"] for o in understudy.report()["operators"] for s in o["shapes"]][0]
for _ in range(5):
    F.silu(x)
after = [s["calls"] for o in understudy.report()["operators"] for s in o["shapes"]][0]
understudy.disable()
print(json.dumps({{"status": status, "parent_added": after - before}}), flush=True)
""")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    child, parent = (json.loads(line) for line in r.stdout.strip().splitlines())
    # disable returned (without the error of one that ran out its time) before its deadline, 30 s by
    # default: it waited for no call of the threads the fork left behind
    assert child["same"] and child["enabled"] is False and child["disable_s"] < 30
    assert child["child_calls"] == [7]  # a fresh engine of the child's own
    assert parent == {"status": 0, "parent_added": 5}
    rep = json.loads(report.read_text())  # the parent's final report, whole
    assert rep["pid"] != 0 and rep["operators"][0]["shapes"][0]["calls"] >= 5


def _cat_writes_its_first_input(tensors, dim=0):
    out = torch.cat(tensors, dim)
    tensors[0].add_(1000)  # scratch space taken from an input it may only read
    return out


def test_a_candidate_writing_a_tensor_list_it_reads_never_touches_the_callers(us, tmp_path):
    """Only tensor arguments had private copies: a candidate writing an
    element of a Tensor[] argument (cat's) changed the caller's tensor in
    shadow, and nothing was noticed."""
    import json
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "catop.json").write_text(json.dumps({
        "schema_version": 1, "operator": "catop", "description": "cat",
        "bindings": [{"op": "aten::cat", "writes": [], "key": {"D": "dim"},
                      "roofline": {"vars": {"D": "dim"}, "W": "1", "W_dtype": "out", "Q_read": "1", "Q_write": "1"}}]}))
    name = candidate_op("ust_hostile::cat_writes", _cat_writes_its_first_input, "aten::cat")
    x, y = torch.zeros(2, 3), torch.ones(2, 3)
    x0, want = x.clone(), torch.cat([x, y])
    us.enable({"operators": {"catop": {"mode": "shadow", "sample": 1.0,
                                       "candidate": {"torch_op": name, "target": "aten::cat"}}},
               "report": {"interval_s": 0}}, problems=problems)
    out = torch.cat([x, y])
    assert torch.equal(x, x0) and torch.equal(out, want)
    (route,) = [s for o in us.report()["operators"] for s in o["shapes"] if s["op"] == "aten::cat"]
    ev = route["shadow"]["rollback"]
    assert route["mode"] == "rolled_back" and ev["reason"] == "wrote input" and ev["output"] == "tensors", ev
    assert route["shadow"]["bytes_copied"] >= x.nbytes + y.nbytes


_OOM_SWEEP = r"""
import os, sys, torch, torch.nn.functional as F
import understudy
from oom_sweep import fail, sweep
cands = os.environ["UST_CANDIDATES"]
lib = torch.library.Library("_C", "FRAGMENT")
lib.define("rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps) -> ()")

def rms(out, x, w, eps):
    out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)

lib.impl("rms_norm", rms, "CPU")
lib.impl("rms_norm", rms, "CUDA")
mode, dev = sys.argv[1], sys.argv[2]

def entry(lib):
    return {"mode": mode, "sample": 1.0, "candidate": understudy.native(os.path.join(cands, lib))}

ops = {"rms_norm": entry(f"librms_norm_{dev}.so")}
if dev == "cpu":  # a typed op beside the boxed one
    ops["silu"] = entry("libsilu_cpu.so")
understudy.enable({"operators": ops, "report": {"interval_s": 0}})
g = torch.Generator().manual_seed(0)
w = torch.randn(128, generator=g).to(dev)

def silu(n):  # (result, production's result without understudy)
    x = torch.randn(n, 128, generator=g)
    return F.silu(x), x * torch.sigmoid(x)

def rms_norm(n):
    x = torch.randn(n, 128, generator=g).to(dev)
    out, want = torch.empty_like(x), torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, w, 1e-6)
    rms(want, x, w, 1e-6)
    return out, want

def right(k, got_want):
    assert torch.allclose(*got_want, rtol=1e-5, atol=1e-5), "a wrong result"

calls = (("silu", silu), ("rms_norm", rms_norm)) if dev == "cpu" else (("rms_norm", rms_norm),)
for name, call in calls:
    call(4), call(4)  # the key the sweep calls again, its route made
    failed = sweep(name, lambda k: call(4), right)  # a key seen before
    print(f"{name} same: {len(failed)} allocations failed in turn")
    failed = sweep(name, lambda k: call(1 + k), right)  # a key's first call
    print(f"{name} first: {len(failed)} allocations failed in turn")
understudy.flush()
totals = understudy.report()["totals"]
print("internal_errors", totals["internal_errors"], "untracked", totals["untracked"])
for _ in range(3):  # undisturbed again: verified as before
    for name, call in calls:
        call(4)
understudy.flush()
for s in (s for o in understudy.report()["operators"] for s in o["shapes"] if s["key"].endswith("M=4,N=128")):
    print("route", s["op"], s["mode"], s["shadow"]["verified"], s["shadow"]["failed"])
understudy.disable()
"""


def _sweep(tmp_path, script_text, *argv):
    """Runs script_text (on oom_sweep.py) in a process of its own with
    tests/c/fail_new.cpp's library preloaded; its completed process, checked
    to have ended well."""
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("malloc and operator new are AddressSanitizer's in this process, not the sweep's")
    import subprocess
    import sys
    fail_new = understudy.library_path().parent / "libust_fail_new.so"
    if not fail_new.exists():
        pytest.fail(f"{fail_new} was not built; run ./run.sh build")
    script = tmp_path / "sweep.py"
    script.write_text(script_text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python-shim"), str(ROOT / "tests" / "python")]),
               UST_FAIL_NEW=str(fail_new), UST_CANDIDATES=str(candidate_dir()),
               LD_PRELOAD=" ".join(p for p in (os.environ.get("LD_PRELOAD"), str(fail_new)) if p))
    p = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def _counts(p, word):
    """The integers of the line of p's output that starts with word."""
    (line,) = [ln.split() for ln in p.stdout.splitlines() if ln.startswith(word + " ")]
    return [int(v) for v in line if v.isdigit()]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mode", ["shadow", "live"])
def test_calls_whose_allocations_fail_are_served_by_production(tmp_path, mode, device):
    """An out-of-memory sweep of the seam (libuv's kind): in a process of its
    own, the allocations libunderstudy.so's code makes in one call (operator
    new: std::bad_alloc; malloc and kin: NULL) fail, the first, then the
    second, ..., for a boxed op (_C::rms_norm) and on the CPU a typed one
    (silu), on a key seen before and on a key's first call. Every such call
    returns the op's result (to the candidates' tolerance: live, a verified
    candidate serves) without raising; each failure is counted, as
    understudy's internal error or (a route that could not be made) an
    untracked call; and the routes are verified as before once memory is
    back."""
    p = _sweep(tmp_path, _OOM_SWEEP, mode, device)
    lines = p.stdout.splitlines()
    injected = {ln.split(":")[0]: int(ln.split(": ")[1].split()[0]) for ln in lines if "allocations failed" in ln}
    ops = {"_C::rms_norm"} | ({"aten::silu"} if device == "cpu" else set())
    assert set(injected) == {f"{op.split(':')[-1]} {k}" for op in ops for k in ("same", "first")}, p.stdout
    assert all(n > 0 for n in injected.values()), p.stdout  # the sweep reached the call path
    internal, untracked = _counts(p, "internal_errors")
    # each failure accounted for: understudy's error, or a call without a
    # route (its route could not be made; production served it untracked)
    assert sum(injected.values()) == internal + untracked and internal > 0 and untracked > 0, p.stdout
    routes = [ln.split() for ln in lines if ln.startswith("route")]
    assert {r[1] for r in routes} == ops, p.stdout
    for r in routes:
        assert r[2] == mode and int(r[3]) >= 3 and int(r[4]) == 0, p.stdout


_ENABLE_SWEEP = r"""
import os, torch, torch.nn.functional as F
import understudy
from oom_sweep import refused, sweep
cand = understudy.native(os.path.join(os.environ["UST_CANDIDATES"], "libsilu_cpu.so"))
cfg = {"operators": {"silu": {"mode": "shadow", "sample": 1.0, "candidate": cand}, "gemm": "observe"},
       "report": {"interval_s": 0}}
understudy.enable(cfg)  # the interceptors registered, for the life of the process
understudy.disable()
x = torch.randn(8, 16)
want = F.silu(x)

def enabled_whole(k, was_refused):
    assert torch.allclose(F.silu(x), want, rtol=1e-5, atol=1e-5), "a wrong silu after it"
    assert understudy.is_enabled() != was_refused, "enabled after its error" if was_refused else "not enabled"
    if not was_refused:  # the config's operators as it says, the next call shadowed
        understudy.flush()
        ops = {o["name"]: o for o in understudy.report()["operators"]}
        assert ops["silu"]["mode"] == "shadow" and "candidate" in ops["silu"] and ops["gemm"]["mode"] == "observe", \
            f"enabled as {[(o['name'], o['mode']) for o in ops.values()]}"
        assert all(o.get("definition", "").endswith(".json") for o in ops.values()), \
            f"definitions {[o.get('definition') for o in ops.values()]}"
        (r,) = ops["silu"]["shapes"]
        assert r["calls"] == 1 and r["shadow"]["verified"] + r["shadow"]["skipped"] == 1, f"the call after it: {r}"
        understudy.disable()

runs = sweep("enable", lambda k: refused(lambda: understudy.enable(cfg)), enabled_whole)
print("sweep", len(runs), "allocations; errors", sum(runs))
"""


def test_enable_whose_allocations_fail_fails_by_name_or_enables_whole(tmp_path):
    """The same sweep over enable() (config, operator definitions, hardware
    profiles, the engine; the interceptors registered by an enable before):
    each of its allocations fails in turn. Every attempt either raises
    understudy's error saying what ran out of memory, leaving torch as it
    was (silu gives its result), or enables whole: the config's operators
    in their modes with their definitions' files, silu's next call counted
    and shadowed."""
    allocations, errors = _counts(_sweep(tmp_path, _ENABLE_SWEEP), "sweep")
    assert allocations > 500 and errors > 500  # it reached the parsers and the engine


_RELOAD_SWEEP = r"""
import os, torch, torch.nn.functional as F
import understudy
from oom_sweep import refused, sweep
cand = understudy.native(os.path.join(os.environ["UST_CANDIDATES"], "libsilu_cpu.so"))
x = torch.randn(8, 16)
key = "aten::silu|cpu|f32|M=8,N=16"

def config(silu, gemm):
    return {"operators": {"silu": {"mode": silu, "sample": 1.0, "candidate": cand, "routes": {key: "shadow"}},
                          "gemm": gemm}, "report": {"interval_s": 0}}

before, after = config("shadow", "observe"), config("observe", "off")
understudy.enable(before)
F.silu(x)
understudy.set_mode(key=key, mode="off")  # by hand since: a reload leaves it unless it asks for another

def modes():
    ops = {o["name"]: o for o in understudy.report()["operators"]}
    (r,) = [s for s in ops["silu"]["shapes"] if s["key"] == key]
    return ops["silu"]["mode"], ops["gemm"]["mode"], r["mode"]

def whole(k, was_refused):
    got = modes()
    assert got == (("shadow", "observe", "off") if was_refused else ("observe", "off", "off")), \
        f"reload {'refused' if was_refused else 'applied'}, modes {got}"
    understudy.reload(before)
    assert modes() == ("shadow", "observe", "off"), f"reloaded back, modes {modes()}"

runs = sweep("reload", lambda k: refused(lambda: understudy.reload(after)), whole)
print("sweep", len(runs), "allocations; refused", sum(runs))
understudy.disable()
"""


def test_a_reload_whose_allocations_fail_is_refused_whole_or_applied_whole(tmp_path):
    """The sweep over reload(): a config changing both operators' modes and
    naming a route whose mode was since set by hand. Each attempt raises
    understudy's error saying what ran out and changes nothing, or applies
    whole; the route set by hand keeps its mode either way (a reload that
    could not read the running config's routes used to apply it as if every
    route had changed, and one that failed between operators left the first
    changed)."""
    allocations, refused = _counts(_sweep(tmp_path, _RELOAD_SWEEP), "sweep")
    assert allocations > 20 and refused == allocations


_DISABLE_SWEEP = r"""
import json, os, sys, torch, torch.nn.functional as F
import understudy
from oom_sweep import refused, sweep
d = sys.argv[1]
cand = understudy.native(os.path.join(os.environ["UST_CANDIDATES"], "libsilu_cpu.so"))
report, state = os.path.join(d, "report.json"), os.path.join(d, "state.json")
cfg = {"operators": {"silu": {"mode": "shadow", "sample": 1.0, "candidate": cand}, "gemm": "observe"},
       "report": {"interval_s": 0, "path": report}, "state": {"path": state}}
x = torch.randn(8, 16)
understudy.enable(cfg)
F.silu(x)
understudy.set_mode(key="aten::silu|cpu|f32|M=8,N=16", mode="observe")  # a state to save
understudy.disable()  # the files a failing disable must leave whole

def files_whole(k, was_refused):
    for path in (report, state):  # whole, the last written or the one before
        json.load(open(path))
    assert sorted(os.listdir(d)) == ["report.json", "state.json"], f"left {sorted(os.listdir(d))}"

understudy.enable(cfg)
F.silu(x)
for name, read in (("report", understudy.report), ("write_report", understudy.write_report)):
    runs = sweep(name, lambda k: refused(read), files_whole)
    print(name, len(runs), "allocations; errors", sum(runs))
understudy.disable()

def enabled():
    understudy.enable(cfg)
    F.silu(x), torch.mm(x, x.t())
    understudy.set_mode(key="aten::silu|cpu|f32|M=8,N=16", mode="observe")  # a state to save

def disabled(k, was_refused):
    assert not understudy.is_enabled(), "still enabled after disable"
    files_whole(k, was_refused)

runs = sweep("disable", lambda k: refused(understudy.disable), disabled, before=enabled)
print("disable", len(runs), "allocations; errors", sum(runs))
"""


def test_a_disable_whose_allocations_fail_still_disables_and_leaves_files_whole(tmp_path):
    """The sweep over report() and write_report() (each allocation failed
    raises "report: out of memory", the file on disk stays whole), then over
    disable() with a report and a state file configured: each attempt
    disables (raising understudy's error saying what ran out when the final
    report or state could not be written), and both files stay whole JSON
    with no temporary file beside them."""
    (tmp_path / "files").mkdir()
    p = _sweep(tmp_path, _DISABLE_SWEEP, str(tmp_path / "files"))
    for name in ("report", "write_report", "disable"):
        allocations, errors = _counts(p, name)
        assert allocations > 5 and errors == allocations, p.stdout
