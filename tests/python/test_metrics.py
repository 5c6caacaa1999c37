"""Prometheus metrics through prometheus_client: checked by promtool and by a
real Prometheus server scraping two processes, against the tests' own call
counts, a TorchDispatchMode's counts and the reports' raw histograms.

promtool and prometheus are the Debian package `prometheus` (run.sh's set-up
installs it for `test`); a test that needs them fails when they are missing.
They run without the sanitizer's LD_PRELOAD, which the sanitized pytest run
sets for its own process."""
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import understudy
from conftest import ROOT, DispatchCounter, free_port, held_for, need
from test_shadow import native, rms_inputs, run_rms_norm

TESTS = ROOT / "tests" / "python"


# ---- independent readings of the exposition and of the report's histograms -----------

def samples(text):
    """{(sample name, frozenset of labels): value}, parsed by prometheus_client's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"sample {key} appears twice"
            out[key] = s.value
    return out


def pick(smp, name, **labels):
    """The samples of name whose labels include the given ones: {labels dict as frozenset: value}."""
    want = set(labels.items())
    return {lb: v for (n, lb), v in smp.items() if n == name and want <= set(lb)}


def one(smp, name, **labels):
    (v,) = pick(smp, name, **labels).values()
    return v


def fine_lower(i):
    """The report's scheme log2-sub16-ns (README, "Report"): values below 16 ns
    have a bucket each; above, each power of two 2^e is split into 16 buckets
    of width 2^(e-4)."""
    if i < 16:
        return i
    octave, sub = divmod(i - 16, 16)
    e = octave + 4
    return (1 << e) + sub * (1 << (e - 4))


def fine_upper(i):
    return fine_lower(i + 1)


def exposed_bounds_ns(smp, name):
    """The finite `le` bounds of a histogram family, in ns."""
    les = {dict(lb)["le"] for (n, lb) in smp if n == name + "_bucket"}
    return sorted(round(float(le) * 1e9) for le in les if le != "+Inf")


def quantile_range_ns(buckets, q):
    """The q-quantile of a histogram given as {report bucket: count}, as the
    range [lo, hi) of ns values its report bucket holds (rank ceil(q n))."""
    n = sum(buckets.values())
    rank, seen = max(1, math.ceil(q * n)), 0
    for i in sorted(buckets):
        seen += buckets[i]
        if seen >= rank:
            return fine_lower(i), fine_upper(i)
    raise AssertionError("empty histogram")


def promtool_check(text, tmp_path):
    promtool = shutil.which("promtool")
    need(promtool, "promtool is missing: install the Debian package prometheus (./run.sh test's set-up does)")
    f = tmp_path / "exposition.txt"
    f.write_text(text)
    with open(f) as inp:
        r = subprocess.run([promtool, "check", "metrics"], stdin=inp, capture_output=True, text=True,
                           env=clean_env(), timeout=60)
    assert r.returncode == 0, f"promtool check metrics: {r.stdout}{r.stderr}"


def clean_env():
    """The environment for programs that are not ours: without the sanitizer preload."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC"):
        env.pop(k, None)
    return env


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def rms_route(rep, shape_key_part=""):
    (s,) = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "_C::rms_norm" and shape_key_part in s["key"]]
    return s


# ---- the exposition ----------------------------------------------------------------

