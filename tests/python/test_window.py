"""The report's recent window (report.window_s): S, weights and latency over
the calls since the older of the last two window boundaries, beside the
cumulative figures, so that a regression shows within a window instead of
being damped by everything since enable. Ground truth: the calls the test
makes between boundaries it waits for, and the time each call is held. The
tests wait for the boundaries themselves (the window's start moving past
their calls), not for a time after which they should have come."""
import math
import time

import pytest

import understudy
from conftest import HIST_REL, DispatchCounter, clocked, held_for
from test_roofline import rms_floor_ns
from test_shadow import rms_inputs, run_rms_norm

WINDOW_S = 0.4


def unix_ms_now():
    """The wall clock in ms, as the report's since_unix_ms reads it, rounded
    up: a boundary later than this came after every call made before."""
    return math.ceil(time.time() * 1000)


def wait_for_a_window_after(us, after_ms):
    """Until the window starts after after_ms (see unix_ms_now) and spans
    WINDOW_S or more: the worker rotated past every call made before (every
    WINDOW_S; the window starts at the older of its last two boundaries, at
    the only one after the first), however long it took to be scheduled. A
    minute at most: a guard against a worker that never rotates, not a
    measure of one."""
    deadline = time.monotonic() + 60
    while True:
        win = us.report()["window"]
        if win["since_unix_ms"] > after_ms and win["span_s"] >= WINDOW_S:
            return
        assert time.monotonic() < deadline, f"the window is still {win}, not one after {after_ms}"
        time.sleep(0.05)


def _shape(rep_part, op):
    (o,) = [o for o in rep_part["operators"] if o["name"] == op]
    return o


def test_a_regression_shows_in_the_window_not_damped_by_the_totals(us):
    us.enable({"operators": {"rms_norm": {"sample": 1.0}}, "hardware": {"profile": "H200"},
               "report": {"window_s": WINDOW_S, "interval_s": 0}})
    (x, w), = rms_inputs(shapes=((16, 512),))
    with held_for(200_000):
        fast_hi = [clocked(run_rms_norm, [(x, w)], 1) for _ in range(60)]
    after_ms = unix_ms_now()
    wait_for_a_window_after(us, after_ms)
    with DispatchCounter() as counter, held_for(4_000_000):
        slow_hi = [clocked(run_rms_norm, [(x, w)], 1) for _ in range(10)]
    rep = us.report()
    us.disable()
    assert counter.counts["_C::rms_norm"] == 10
    win, tot = rep["window"], rep["totals"]
    assert win["window_s"] == WINDOW_S and win["span_s"] >= WINDOW_S and win["since_unix_ms"] > after_ms
    wop, op = _shape(win, "rms_norm"), _shape(rep, "rms_norm")
    (ws,), (s,) = wop["shapes"], op["shapes"]
    assert (ws["calls"], ws["timed"]) == (10, 10) and (s["calls"], s["timed"]) == (70, 70)
    # the window's median is a held 4 ms call; the totals' is still a fast
    # one: at most the median of what the test's clock measured around the 70
    # calls (each call's timed figure lies below that), a fast call's
    med_hi = sorted(fast_hi + slow_hi)[35]
    assert 4e6 / (1 + HIST_REL) <= ws["p50_ns"] and s["latency_ns"]["p50"] <= med_hi * (1 + HIST_REL)
    tsol = rms_floor_ns(x, w)
    assert ws["S"] <= tsol / 4e6 * (1 + HIST_REL)
    # damped: the 60 fast calls still dominate the totals' S
    assert op["roofline"]["S"] >= tsol / (med_hi * (1 + HIST_REL)) * (1 - 1e-9)
    assert win["totals"]["calls"] == 10 and tot["calls"] == 70
    assert win["totals"]["S_agg"] == pytest.approx(ws["S"])


def test_a_key_without_calls_in_the_window_is_left_out(us):
    us.enable({"operators": {"rms_norm": {"sample": 1.0}}, "report": {"window_s": WINDOW_S, "interval_s": 0}})
    run_rms_norm(rms_inputs(shapes=((4, 64),)), repeat=3)
    early_rep = us.report()
    early = early_rep["window"]
    wait_for_a_window_after(us, unix_ms_now())
    run_rms_norm(rms_inputs(shapes=((8, 64),)), repeat=2)
    rep = us.report()
    us.disable()
    # before the first boundary the window runs from enable (checked where
    # the early report was made before one could have come)
    if early_rep["generated_unix_ms"] - rep["started_unix_ms"] < WINDOW_S * 1000:
        assert early["since_unix_ms"] == rep["started_unix_ms"]
        assert [s["calls"] for s in _shape(early, "rms_norm")["shapes"]] == [3]
    (ws,) = _shape(rep["window"], "rms_norm")["shapes"]
    assert ws["key"].endswith("M=8,N=64") and ws["calls"] == 2
    assert len(_shape(rep, "rms_norm")["shapes"]) == 2  # both keys in the totals
    assert ws["S"] is None  # no profile for the CPU here: unscored, not 0


def test_window_off_and_bad_values(us):
    us.enable({"operators": {"rms_norm": "observe"}, "report": {"window_s": 0}})
    assert "window" not in us.report()
    us.disable()
    for bad in (-1, "60", 1e9):
        with pytest.raises(understudy.ConfigError, match="report.window_s"):
            us.enable({"operators": {"rms_norm": "observe"}, "report": {"window_s": bad}})


def test_window_figures_are_exposed_as_metrics(us):
    pytest.importorskip("prometheus_client")
    from test_metrics import one, samples
    us.enable({"operators": {"rms_norm": {"sample": 1.0}}, "hardware": {"profile": "H200"},
               "report": {"window_s": WINDOW_S, "interval_s": 0}})
    run_rms_norm(rms_inputs(shapes=((16, 512),)), repeat=5)
    rep = us.report()
    us.disable()
    smp = samples(understudy.metrics_text(rep))
    win = rep["window"]
    assert one(smp, "understudy_operator_roofline_ratio_window", operator="rms_norm") == \
        _shape(win, "rms_norm")["S"] > 0
    assert one(smp, "understudy_aggregate_roofline_ratio_window") == win["totals"]["S_agg"]
    assert one(smp, "understudy_window_seconds") == win["span_s"]
