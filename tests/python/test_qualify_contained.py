"""The qualifying process (candidate.qualify: "process") as a neighbour that
cannot stall, flood or outlive the serving process: a child that hangs
holds the one call it runs, never a serving thread's other calls nor the
control plane; its stdio goes nowhere; whatever it forks ends with it; it
runs under memory and CPU limits, and the report says what it used.
Ground truth: the order of events (a call or a report that returns while
the hung call has not), /proc, the serving process's own stdout, and the
calls' results against torch's."""
import os
import signal
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import understudy
from test_qualify_process import (assert_production_served, call_log, gone, inputs, qualifying, ran_in, run,  # noqa: F401
                                  signals_reach_the_child, silu_state, wait_for)


def candidate(rep):
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    return op["candidate"]


def silu_routes(rep):
    return [s for o in rep["operators"] if o["name"] == "silu" for s in o["shapes"]]


def test_a_hanging_child_stalls_neither_another_call_nor_the_report(us, call_log):  # noqa: F811
    """The runner was one mutex held for a whole call, and the report read
    the child's pid under it: while the child hung, report(), a scrape and
    another thread's call each waited the deadline out. Now a call that
    finds the child busy is production's (counted), and what the report
    reads is atomics: each returns while the hung call is still inside."""
    first, hung, same, other = inputs(1), inputs(1, seed=1), inputs(1, seed=2), inputs(1, seed=3, shape=(2, 16))
    us.enable(qualifying("silu_hang_at_2", qualify_calls=5, guard={"deadline_ms": 600000}))
    assert_production_served(run(first))
    child = silu_state(us.report())[0]["qualifying_process"]["pid"]
    inside, seen = threading.Event(), []
    a = threading.Thread(target=lambda: seen.extend(run(hung)) or inside.set(), name="hung-call")
    a.start()
    try:
        assert wait_for(lambda: len(ran_in(call_log)) == 2)  # the child runs the second call, for good
        t0 = time.perf_counter()
        rep = us.report()
        t_report = time.perf_counter() - t0
        assert not inside.is_set() and a.is_alive()
        others = {}

        def another(name, batch):
            t = time.perf_counter()
            others[name] = (run(batch), time.perf_counter() - t)

        for name, batch in (("same route", same), ("another route", other)):
            b = threading.Thread(target=another, args=(name, batch))
            b.start()
            b.join(120)  # a guard, not a timing: the call returns while the hung one is inside, or the test fails
            assert not b.is_alive(), f"{name}: the call waited for the hung one"
        assert not inside.is_set() and a.is_alive() and len(ran_in(call_log)) == 2
        q = candidate(us.report())["qualifying_process"]
        assert q["pid"] == child and q["refused"] is None and q["runs"] == 2
        assert q["busy"] >= 1  # the other route's call found the child busy
    finally:
        os.kill(child, signal.SIGKILL)  # the hung call ends now, not at its deadline
        a.join(120)
    assert inside.is_set()
    for name in others:
        assert_production_served(others[name][0])
    assert_production_served(seen)
    rep_after = us.report()
    assert "SIGKILL" in candidate(rep_after)["qualifying_process"]["refused"]
    assert "rolled_back" in [r["mode"] for r in silu_routes(rep_after)]
    assert rep["operators"]  # the report taken while the child hung is whole
    print(f"\nwhile the child hung: report() {t_report * 1e3:.1f} ms, " +
          ", ".join(f"a call on {n} {t * 1e3:.1f} ms" for n, (_, t) in others.items()))


def test_what_the_child_forks_cannot_leave_its_group_and_ends_with_it(us, call_log, tmp_path, monkeypatch):  # noqa: F811
    """A grandchild that called setsid() left the child's process group,
    which the serving process ends, and outlived the server by minutes. The
    child's filter refuses setsid and setpgid (EPERM), to it and to all it
    forks: the grandchild stays in the group and is ended with the child.
    Ground truth: what the grandchild itself saw, and /proc."""
    forked = tmp_path / "forked.log"
    monkeypatch.setenv("UST_TEST_FORKED_LOG", str(forked))
    batch = inputs(1)
    us.enable(qualifying("silu_forks_a_new_session_at_1", qualify_calls=5))
    assert_production_served(run(batch))
    assert wait_for(lambda: forked.exists() and forked.read_text().endswith("\n"))
    kid, setsid_result, err = (int(v) for v in forked.read_text().split())
    assert (setsid_result, err) == (-1, 1), "setsid was not refused with EPERM"  # and setpgid neither left it
    child = candidate(us.report())["qualifying_process"]["pid"]
    assert os.getpgid(kid) == child and not gone(kid)
    us.disable()  # the child is ended
    assert wait_for(lambda: gone(kid), timeout=30.0)  # before its own minute's sleep would have