def test_exposition_passes_promtool_and_carries_the_report(us, tmp_path):
    """After observe and shadow traffic: promtool finds nothing to say; calls,
    shadow outcomes and served arms equal the calls made, silu's the
    TorchDispatchMode's count; the latency histogram holds exactly the
    report's raw buckets, re-bucketed at the exposed bounds."""
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu": {"sample": 1.0}}, "hardware": {"profile": "H200"}})
    counter = DispatchCounter()
    with understudy.phase("decode"):
        run_rms_norm(rms_inputs(shapes=((4, 128),)), repeat=5)
        with counter:
            for n in (3, 5, 7):
                torch.nn.functional.silu(torch.randn(n, 7))
    server = understudy.serve_metrics(port=0, top_keys=10)
    try:
        status, ctype, text = get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    rep = us.report()
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    promtool_check(text, tmp_path)
    smp = samples(text)
    s = rms_route(rep)
    lb = dict(operator="rms_norm", key=s["key"], phase="decode")
    assert one(smp, "understudy_calls_total", **lb) == 5
    assert one(smp, "understudy_shadow_calls_total", outcome="passed", **lb) == 5
    assert one(smp, "understudy_shadow_calls_total", outcome="failed", **lb) == 0
    assert one(smp, "understudy_served_calls_total", arm="production", **lb) == 5
    assert one(smp, "understudy_served_calls_total", arm="candidate", **lb) == 0
    assert one(smp, "understudy_routes", operator="rms_norm", mode="shadow") == 1
    assert one(smp, "understudy_routes", operator="rms_norm", mode="rolled_back") == 0
    # every call timed (sample 1.0): the histogram's count is the calls, its sum their device time
    assert one(smp, "understudy_latency_seconds_count", **lb) == 5
    assert one(smp, "understudy_latency_seconds_sum", **lb) == pytest.approx(s["device_time_ns"] / 1e9, rel=1e-12)
    raw = {int(i): int(n) for i, n in s["latency_ns"]["buckets"]}
    for le_ns in exposed_bounds_ns(smp, "understudy_latency_seconds"):
        want = sum(n for i, n in raw.items() if fine_upper(i) <= le_ns)
        assert sum(n for i, n in raw.items() if fine_lower(i) < le_ns < fine_upper(i)) == 0, \
            f"bound {le_ns} ns splits a report bucket"
        got = one(smp, "understudy_latency_seconds_bucket", le=repr_le(smp, le_ns), **lb)
        assert got == want, f"le={le_ns} ns"
    assert one(smp, "understudy_latency_seconds_bucket", le="+Inf", **lb) == 5
    assert one(smp, "understudy_candidate_latency_seconds_count", **lb) == 5
    silu = sum(pick(smp, "understudy_calls_total", operator="silu").values())
    assert silu == counter.counts["aten::silu"] == 3
    assert one(smp, "understudy_aggregate_roofline_ratio") == rep["totals"]["S_agg"] > 0
    assert one(smp, "understudy_operator_device_time_ratio", operator="silu") > 0
    assert one(smp, "understudy_enabled") == 1


def repr_le(smp, le_ns):
    """The `le` label text of the exposed bound le_ns."""
    for (n, lb) in smp:
        if n == "understudy_latency_seconds_bucket":
            le = dict(lb)["le"]
            if le != "+Inf" and round(float(le) * 1e9) == le_ns:
                return le
    raise AssertionError(le_ns)


def test_no_series_double_counts(us, tmp_path):
    """Calls in three phases: no series is an "all" of others. Each counter
    summed over all its series equals the report's total (and the calls
    made); S_agg over all phases is a family of its own, and the per-phase
    family holds each phase's S_agg once."""
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")}},
               "hardware": {"profile": "H200"}})
    made = 0
    for ph, shapes, repeat in (("decode", ((2, 64),), 4), ("prefill", ((64, 64), (32, 64)), 2), (None, ((8, 64),), 3)):
        if ph:
            with understudy.phase(ph):
                run_rms_norm(rms_inputs(shapes=shapes), repeat=repeat)
        else:
            run_rms_norm(rms_inputs(shapes=shapes), repeat=repeat)
        made += len(shapes) * repeat
    rep = us.report()
    text = understudy.metrics_text(rep)
    promtool_check(text, tmp_path)
    smp = samples(text)
    assert not [k for k in smp if ("phase", "all") in k[1]]
    tot = rep["totals"]
    assert sum(pick(smp, "understudy_calls_total").values()) == tot["calls"] == made
    assert sum(pick(smp, "understudy_latency_seconds_count").values()) == tot["timed"] == made
    assert sum(pick(smp, "understudy_served_calls_total").values()) == made
    assert sum(pick(smp, "understudy_shadow_calls_total").values()) == tot["shadow_calls"] == made
    by_phase = Counter()
    for lb, v in pick(smp, "understudy_calls_total").items():
        by_phase[dict(lb)["phase"]] += v
    assert by_phase == {"decode": 4, "prefill": 4, "unknown": 3}
    (agg,) = pick(smp, "understudy_aggregate_roofline_ratio").items()
    assert agg[0] == frozenset(understudy.metrics.const_labels()) and agg[1] == tot["S_agg"]
    per_phase = {dict(lb)["phase"]: v for lb, v in pick(smp, "understudy_phase_aggregate_roofline_ratio").items()}
    assert per_phase == {ph: x["S_agg"] for ph, x in tot["phases"].items()}
    assert set(per_phase) == {"decode", "prefill", "unknown"}


