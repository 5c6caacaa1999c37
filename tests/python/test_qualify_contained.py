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