def test_what_the_child_prints_never_reaches_the_serving_process(tmp_path):
    """The child inherited the server's stdio: 50 MB a call went into the
    server's stdout (and with a pipe nobody read, the call blocked until its
    deadline). Its stdio is /dev/null: the candidate qualifies, the server's
    stdout holds only what the server printed."""
    import json
    import subprocess
    import sys
    from conftest import ROOT, candidate_dir
    script = tmp_path / "server.py"
    script.write_text(f"""
import json, sys, time
sys.path.insert(0, {str(ROOT / "python-shim")!r})
sys.path.insert(0, {str(ROOT / "tests" / "python")!r})
import torch, torch.nn.functional as F, understudy
from test_qualify_process import qualifying
x = torch.randn(4, 8)
want = F.silu(x)
understudy.enable(qualifying("silu_floods_stdout", qualify_calls=3, guard={{"deadline_ms": 120000}}))
for _ in range(3):
    assert torch.equal(F.silu(x), want)  # production's
t0 = time.monotonic()
while time.monotonic() - t0 < 60:  # the worker loads it once a route qualified
    (op,) = [o for o in understudy.report()["operators"] if o["name"] == "silu"]
    if op["candidate"]["qualifying_process"]["loaded_here"]:
        break
    time.sleep(0.02)
print("SERVER:" + json.dumps(op["candidate"]["qualifying_process"]))
understudy.disable()
""")
    env = dict(os.environ, UNDERSTUDY_CANDIDATES=str(candidate_dir()))
    out = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=600)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    assert b"UST_TEST_STDOUT_MARKER" not in out.stdout and b"xxxx" not in out.stdout
    (line,) = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("SERVER:")]
    q = json.loads(line[len("SERVER:"):])
    assert q["refused"] is None and q["runs"] == 3 and q["passed"] == 3 and q["loaded_here"], q
    print(f"\nthe server's stdout: {len(out.stdout)} bytes for 3 calls that each wrote 50 MiB")


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under AddressSanitizer the child's allocator (redzones, quarantine, its own mappings) "
                           "meets the limit in its own code and ends with its own status; the plain pass runs it")
def test_a_candidate_leaking_memory_is_refused_at_its_memory_limit(us, call_log):  # noqa: F811
    """A candidate leaking 100 MB a call qualified, and was loaded: the
    server grew 221 -> 725 MB in 8 calls. The child runs under a memory
    limit (candidate.qualify_memory_mb, RLIMIT_DATA beyond its own); the
    allocation past it fails, the candidate crashes writing to it, and it is
    refused naming the limit, with the child's peak RSS and CPU time."""
    batch = inputs(5)
    # a server far larger than the child: the child's figures are its own,
    # not the image it was forked from (Linux keeps that peak over exec)
    ballast = torch.ones(128 << 20)  # 512 MiB, resident
    cfg = qualifying("silu_leaks_100mb", qualify_calls=5)
    cfg["operators"]["silu"]["candidate"]["qualify_memory_mb"] = 256
    us.enable(cfg)
    assert_production_served(run(batch))
    rep = us.report()
    q = candidate(rep)["qualifying_process"]
    assert q["refused"] is not None and "memory limit" in q["refused"], q
    assert "candidate.qualify_memory_mb: 256 MiB" in q["refused"] and "peak RSS" in q["refused"], q
    assert q["memory_limit_mb"] == 256 and q["cpu_limit_s"] == 600, q
    # two calls of 100 MiB fit, the third does not: the child held at least 200 MiB, never much past 256 beyond its own
    assert 200 <= q["peak_rss_mb"] < 256 + 200, q
    assert len(ran_in(call_log)) == 3 and not q["loaded_here"]
    (route,) = silu_routes(rep)
    assert route["mode"] == "rolled_back" and "memory limit" in route["shadow"]["rollback"]["message"]
    print(f"\nrefused: {q['refused']}")
    del ballast


def test_the_childs_limits_are_config_fields_checked_by_name(us):
    from test_qualify_process import candidate_dir
    for field, value, message in (("qualify_memory_mb", 8, "whole number of MiB from 16"),
                                  ("qualify_cpu_s", 0.5, "whole number of seconds from 1")):
        cfg = qualifying("silu_ok")
        cfg["operators"]["silu"]["candidate"][field] = value
        with pytest.raises(understudy.ConfigError, match=f"operators.silu.candidate.{field}' must be a {message}"):
            us.enable(cfg)
        here = {**understudy.native(candidate_dir() / "libsilu_ok.so"), field: 64}
        with pytest.raises(understudy.ConfigError, match=f"{field}' applies only with \"qualify\": \"process\""):
            us.enable({"operators": {"silu": {"mode": "shadow", "candidate": here}}})