def test_tallied_calls_have_a_counter_and_the_keys_their_estimates(us, tmp_path):
    """Past the warm-up, calls counted without a key: the operator's
    tallied counter is the report's, and its calls counter holds the keys'
    estimated calls, the report's figures."""
    us.enable({"defaults": {"key_every": 4, "key_after": 10}, "operators": {"gemm": "observe"}})
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(400):
        torch.mm(a, b)
    rep = us.report()
    text = understudy.metrics_text(rep)
    promtool_check(text, tmp_path)
    smp = samples(text)
    (op,) = [o for o in rep["operators"] if o["name"] == "gemm"]
    (s,) = op["shapes"]
    assert op["tallied"] > 0 and s["estimated"] > 0
    assert one(smp, "understudy_tallied_calls_total", operator="gemm") == op["tallied"]
    assert sum(pick(smp, "understudy_calls_total", operator="gemm").values()) == s["calls"]
    assert op["tallied"] + s["calls"] - s["estimated"] == 400


def test_cardinality_bound_folds_the_rest_into_other(us, tmp_path, monkeypatch):
    """Six shape keys, top_keys 2: exactly three key values; the two with the
    most device time (held for 50 ms a call: 150 ms and 300 ms, far above what
    the other four's few unheld calls take even on a stalled machine) have
    their own series, and key="other" holds the other four's calls and latency
    buckets exactly."""
    us.enable({"operators": {"rms_norm": {"sample": 1.0}}})
    inputs = rms_inputs(shapes=((1, 32), (2, 32), (4, 32), (8, 32), (16, 32), (32, 32)))  # M: pow2 buckets
    calls = {}
    for i, (x, w) in enumerate(inputs):
        n = 2 + i
        with held_for(50_000_000 if i in (1, 4) else 0):
            for _ in range(n):
                torch.ops._C.rms_norm(torch.empty_like(x), x, w, 1e-6)
        calls[f"M={x.shape[0]},"] = n
    rep = us.report()
    text = understudy.metrics_text(rep, top_keys=2)
    promtool_check(text, tmp_path)
    smp = samples(text)
    keys = {dict(lb)["key"] for lb in pick(smp, "understudy_calls_total", operator="rms_norm")}
    assert len(keys) == 3 and "other" in keys
    own = {k for k in keys if k != "other"}
    assert {k.split("|")[3].split("N=")[0] for k in own} == {"M=2,", "M=16,"}
    rest = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "_C::rms_norm" and s["key"] not in own]
    assert len(rest) == 4
    other = dict(operator="rms_norm", key="other", phase="unknown")
    want_calls = sum(n for m, n in calls.items() if m not in ("M=2,", "M=16,"))
    assert one(smp, "understudy_calls_total", **other) == want_calls == sum(s["calls"] for s in rest)
    assert one(smp, "understudy_latency_seconds_count", **other) == want_calls
    raw = Counter()
    for s in rest:
        for i, n in s["latency_ns"]["buckets"]:
            raw[int(i)] += int(n)
    for le_ns in exposed_bounds_ns(smp, "understudy_latency_seconds"):
        want = sum(n for i, n in raw.items() if fine_upper(i) <= le_ns)
        assert one(smp, "understudy_latency_seconds_bucket", le=repr_le(smp, le_ns), **other) == want
    # the same through the config's top_keys, in the process's own registry
    us.disable()
    import prometheus_client as prom
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    us.enable({"operators": {"rms_norm": {"sample": 1.0}}, "metrics": {"top_keys": 1}})
    for x, w in inputs:
        torch.ops._C.rms_norm(torch.empty_like(x), x, w, 1e-6)
    smp = samples(prom.generate_latest(prom.REGISTRY).decode())
    assert len({dict(lb)["key"] for lb in pick(smp, "understudy_calls_total", operator="rms_norm")}) == 2
    assert sum(pick(smp, "understudy_calls_total", operator="rms_norm").values()) == 6


