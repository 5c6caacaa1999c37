"""Which timer produced the figures, said in the report, merged and on
/metrics; the kernel tracer's fallback where CUPTI cannot be loaded. The
tracer itself runs on CUDA (test_kernel_timer_cuda.py)."""
import ctypes
import re

import pytest
import torch

from understudy import merge as merge_mod
from conftest import series_labels


def _cupti_loadable():
    try:
        ctypes.CDLL("libcupti.so.13")
        return True
    except OSError:
        return False


def test_report_names_the_timer_and_why_the_tracer_is_off(us):
    us.enable({"operators": {"gemm": "observe"}})
    torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    tm = us.report()["timer"]
    us.disable()
    # a CPU build times with the host clock; a GPU build with events by default
    assert tm["kind"] in ("host", "events"), tm
    if tm["kind"] == "events":
        assert tm["why"] == 'timer.kind is "events"', tm
    assert tm["windows"] == tm["kernels"] == tm["calls_timed"] == 0 and tm["unattributed"] == []
    assert "coverage" not in tm  # no kernel seen: no share


def test_asking_for_cupti_where_it_cannot_load_falls_back_to_events_saying_why(us, tmp_path, capfd):
    us.enable({"operators": {"gemm": "observe"},
               "timer": {"kind": "cupti", "cupti_path": str(tmp_path / "libcupti.so.13")}})
    torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    rep = us.report()
    us.disable()
    tm = rep["timer"]
    if tm["kind"] == "host":
        pytest.skip("a build without a GPU backend has no tracer to ask for")
    if _cupti_loadable():
        # the loader finds it by its soname: the tracer is there, idle (no GPU call)
        assert tm["kind"] == "cupti" and tm["state"] in ("idle", "yielded"), tm
    else:
        assert tm["kind"] == "events" and "libcupti.so.13 could not be loaded" in tm["why"], tm
        assert "CUPTI was asked for and is not available" in capfd.readouterr().err
    (s,) = rep["operators"][0]["shapes"]
    assert s["calls"] == 1 and s["timed"] == 1 and s["kernel_timed"] == 0  # the host clock timed the CPU call


def _report(kernels, attributed, names, kind="cupti", pid=1):
    return {"schema": "understudy.report", "version": 1, "host": "h", "pid": pid, "started_unix_ms": 0,
            "generated_unix_ms": 1, "histogram": {"scheme": "log2-sub16-ns", "unit": "ns", "buckets": 976},
            "operators": [], "hardware": [], "totals": {"untracked": 0, "internal_errors": 0},
            "timer": {"kind": kind, "windows": 2, "window_ns": 200, "yields": 1, "windows_cut": 0,
                      "kernels": 10, "kernel_ns": kernels, "attributed_kernels": 6,
                      "attributed_ns": attributed, "calls_timed": 5, "calls_dropped": 1, "calls_empty": 0,
                      "records_lost": 2,
                      "unattributed": [{"name": n, "ns": ns, "kernels": 1} for n, ns in names]}}


def test_merge_adds_the_timer_sections_and_derives_coverage():
    a = _report(1000, 600, [("rms", 300), ("copy", 100)])
    b = _report(3000, 1500, [("copy", 900), ("rope", 600)], kind="events", pid=2)
    m = merge_mod.merge([a, b])
    tm = m["timer"]
    assert tm["kind"] == "cupti"
    assert (tm["kernel_ns"], tm["attributed_ns"], tm["windows"], tm["records_lost"]) == (4000, 2100, 4, 4)
    assert abs(tm["coverage"] - 2100 / 4000) < 1e-12  # derived by the library from the sums
    assert [(u["name"], u["ns"]) for u in tm["unattributed"]] == [("copy", 1000), ("rope", 600), ("rms", 300)]


def test_kernel_time_by_phase_merges_and_derives_its_coverage():
    """The tracer counts kernel time by the phase of the launching thread
    (its callbacks see every launch); merged by adding, coverage derived per
    phase, on /metrics by phase."""
    from understudy.metrics import metrics_text
    a = _report(1000, 600, [])
    b = _report(3000, 1500, [], pid=2)
    a["timer"]["phases"] = {"prefill": {"kernel_ns": 400, "attributed_ns": 100},
                            "decode": {"kernel_ns": 600, "attributed_ns": 500}}
    b["timer"]["phases"] = {"decode": {"kernel_ns": 3000, "attributed_ns": 1500}}
    m = merge_mod.merge([a, b])
    ph = m["timer"]["phases"]
    assert (ph["prefill"]["kernel_ns"], ph["decode"]["kernel_ns"], ph["decode"]["attributed_ns"]) == (400, 3600, 2000)
    assert abs(ph["decode"]["coverage"] - 2000 / 3600) < 1e-12 and abs(ph["prefill"]["coverage"] - 0.25) < 1e-12
    text = metrics_text(m)
    assert f'understudy_phase_kernel_coverage_ratio{series_labels(phase="prefill")} 0.25' in text


def test_a_live_report_has_the_timer_phases(us):
    us.enable({"operators": {"gemm": "observe"}})
    torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    tm = us.report()["timer"]
    us.disable()
    assert set(tm["phases"]) == {"unknown", "prefill", "decode"}
    assert all(p["kernel_ns"] == 0 and "coverage" not in p for p in tm["phases"].values())


def test_metrics_carry_the_timer_and_coverage():
    from understudy.metrics import metrics_text
    rep = merge_mod.merge([_report(1000, 600, [("rms_kernel", 300)])])
    text = metrics_text(rep)
    assert re.search(r'^understudy_timer_info\{[^}]*kind="cupti"', text, re.M)
    assert f"understudy_kernel_coverage_ratio{series_labels()} 0.6" in text
    assert f'understudy_window_kernel_seconds_total{series_labels(attributed="no")} 4e-07' in text
    assert f'understudy_unattributed_kernel_seconds{series_labels(kernel="rms_kernel")} 3e-07' in text


def test_replayed_calls_count_in_the_device_time_estimate(us):
    """A call captured in a CUDA graph runs again at every replay without a
    dispatcher call; the tracer sees the replays inside its windows only, so
    they stand for elapsed / window time as many in the estimate."""
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}})
    for _ in range(4):
        torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    rep = us.report()
    us.disable()
    (sh,) = rep["operators"][0]["shapes"]
    assert sh["replayed"] == 0 and "replayed_est" not in sh
    assert sh["eager"] == 4 and sh["captured"] == 0
    mean = sh["latency_ns"]["sum"] / sh["latency_ns"]["count"]
    sh["replayed"] = 6
    rep["timer"].update(window_ns=1e8, elapsed_ns=1e9)  # windows covered a tenth of the time
    out = merge_mod.derive(rep)
    (sh,) = out["operators"][0]["shapes"]
    assert sh["replayed_est"] == 60
    assert abs(sh["est_device_time_ns"] - mean * (4 + 60)) <= 1e-6 * sh["est_device_time_ns"]