def _synthetic(routes, started=1):
    """A report with rms_norm routes {key: (calls, device_time_ns, {report bucket: count})}."""
    shapes = [{"key": k, "op": "_C::rms_norm", "phase": "unknown", "mode": "observe", "calls": c, "timed": c,
               "captured": 0, "est_device_time_ns": t,
               "latency_ns": {"count": sum(b.values()), "sum": t, "buckets": sorted(b.items())}}
              for k, (c, t, b) in routes.items()]
    return {"pid": 1, "started_unix_ms": started, "histogram": {"scheme": "log2-sub16-ns", "buckets": 976},
            "operators": [{"name": "rms_norm", "shapes": shapes, "weight": 1.0}], "totals": {"calls": 0}}


def test_counters_only_grow_when_routes_change_series():
    """top_keys 1 over three scrapes: A leads, then C overtakes it (A folds
    into other, C leaves it), then a new enable starts the routes from zero.
    Every counter only grows, and the increments of all series, those shown
    and those no longer shown, add up to the calls made."""
    reports = [
        _synthetic({"A": (10, 5000, {200: 10}), "B": (3, 300, {100: 3}), "C": (1, 100, {100: 1})}),
        _synthetic({"A": (12, 6000, {200: 12}), "B": (4, 400, {100: 4}), "C": (9, 90000, {100: 1, 300: 8})}),
        _synthetic({"A": (2, 1000, {200: 2}), "C": (1, 10000, {300: 1})}, started=2),
    ]
    import prometheus_client as prom
    current = {}
    registry = prom.CollectorRegistry()
    registry.register(understudy.metrics.UnderstudyCollector(lambda: current["rep"], top_keys=1))
    seen, totals = {}, []
    for rep in reports:
        current["rep"] = rep
        smp = samples(prom.generate_latest(registry).decode())
        calls = pick(smp, "understudy_calls_total")
        for lb, v in calls.items():
            assert v >= seen.get(lb, 0), f"{dict(lb)} went from {seen.get(lb)} to {v}"
        seen.update(calls)
        totals.append(sum(seen.values()))
        shown = {dict(lb)["key"] for lb in calls}
        assert len(shown) == 2
    # what each series counted, against the calls made: 14, then +11, then a new enable's 3
    assert totals == [14, 25, 28]
    assert {dict(lb)["key"]: v for lb, v in seen.items()} == {"A": 10, "other": 4 + 2 + 1 + 2, "C": 9 - 1 + 1}


def test_metrics_escape_labels():
    rep = {"operators": [{"name": 'we"ird\\op', "weight": 0.5, "shapes": [
        {"key": 'k"1\\\n', "op": "x", "calls": 2, "latency_ns": {"count": 0, "sum": 0, "buckets": []}}]}],
        "totals": {}}
    smp = samples(understudy.metrics_text(rep, top_keys=1))
    assert one(smp, "understudy_operator_device_time_ratio", operator='we"ird\\op') == 0.5
    assert one(smp, "understudy_calls_total", operator='we"ird\\op', key='k"1\\\n') == 2


def test_bucket_bounds_are_report_bucket_edges():
    """Every exposed bound is where a report bucket begins, so no report bucket is split."""
    edges = {fine_lower(i) for i in range(976)}
    bounds = understudy.metrics.BUCKET_BOUNDS_NS
    assert all(b in edges for b in bounds) and list(bounds) == sorted(set(bounds))
    assert bounds[0] == 1024 and bounds[-1] == 1 << 30


def test_while_disabled_enabled_is_zero(us):
    server = understudy.serve_metrics(port=0)
    try:
        status, _, text = get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    smp = samples(text)
    assert status == 200 and one(smp, "understudy_enabled") == 0
    assert not pick(smp, "understudy_calls_total")


def test_a_report_that_cannot_be_read_counts_an_error_and_not_enabled_does_not():
    """A scrape whose report fails (understudy enabled, the report out of
    memory) says enabled 0 and counts an error, keeping the message; one
    while understudy is not enabled counts none."""
    import prometheus_client as prom
    from understudy import UnderstudyError
    raised = {}

    def source():
        raise raised["e"]
    collector = understudy.metrics.UnderstudyCollector(source)
    registry = prom.CollectorRegistry()
    registry.register(collector)
    errors = []
    for e in (UnderstudyError(-6, "UST_ESTATE", "report: understudy is not enabled"),
              UnderstudyError(-4, "UST_ENOMEM", "report: out of memory"),
              UnderstudyError(-6, "UST_ESTATE", "report: understudy is not enabled")):
        raised["e"] = e
        smp = samples(prom.generate_latest(registry).decode())
        assert one(smp, "understudy_enabled") == 0
        errors.append(one(smp, "understudy_metrics_errors_total"))
        assert collector.last_error == str(e)
    assert errors == [0, 1, 1]


# ---- the config's "metrics" section --------------------------------------------------

@pytest.mark.parametrize("section, message", [
    ({"port": -1}, "'metrics.port' must be an integer in [0, 65535]"),
    ({"port": 65536}, "'metrics.port' must be an integer in [0, 65535]"),
    ({"port": "9464"}, "'metrics.port' must be an integer in [0, 65535]"),
    ({"port": 9464.5}, "'metrics.port' must be an integer in [0, 65535]"),
    ({"port": 9464, "host": 127001}, "'metrics.host' must be a non-empty string"),
    ({"port": 9464, "host": ""}, "'metrics.host' must be a non-empty string"),
    ({"host": "127.0.0.1"}, "'metrics.host' needs 'metrics.port'"),
    ({"top_keys": -1}, "'metrics.top_keys' must be an integer in [0, 65536]"),
    ({"model_name": ""}, "'metrics.model_name' must be a non-empty string"),
    ({"engine": 3}, "'metrics.engine' must be a non-empty string"),
    ({"port": 9464, "path": "/metrics"},
     "unknown field 'metrics.path' (expected one of: port, host, top_keys, model_name, engine)"),
    ([9464], "'metrics' must be an object {port, host, top_keys, model_name, engine}"),
])
def test_metrics_section_is_checked(us, section, message):
    with pytest.raises(understudy.ConfigError) as e:
        us.enable({"operators": {"silu": "observe"}, "metrics": section})
    assert message in str(e.value)
    assert not us.is_enabled()


def test_endpoint_from_config_on_port_plus_local_rank(us, monkeypatch):
    """metrics.port + LOCAL_RANK, on loopback by default; gone after disable."""
    port = free_port(pair=True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    us.enable({"operators": {"silu": {"sample": 1.0}}, "metrics": {"port": port}})
    for _ in range(4):
        torch.nn.functional.silu(torch.randn(2, 3))
    st = understudy.metrics.status()
    assert st["mode"] == "endpoint" and st["url"] == f"http://127.0.0.1:{port + 1}/metrics" and st["error"] is None
    _, _, text = get(st["url"])
    assert sum(pick(samples(text), "understudy_calls_total", operator="silu").values()) == 4
    with pytest.raises(urllib.error.URLError):  # bound to 127.0.0.1 only: another local address is refused
        get(f"http://127.0.0.2:{port + 1}/metrics")
    us.disable()
    with pytest.raises(urllib.error.URLError):
        get(st["url"])


def test_busy_port_warns_and_understudy_runs_on(us):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.warns(RuntimeWarning, match=f"cannot listen on 127.0.0.1:{port}"):
            us.enable({"operators": {"silu": {"sample": 1.0}}, "metrics": {"port": port}})
        assert us.is_enabled()
        torch.nn.functional.silu(torch.randn(2, 3))
        assert sum(s["calls"] for o in us.report()["operators"] for s in o["shapes"]) == 1
        st = understudy.metrics.status()
        assert st["mode"] is None and "Address already in use" in st["error"]


def test_export_that_cannot_start_warns_and_understudy_runs_on(us, monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.warns(RuntimeWarning, match="metrics could not be started.*is not a directory"):
        us.enable({"operators": {"silu": {"sample": 1.0}}, "metrics": {}})
    torch.nn.functional.silu(torch.randn(2, 3))
    assert sum(s["calls"] for o in us.report()["operators"] for s in o["shapes"]) == 1
    assert understudy.metrics.status()["mode"] is None


def test_registry_mode_in_a_process_serving_prometheus(us, monkeypatch):
    """metrics: {} in a process without PROMETHEUS_MULTIPROC_DIR: the figures
    join prometheus_client's default registry, the one a host's /metrics
    serves, until disable."""
    import prometheus_client as prom
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    us.enable({"operators": {"silu": {"sample": 1.0}}, "metrics": {}})
    for _ in range(3):
        torch.nn.functional.silu(torch.randn(5, 3))
    assert understudy.metrics.status()["mode"] == "registry"
    smp = samples(prom.generate_latest(prom.REGISTRY).decode())
    assert sum(pick(smp, "understudy_calls_total", operator="silu").values()) == 3
    us.disable()
    assert not pick(samples(prom.generate_latest(prom.REGISTRY).decode()), "understudy_calls_total")


# ---- other processes -------------------------------------------------------------------

WORKER = """
import json, os, sys
sys.path.insert(0, {tests!r})
import torch, understudy
from conftest import held_for
from test_shadow import rms_inputs
config = json.loads(sys.argv[1])
calls, hold_ns = int(sys.argv[2]), int(sys.argv[3])
understudy.enable(config)
import prometheus_client
host = prometheus_client.Counter("host_requests", "the host's own metric")
host.inc(7)
(x, w), = rms_inputs(shapes=((4, 128),))
with held_for(hold_ns):
    for _ in range(calls):
        torch.ops._C.rms_norm(torch.empty_like(x), x, w, 1e-6)
rep = understudy.report()
shapes = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "_C::rms_norm"]
print(json.dumps({{"status": understudy.metrics.status(), "shapes": shapes}}), flush=True)
sys.stdin.readline()
understudy.disable()
print("done", flush=True)
"""


def start_worker(tmp_path, name, config, calls, hold_ns, **env):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS)))
    p = subprocess.Popen([sys.executable, str(script), json.dumps(config), str(calls), str(hold_ns)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"), **env))
    line = p.stdout.readline()
    assert line, f"worker {name} ended early ({p.wait(60)})"
    return p, json.loads(line)


def stop_worker(p):
    try:
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def prom_query(base, q):
    with urllib.request.urlopen(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_two_processes_and_merges_quantiles(tmp_path):
    """Two processes serve metrics from the config (port + LOCAL_RANK 0 and
    1); a Prometheus server scrapes both. Its sum of calls is the calls made,
    and histogram_quantile over the summed buckets lands in the exposed
    bucket holding the quantile of the two reports' raw histograms added
    together (one process: 60 calls of at least 30 us, the other 20 of at
    least 600 us, so the merged p90 is neither process's own)."""
    prometheus = shutil.which("prometheus")
    need(prometheus, "prometheus is missing: install the Debian package prometheus (./run.sh test's set-up does)")
    port = free_port(pair=True)
    config = {"operators": {"rms_norm": {"sample": 1.0}}, "metrics": {"port": port, "top_keys": 4}}
    workers = []
    try:
        for rank, (calls, hold) in enumerate(((60, 30_000), (20, 600_000))):
            p, out = start_worker(tmp_path, f"rank{rank}", config, calls, hold, LOCAL_RANK=str(rank))
            workers.append((p, out))
            assert out["status"]["url"] == f"http://127.0.0.1:{port + rank}/metrics", out["status"]
        web = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                       "  - job_name: understudy\n    static_configs:\n"
                       f"      - targets: ['127.0.0.1:{port}', '127.0.0.1:{port + 1}']\n")
        log = open(tmp_path / "prometheus.log", "w")
        server = subprocess.Popen([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                                  stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        try:
            base = f"http://127.0.0.1:{web}"
            deadline, calls = time.monotonic() + 90, None
            while time.monotonic() < deadline:
                assert server.poll() is None, (tmp_path / "prometheus.log").read_text()
                try:
                    up = prom_query(base, 'sum(up{job="understudy"})')
                    calls = prom_query(base, 'sum(understudy_calls_total{operator="rms_norm"})')
                    if up and float(up[0]["value"][1]) == 2 and calls and float(calls[0]["value"][1]) == 80:
                        break
                except (urllib.error.URLError, ConnectionError):
                    pass
                time.sleep(0.5)
            else:
                raise AssertionError(f"Prometheus did not get both targets' 80 calls: {calls}; "
                                     + (tmp_path / "prometheus.log").read_text())
            by_instance = prom_query(base, 'sum by (instance) (understudy_calls_total{operator="rms_norm"})')
            assert {r["metric"]["instance"]: float(r["value"][1]) for r in by_instance} == \
                {f"127.0.0.1:{port}": 60, f"127.0.0.1:{port + 1}": 20}
            les = prom_query(base, 'understudy_latency_seconds_bucket{operator="rms_norm"}')
            bounds = sorted({round(float(r["metric"]["le"]) * 1e9) for r in les if r["metric"]["le"] != "+Inf"})
            merged, own = Counter(), []
            for _, out in workers:
                b = Counter()
                for s in out["shapes"]:
                    for i, n in s["latency_ns"]["buckets"]:
                        b[int(i)] += int(n)
                merged.update(b)
                own.append(b)
            assert sum(merged.values()) == 80
            for q in (0.5, 0.9):
                lo, hi = quantile_range_ns(merged, q)
                k = next(j for j, b in enumerate(bounds) if hi <= b)
                assert k > 0 and bounds[k - 1] <= lo, f"report bucket [{lo}, {hi}) crosses an exposed bound"
                (r,) = prom_query(base, f'histogram_quantile({q}, sum by (le) '
                                        f'(understudy_latency_seconds_bucket{{operator="rms_norm"}}))')
                got = float(r["value"][1])
                assert bounds[k - 1] / 1e9 - 1e-15 <= got <= bounds[k] / 1e9 + 1e-15, \
                    f"p{q * 100:g}: Prometheus {got} s, the reports' {lo}..{hi} ns in [{bounds[k - 1]}, {bounds[k]}] ns"
                if q == 0.9:  # merging mattered: the fast process alone would put p90 elsewhere
                    lo1, _ = quantile_range_ns(own[0], q)
                    assert not bounds[k - 1] <= lo1 < bounds[k]
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
    finally:
        for p, _ in workers:
            stop_worker(p)


def test_multiprocess_mode_appears_in_the_hosts_metrics(tmp_path):
    """A worker with PROMETHEUS_MULTIPROC_DIR set and metrics: {} writes its
    figures beside the host's own multiprocess metrics; the server side
    (a fresh registry with MultiProcessCollector, as vLLM's /metrics in
    multiprocess mode builds it) shows both, promtool accepts it, and the
    worker's last figures are there after its disable."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    mp = tmp_path / "multiproc"
    mp.mkdir()
    config = {"operators": {"rms_norm": {"sample": 1.0}}, "metrics": {}}
    p, out = start_worker(tmp_path, "mp", config, 9, 0, PROMETHEUS_MULTIPROC_DIR=str(mp))

    def scrape():
        reg = CollectorRegistry()
        MultiProcessCollector(reg, path=str(mp))
        return generate_latest(reg).decode()

    try:
        assert out["status"]["mode"] == "multiprocess", out["status"]
        deadline = time.monotonic() + 120  # a guard against a worker that never writes
        while True:  # the worker writes every few seconds
            smp = samples(scrape())
            if sum(pick(smp, "understudy_calls_total", operator="rms_norm").values()) == 9 or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sum(pick(smp, "understudy_calls_total", operator="rms_norm").values()) == 9
        assert one(smp, "host_requests_total") == 7
        assert sum(pick(smp, "understudy_latency_seconds_count", operator="rms_norm").values()) == 9
        (enabled,) = pick(smp, "understudy_enabled").items()
        assert dict(enabled[0]) == {"pid": f"understudy-{p.pid}", "engine": "torch"} and enabled[1] == 1
        promtool_check(scrape(), tmp_path)
    finally:
        stop_worker(p)
    smp = samples(scrape())
    assert sum(pick(smp, "understudy_calls_total", operator="rms_norm").values()) == 9
    assert not pick(smp, "understudy_enabled"), "a process that ended left its gauges"


def test_without_prometheus_client_understudy_works_and_metrics_say_why(tmp_path):
    script = tmp_path / "noprom.py"
    script.write_text(f"""
import sys, warnings
sys.modules["prometheus_client"] = None  # as if it were not installed
import torch, understudy
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    understudy.enable({{"operators": {{"silu": {{"sample": 1.0}}}}, "metrics": {{"port": 0}}}})
msgs = [str(x.message) for x in w]
assert any("pip install prometheus_client" in m for m in msgs), msgs
torch.nn.functional.silu(torch.randn(3, 3))
rep = understudy.report()
assert sum(s["calls"] for o in rep["operators"] for s in o["shapes"]) == 1
for call in (lambda: understudy.serve_metrics(port=0), lambda: understudy.metrics_text(rep),
             lambda: understudy.metrics.UnderstudyCollector()):
    try:
        call()
        raise SystemExit("metrics worked without prometheus_client")
    except understudy.metrics.MetricsUnavailable as e:
        assert "pip install prometheus_client" in str(e), e
understudy.disable()
print("ok")
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_routes_under_graphs_are_counted_by_status(us, tmp_path):
    """understudy_routes_graph counts each operator's shape keys by their
    graph.status: none on the CPU (no graph ran a route); from a report
    whose routes stand gated, observe-only and observed, exactly those
    counts per operator (observe-only exposed as observe_only), and no
    series for an operator none of whose routes a graph ran."""
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu": {"sample": 1.0}}})
    run_rms_norm(rms_inputs(shapes=((4, 128), (8, 128), (2, 64))), repeat=2)
    torch.nn.functional.silu(torch.randn(3, 7))
    rep = us.report()
    assert not pick(samples(understudy.metrics_text(rep)), "understudy_routes_graph")
    (rms,) = [o for o in rep["operators"] if o["name"] == "rms_norm"]
    assert len(rms["shapes"]) == 3
    for s, st in zip(rms["shapes"], ("gated", "observe-only", "observe-only")):
        s["graph"]["status"] = st
    text = understudy.metrics_text(rep)
    promtool_check(text, tmp_path)
    smp = samples(text)
    got = pick(smp, "understudy_routes_graph", operator="rms_norm")
    assert {dict(lb)["status"]: v for lb, v in got.items()} == {"gated": 1, "observed": 0, "observe_only": 2}
    assert not pick(smp, "understudy_routes_graph", operator="silu")
