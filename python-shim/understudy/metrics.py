"""understudy's figures as Prometheus metrics, through prometheus_client.

A custom collector reads the library's report at each scrape and turns it into
metric families; three ways expose it:

    understudy.serve_metrics(port=9464)          # an endpoint of its own (loopback by default)
    understudy.metrics.UnderstudyCollector()     # register it in a registry the process serves
    understudy.metrics.export_multiprocess()     # into $PROMETHEUS_MULTIPROC_DIR, for a server
                                                 # in another process (vLLM's /metrics)

or the config's "metrics" section, acted on at enable (README, "Prometheus
metrics"). Names are in base units; latency is a histogram whose buckets are
sums of the report's log buckets, so Prometheus merges processes exactly; per
operator only the `top_keys` shape keys with the most device time get series
of their own, the others are added into key="other"; no series repeats what
other series of its family add up to. A collector keeps each counter as the
sum of what its routes added between scrapes, so counters only grow for the
collector's life, whichever series a route is counted in (also across a
disable and enable).

prometheus_client is needed for metrics only: without it the rest of
understudy works and these functions raise MetricsUnavailable.
"""
from __future__ import annotations

import atexit
import bisect
import json
import os
import threading
import warnings
from collections import Counter
from typing import Callable, Optional

from . import UnderstudyError

DEFAULT_TOP_KEYS = 10
MULTIPROCESS_INTERVAL_S = 5.0
DEFAULT_HOST = "127.0.0.1"

# The report's histogram scheme (README, "Report"): 16 buckets an octave, in ns.
_SCHEME, _FINE_BUCKETS = "log2-sub16-ns", 976


def _fine_lower(i: int) -> int:
    """The smallest ns value of the report's bucket i."""
    if i < 16:
        return i
    e, sub = (i - 16) // 16 + 4, (i - 16) % 16
    return (16 + sub) << (e - 4)


# The exposed latency buckets' upper bounds in ns: 2^e and 1.5 * 2^e from
# 1.024 us to 1.07 s (two an octave). Each is the lower edge of a report
# bucket, so every report bucket lies inside one exposed bucket and the counts
# carry over exactly; a quantile read from them is known within its bucket.
BUCKET_BOUNDS_NS = tuple(sorted([1 << e for e in range(10, 31)] + [3 << (e - 1) for e in range(10, 30)]))
_FINE_TO_COARSE = [bisect.bisect_right(BUCKET_BOUNDS_NS, _fine_lower(i)) for i in range(_FINE_BUCKETS)]
_MODES = ("off", "observe", "shadow", "canary", "live", "rolled_back")
_GRAPH_STATUSES = ("gated", "observed", "observe_only")  # a shape's graph.status (null: no graph ran it)


class MetricsUnavailable(UnderstudyError, ImportError):
    """Metrics were asked for and prometheus_client cannot be imported."""


def _prom():
    try:
        import prometheus_client
        from prometheus_client import metrics_core  # noqa: F401
    except ImportError as e:
        raise MetricsUnavailable(-7, "UST_ENOTFOUND",
                                 f"understudy's Prometheus metrics need the prometheus_client package, which cannot "
                                 f"be imported ({e}): pip install prometheus_client") from None
    return prometheus_client


# ---- the figures of one route ------------------------------------------------------

def _add_hist(f: dict, fam: str, h: Optional[dict]) -> None:
    """A report histogram as additive entries: counts per exposed bucket and the sum (ns)."""
    f[(fam, "sum")] = float((h or {}).get("sum", 0))
    f.setdefault((fam, 0), 0.0)
    for idx, n in (h or {}).get("buckets", ()):
        j = _FINE_TO_COARSE[int(idx)] if 0 <= int(idx) < _FINE_BUCKETS else len(BUCKET_BOUNDS_NS)
        f[(fam, j)] = f.get((fam, j), 0.0) + float(n)


def _route_figures(s: dict) -> dict:
    """The additive figures of a shape key in the report: {(family, part): value}.
    part names the series within a family (an outcome, an arm, a bucket, the sum)."""
    f = {("calls", ""): float(s.get("calls", 0)), ("captured_calls", ""): float(s.get("captured", 0)),
         ("timings_dropped", ""): float(s.get("timing_dropped", 0))}
    _add_hist(f, "latency", s.get("latency_ns"))
    rl = s.get("roofline")
    if rl is not None:
        f[("roofline_calls", "")] = float(rl.get("calls", 0))
        f[("roofline_unscored", "")] = float(rl.get("unscored", 0))
        f[("roofline_floor", "")] = float(rl.get("tsol_ns_sum", 0))
        f[("roofline_time", "")] = float(rl.get("time_ns_sum", 0))
        if "candidate_calls" in rl and "shadow" in s:
            f[("cand_roofline_calls", "")] = float(rl.get("candidate_calls", 0))
            f[("cand_roofline_floor", "")] = float(rl.get("candidate_tsol_ns_sum", 0))
            f[("cand_roofline_time", "")] = float(rl.get("candidate_time_ns_sum", 0))
    sh = s.get("shadow")
    if sh is not None:
        for outcome in ("passed", "failed", "skipped", "unverifiable"):
            f[("shadow_calls", outcome)] = float(sh.get(outcome, 0))
        f[("shadow_overdue", "")] = float(sh.get("overdue", 0))
        f[("shadow_bytes", "")] = float(sh.get("bytes_copied", 0))
        aa = sh.get("aa") or {}
        f[("aa_runs", "")] = float(aa.get("runs", 0))
        f[("aa_mismatching", "")] = float(aa.get("mismatching", 0))
        _add_hist(f, "cand_latency", sh.get("candidate_latency_ns"))
    ro = s.get("rollout")
    if ro is not None:
        served = ro.get("served") or {}
        for arm in ("production", "candidate"):
            f[("served", arm)] = float(served.get(arm, 0))
        f[("served_verified", "")] = float(served.get("candidate_verified", 0))
        f[("captured_candidate", "")] = float((ro.get("captured") or {}).get("candidate", 0))
        f[("transitions", "")] = float(ro.get("transitions", 0))
    return f


# Counter families: name, help, the label the part fills (None: no label), the divisor to base units.
_COUNTERS = {
    "calls": ("understudy_calls_total", "intercepted calls (estimated past a thread's warm-up: defaults.key_every)", None, 1),
    "captured_calls": ("understudy_captured_calls_total", "calls made during CUDA graph capture", None, 1),
    "captured_candidate": ("understudy_captured_candidate_calls_total",
                           "calls captured into a CUDA graph with the candidate (of the captured calls)", None, 1),
    "timings_dropped": ("understudy_timings_dropped_total", "sampled calls left untimed (no timer was free)", None, 1),
    "roofline_calls": ("understudy_roofline_scored_calls_total",
                       "timed calls scored against the roofline floor", None, 1),
    "roofline_unscored": ("understudy_roofline_unscored_calls_total",
                          "timed calls without a floor (no peak for their dtype)", None, 1),
    "roofline_floor": ("understudy_roofline_floor_seconds_total",
                       "sum of the roofline floors (T_SOL) of the scored calls", None, 1e9),
    "roofline_time": ("understudy_roofline_measured_seconds_total",
                      "sum of the measured times of the scored calls", None, 1e9),
    "cand_roofline_calls": ("understudy_candidate_roofline_scored_calls_total",
                            "passing shadow calls of the candidate scored against the roofline floor", None, 1),
    "cand_roofline_floor": ("understudy_candidate_roofline_floor_seconds_total",
                            "sum of the roofline floors of the candidate's scored calls", None, 1e9),
    "cand_roofline_time": ("understudy_candidate_roofline_measured_seconds_total",
                           "sum of the candidate's measured times on its scored calls", None, 1e9),
    "shadow_calls": ("understudy_shadow_calls_total",
                     "shadow calls by outcome (passed and failed are the verified ones)", "outcome", 1),
    "shadow_overdue": ("understudy_shadow_overdue_calls_total",
                       "candidate calls slower than the guard's deadline", None, 1),
    "shadow_bytes": ("understudy_shadow_copied_bytes_total", "bytes copied for shadow snapshots", None, 1),
    "aa_runs": ("understudy_aa_runs_total", "A/A runs (production run twice)", None, 1),
    "aa_mismatching": ("understudy_aa_mismatching_runs_total", "A/A runs whose two results differed", None, 1),
    "served": ("understudy_served_calls_total", "calls served outside graph capture, by the arm that served them",
               "arm", 1),
    "served_verified": ("understudy_served_candidate_verified_calls_total",
                        "candidate-served calls whose verification ran (of the candidate's)", None, 1),
    "transitions": ("understudy_route_transitions_total", "mode transitions of routes", None, 1),
}
_HISTOGRAMS = {
    "latency": ("understudy_latency_seconds", "production latency of the timed calls "
                "(its _count is the timed calls, its _sum their device time)"),
    "cand_latency": ("understudy_candidate_latency_seconds", "candidate latency of the shadowed calls"),
}
_KEY_LABELS = ["operator", "key", "phase"]


# ---- the collector --------------------------------------------------------------------

def _default_source():
    from . import report
    return report(flush_timings=False)


class UnderstudyCollector:
    """A prometheus_client collector of understudy's figures.

    source: a callable returning a report (dict); default: this process's live
    report, read without waiting for the device (timings still in flight
    appear at the next scrape). top_keys: shape keys per operator with series
    of their own, chosen by estimated device time; the others are summed into
    key="other" (one series per phase).

    collect() never raises: a report that cannot be read (understudy not
    enabled, a malformed report) gives understudy_enabled 0 beside the
    counters so far, and counts understudy_metrics_errors_total when it was
    an error. Thread-safe: scrapes are serialised."""

    def __init__(self, source: Optional[Callable[[], dict]] = None, *, top_keys: int = DEFAULT_TOP_KEYS):
        _prom()
        if not isinstance(top_keys, int) or isinstance(top_keys, bool) or top_keys < 1:
            raise ValueError(f"top_keys must be a positive integer, not {top_keys!r}")
        self.source = source or _default_source
        self.top_keys = top_keys
        self.last_error: Optional[str] = None
        self._lock = threading.Lock()
        self._session = None
        self._last: dict = {}   # (operator, key) -> the route's figures at the previous scrape
        self._acc: dict = {}    # (operator, key or "other", phase) -> {(family, part): sum of increments}
        self._shown: set = set()  # the series of the last report read
        self._errors = 0

    def describe(self):
        # Nothing: registering must not read a report (understudy may not be enabled yet).
        return []

    def _fold(self, rep: dict):
        """Adds each route's increments since the last scrape to its series now; returns the series shown."""
        hist = rep.get("histogram") or {"scheme": _SCHEME, "buckets": _FINE_BUCKETS}
        if hist.get("scheme") != _SCHEME or int(hist.get("buckets", 0)) != _FINE_BUCKETS:
            raise ValueError(f"report histograms are {hist.get('scheme')!r} with {hist.get('buckets')} buckets, "
                             f"not {_SCHEME!r} with {_FINE_BUCKETS}: this package and the library disagree")
        session = (rep.get("pid"), rep.get("started_unix_ms"))
        if session != self._session:  # a new enable: every route starts again from zero
            self._session, self._last = session, {}
        shown = set()
        for o in rep.get("operators", ()):
            op = o["name"]
            ranked = sorted(o.get("shapes", ()), key=lambda s: (-float(s.get("est_device_time_ns") or 0),
                                                                -float(s.get("calls", 0)), s["key"]))
            for rank, s in enumerate(ranked):
                phase = s.get("phase", "unknown")
                series = (op, s["key"] if rank < self.top_keys else "other", phase)
                now = _route_figures(s)
                before = self._last.get((op, s["key"]), {})
                if any(now.get(k, 0.0) < v for k, v in before.items()):
                    before = {}  # figures went back: count the route anew
                acc = self._acc.setdefault(series, {})
                for k, v in now.items():
                    acc[k] = acc.get(k, 0.0) + (v - before.get(k, 0.0))
                self._last[(op, s["key"])] = now
                shown.add(series)
        # "other" series stay once they exist (they only grow); a key's own
        # series shows while it is among the busiest.
        shown.update(k for k in self._acc if k[1] == "other")
        self._shown = shown
        return shown

    def collect(self):
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
        with self._lock:
            rep, shown, rest = None, self._shown, []
            try:
                rep = self.source()
                shown = self._fold(rep)
                rest = list(self._report_families(rep))
            except UnderstudyError as e:  # the counters so far; not enabled is not a fault
                rep, self.last_error = None, str(e)
                if e.name != "UST_ESTATE":  # enabled, and the report could not be read (out of memory)
                    self._errors += 1
            except Exception as e:  # noqa: BLE001 - a scrape must not fail the host's /metrics
                rep, self.last_error = None, f"{type(e).__name__}: {e}"
                self._errors += 1
            families = list(self._key_families(sorted(shown)))
            up = GaugeMetricFamily("understudy_enabled", "1 when the report was read at this scrape")
            up.add_metric([], 1 if rep is not None else 0)
            err = CounterMetricFamily("understudy_metrics_errors_total",
                                      "scrapes whose report could not be turned into metrics")
            err.add_metric([], self._errors)
        return families + [up, err] + (rest if rep is not None else [])

    def _key_families(self, shown):
        from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString
        les = [floatToGoString(b / 1e9) for b in BUCKET_BOUNDS_NS] + ["+Inf"]
        counters = {fam: CounterMetricFamily(name, help_, labels=_KEY_LABELS + ([label] if label else []))
                    for fam, (name, help_, label, _) in _COUNTERS.items()}
        hists = {fam: HistogramMetricFamily(name, help_, labels=_KEY_LABELS) for fam, (name, help_) in _HISTOGRAMS.items()}
        for series in shown:
            acc = self._acc[series]
            for (fam, part), v in sorted((k, v) for k, v in acc.items() if k[0] in counters):
                label, scale = _COUNTERS[fam][2], _COUNTERS[fam][3]
                counters[fam].add_metric(list(series) + ([part] if label else []), v / scale)
            for fam, mf in hists.items():
                if (fam, "sum") in acc:
                    cum, buckets = 0.0, []
                    for j, le in enumerate(les):
                        cum += acc.get((fam, j), 0.0)
                        buckets.append((le, cum))
                    mf.add_metric(list(series), buckets, acc[(fam, "sum")] / 1e9)
        yield from (mf for mf in list(counters.values()) + list(hists.values()) if mf.samples)

    def _report_families(self, rep: dict):
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
        info = GaugeMetricFamily("understudy_build_info", "the library and torch versions (value 1)",
                                 labels=["version", "torch_version"])
        info.add_metric([str(rep.get("library_version", "")), str(rep.get("torch_version", ""))], 1)
        yield info
        ops = [o for o in rep.get("operators", ()) if o.get("shapes") or o.get("untracked") or o.get("tallied")]
        routes = GaugeMetricFamily("understudy_routes", "routes (shape keys) of each operator by mode",
                                   labels=["operator", "mode"])
        share = GaugeMetricFamily("understudy_operator_device_time_ratio",
                                  "the operator's share of this process's estimated device time", labels=["operator"])
        ratio = GaugeMetricFamily("understudy_operator_roofline_ratio",
                                  "production's S_i: T_SOL / median time, the median over its shape keys "
                                  "(cumulative since enable)", labels=["operator"])
        cratio = GaugeMetricFamily("understudy_operator_candidate_roofline_ratio",
                                   "the candidate's S_i (cumulative since enable)", labels=["operator"])
        cover = GaugeMetricFamily("understudy_operator_candidate_coverage_ratio",
                                  "shape keys with a verified candidate / shape keys seen", labels=["operator"])
        above = GaugeMetricFamily("understudy_operator_above_roof_keys",
                                  "shape keys measured faster than their roofline floor (S > 1, production or "
                                  "candidate): profile below achieved, recalibrate", labels=["operator"])
        untracked = CounterMetricFamily("understudy_untracked_calls_total",
                                        "calls beyond max_routes (served, not keyed)", labels=["operator"])
        tallied = CounterMetricFamily("understudy_tallied_calls_total",
                                      "calls counted without a key past a thread's warm-up (defaults.key_every): "
                                      "the shape keys' call counts stand for them", labels=["operator"])
        graphs = GaugeMetricFamily("understudy_routes_graph",
                                   "routes (shape keys) of each operator by how they stand under CUDA graphs: gated "
                                   "(verdicts flow in replays), observed (replays timed, no candidate captured), "
                                   "observe_only (the report's graph.reason says why)", labels=["operator", "status"])
        for o in ops:
            op = o["name"]
            modes = dict.fromkeys(_MODES, 0)
            statuses = dict.fromkeys(_GRAPH_STATUSES, 0)
            for s in o.get("shapes", ()):
                m = s.get("mode", "observe")
                modes[m] = modes.get(m, 0) + 1
                st = (s.get("graph") or {}).get("status")
                if st is not None:
                    st = st.replace("-", "_")
                    statuses[st] = statuses.get(st, 0) + 1
            for m, n in modes.items():
                routes.add_metric([op, m], n)
            if any(statuses.values()):
                for st, n in statuses.items():
                    graphs.add_metric([op, st], n)
            share.add_metric([op], float(o.get("weight") or 0.0))
            rl = o.get("roofline") or {}
            if rl.get("S") is not None:
                ratio.add_metric([op], rl["S"])
            if rl.get("S_candidate") is not None:
                cratio.add_metric([op], rl["S_candidate"])
            if rl.get("coverage") is not None:
                cover.add_metric([op], rl["coverage"])
            if rl.get("scored_shapes"):
                above.add_metric([op], float(rl.get("above_roof") or 0))
            untracked.add_metric([op], float(o.get("untracked", 0)))
            tallied.add_metric([op], float(o.get("tallied", 0)))
        yield from (m for m in (routes, graphs, share, ratio, cratio, cover, above, untracked, tallied) if m.samples)
        tot = rep.get("totals") or {}
        ierr = CounterMetricFamily("understudy_internal_errors_total",
                                   "understudy's own failures (production served each call)")
        ierr.add_metric([], float(tot.get("internal_errors", 0)))
        yield ierr
        scored = GaugeMetricFamily("understudy_scored_device_time_ratio",
                                   "the share of the estimated device time whose shape keys have an S "
                                   "(were measured against a floor)")
        scored.add_metric([], float(tot.get("scored_share") or 0.0))
        yield scored
        yield from _timer_families(rep.get("timer") or {})
        # the candidates against production where both ran: the same shape
        # keys, each weighted by its device time
        cr = tot.get("candidate_routes") or {}
        for key, name, help_ in (
                ("S_candidate", "understudy_candidate_routes_roofline_ratio",
                 "S of the candidates over their own scored shape keys, weighted by device time"),
                ("S_production", "understudy_candidate_routes_production_roofline_ratio",
                 "production's S over the candidates' scored shape keys, weighted by device time"),
                ("device_share", "understudy_candidate_routes_device_time_ratio",
                 "the share of the estimated device time in the candidates' scored shape keys")):
            if cr.get(key) is not None:
                g = GaugeMetricFamily(name, help_)
                g.add_metric([], float(cr[key]))
                yield g
        # S_agg over all phases is a family of its own, without a phase label:
        # the per-phase family has no "all" series repeating the others.
        for key, name, help_ in (("S_agg", "understudy_aggregate_roofline_ratio",
                                  "S_agg = sum_i w_i S_i over every phase, production (cumulative since enable)"),
                                 ("S_agg_candidate", "understudy_aggregate_candidate_roofline_ratio",
                                  "S_agg with the verified candidates (cumulative since enable)")):
            if tot.get(key) is not None:
                g = GaugeMetricFamily(name, help_)
                g.add_metric([], tot[key])
                yield g
            g = GaugeMetricFamily(name.replace("understudy_", "understudy_phase_", 1),
                                  help_.replace("over every phase", "within one phase"), labels=["phase"])
            for ph, x in sorted((tot.get("phases") or {}).items()):
                if x.get(key) is not None:
                    g.add_metric([ph], x[key])
            if g.samples:
                yield g
        yield from _windowed_families(rep)
        yield from _candidate_families(rep)


def _candidate_families(rep: dict):
    """Which implementation serves: each operator's candidate by its
    source (value 1), and its routes by who serves them now."""
    from prometheus_client.metrics_core import GaugeMetricFamily
    info = GaugeMetricFamily("understudy_candidate_info", "an operator's candidate: its name and where it comes "
                             "from, the label the report names it by (value 1)",
                             labels=["operator", "candidate", "kind", "source"])
    serving = GaugeMetricFamily("understudy_routes_serving", "routes of an operator with a candidate by the "
                                "implementation that serves them now: production, candidate or both (canary)",
                                labels=["operator", "implementation"])
    for o in rep.get("operators", ()):
        c = o.get("candidate")
        if not isinstance(c, dict):
            continue
        src = c.get("source") if isinstance(c.get("source"), dict) else {}
        info.add_metric([o["name"], str(c.get("name", "")), str(src.get("kind", c.get("kind", ""))),
                         str(src.get("label", ""))], 1)
        now = Counter(str((s.get("served_by") or {}).get("now", "production")) for s in o.get("shapes", ()))
        for impl in ("production", "candidate", "both"):
            serving.add_metric([o["name"], impl], float(now.get(impl, 0)))
    yield from (m for m in (info, serving) if m.samples)


def _timer_families(tm: dict):
    """The kernel tracer: which timer is on, its coverage (the share of all
    kernel time in its windows launched inside calls of bound ops), and the
    kernel time in its windows, attributed or not."""
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
    info = GaugeMetricFamily("understudy_timer_info", "the timer producing device times (value 1), and why the "
                             "kernel tracer is not that timer when it is not", labels=["kind", "state", "why"])
    info.add_metric([str(tm.get("kind", "events")), str(tm.get("state", "")), str(tm.get("why", ""))], 1)
    yield info
    if tm.get("coverage") is not None:
        g = GaugeMetricFamily("understudy_kernel_coverage_ratio",
                              "kernel time launched inside calls of bound ops / all kernel time, in the tracer's "
                              "windows (cumulative since enable)")
        g.add_metric([], float(tm["coverage"]))
        yield g
    phased = [(name, ph) for name, ph in (tm.get("phases") or {}).items() if ph.get("coverage") is not None]
    if phased:
        g = GaugeMetricFamily("understudy_phase_kernel_coverage_ratio",
                              "the coverage of the kernels launched in a phase (by the launching thread's "
                              "ust_phase; known with timer.correlation callbacks)", labels=["phase"])
        for name, ph in phased:
            g.add_metric([name], float(ph["coverage"]))
        yield g
    k = CounterMetricFamily("understudy_window_kernel_seconds", "kernel time recorded in the tracer's windows",
                            labels=["attributed"])
    k.add_metric(["yes"], float(tm.get("attributed_ns", 0)) / 1e9)
    k.add_metric(["no"], float(tm.get("kernel_ns", 0) - tm.get("attributed_ns", 0)) / 1e9)
    yield k
    top = GaugeMetricFamily("understudy_unattributed_kernel_seconds",
                            "the kernels with the most time that no bound op launched (what to bind next)",
                            labels=["kernel"])
    for u in tm.get("unattributed", []):
        top.add_metric([str(u.get("name", ""))[:120]], float(u.get("ns", 0)) / 1e9)
    if top.samples:
        yield top


def _windowed_families(rep: dict):
    """S over the report's recent window (report.window_s; between one and
    two windows long), beside the cumulative ratios above: a regression
    shows here within a window instead of being damped by everything since
    enable."""
    from prometheus_client.metrics_core import GaugeMetricFamily
    win = rep.get("window")
    if not win:
        return
    ratio = GaugeMetricFamily("understudy_operator_roofline_ratio_window",
                              "production's S_i over the recent window (report.window_s)", labels=["operator"])
    for o in win.get("operators", ()):
        if o.get("S") is not None:
            ratio.add_metric([o["name"]], o["S"])
    if ratio.samples:
        yield ratio
    tot = win.get("totals") or {}
    if tot.get("S_agg") is not None:
        agg = GaugeMetricFamily("understudy_aggregate_roofline_ratio_window",
                                "S_agg over the recent window (report.window_s)")
        agg.add_metric([], tot["S_agg"])
        yield agg
    span = GaugeMetricFamily("understudy_window_seconds", "the span the window figures cover")
    span.add_metric([], float(win.get("span_s", 0.0)))
    yield span


# ---- exposures ----------------------------------------------------------------------

def _registry_of(collector):
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def metrics_text(report: dict, *, top_keys: int = DEFAULT_TOP_KEYS) -> str:
    """The exposition (Prometheus text format 0.0.4) of one report."""
    generate_latest = _prom().generate_latest
    return generate_latest(_registry_of(UnderstudyCollector(lambda: report, top_keys=top_keys))).decode()


class MetricsServer:
    """An HTTP endpoint serving one collector's metrics (prometheus_client's
    server, in a daemon thread); .port is the bound port, stop() closes it."""

    def __init__(self, host: str, port: int, collector: UnderstudyCollector):
        prom = _prom()
        self.collector = collector
        self.host = host
        started = prom.start_http_server(port, addr=host, registry=_registry_of(collector))
        if started is None:  # older prometheus_client versions return nothing to stop
            raise MetricsUnavailable(-7, "UST_ENOTFOUND", "this prometheus_client's server cannot be stopped: "
                                     "pip install -U prometheus_client")
        self._httpd, self._thread = started
        self.port = self._httpd.server_address[1]

    def stop(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


def serve_metrics(port: int = 9464, host: str = DEFAULT_HOST, source=None, *,
                  top_keys: int = DEFAULT_TOP_KEYS) -> MetricsServer:
    """Serve /metrics on host:port (port 0: any free port, see .port). Loopback
    by default: exposing it further is the operator's decision. Raises
    MetricsUnavailable without prometheus_client, OSError when the port
    cannot be bound."""
    return MetricsServer(host, port, UnderstudyCollector(source, top_keys=top_keys))


class MultiprocessExporter:
    """Writes a collector's metrics into prometheus_client's multiprocess
    directory every interval_s seconds (and at write_now()), so that a
    server in another process reading it with MultiProcessCollector (vLLM's
    /metrics in multiprocess mode) shows them. understudy's figures go to
    files of their own (counter_understudy-PID.db, histogram_…,
    gauge_liveall_…, the last removed when the process exits), so they never
    share a file with the host's own metrics; gauges carry
    pid="understudy-PID". A series no longer shown keeps its last value
    there (a file cannot forget a key); a gauge that lost its value reads
    NaN."""

    def __init__(self, path: Optional[str] = None, interval_s: float = MULTIPROCESS_INTERVAL_S,
                 collector: Optional[UnderstudyCollector] = None, *, top_keys: int = DEFAULT_TOP_KEYS):
        _prom()
        try:
            from prometheus_client.mmap_dict import MmapedDict, mmap_key
        except ImportError as e:
            raise MetricsUnavailable(-7, "UST_ENOTFOUND", f"this prometheus_client lacks the multiprocess files' "
                                     f"writer ({e}): pip install -U prometheus_client") from None
        path = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not path or not os.path.isdir(path):
            raise ValueError(f"the multiprocess directory {path!r} is not a directory "
                             f"(PROMETHEUS_MULTIPROC_DIR names it)")
        self.path, self.interval_s = path, float(interval_s)
        self.collector = collector or UnderstudyCollector(top_keys=top_keys)
        self.last_error: Optional[str] = None
        self._key = mmap_key
        tag = f"understudy-{os.getpid()}"
        self._files = {t: MmapedDict(os.path.join(path, f"{prefix}_{tag}.db"))
                       for t, prefix in (("counter", "counter"), ("histogram", "histogram"),
                                         ("gauge", "gauge_liveall"))}
        self._gauge_file = os.path.join(path, f"gauge_liveall_{tag}.db")
        self._gauges_written: set = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        atexit.register(self._remove_gauges)
        self.write_now()
        self._thread = threading.Thread(target=self._run, name="understudy-metrics-export", daemon=True)
        self._thread.start()

    def write_now(self, source=None):
        """Write the current figures (from source, a callable returning a report, if given)."""
        with self._lock:
            if self._files is None:
                return
            saved = self.collector.source
            if source is not None:
                self.collector.source = source
            try:
                families = self.collector.collect()
            finally:
                self.collector.source = saved
            gauges = set()
            for mf in families:
                f = self._files.get(mf.type)
                if f is None:
                    continue
                below: dict = {}
                for s in mf.samples:
                    if s.name.endswith("_count") and mf.type == "histogram":
                        continue  # the reader adds it up from the buckets
                    value = s.value
                    if "le" in s.labels:  # the files hold each bucket's own count
                        rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                        value, below[rest] = s.value - below.get(rest, 0.0), s.value
                    key = self._key(mf.name, s.name, list(s.labels), list(s.labels.values()), mf.documentation)
                    f.write_value(key, value, 0.0)
                    if mf.type == "gauge":
                        gauges.add(key)
            for key in self._gauges_written - gauges:
                self._files["gauge"].write_value(key, float("nan"), 0.0)
            self._gauges_written |= gauges
            self.last_error = self.collector.last_error

    def _run(self):
        while not self._stop.wait(self.interval_s):
            try:
                self.write_now()
            except Exception as e:  # noqa: BLE001 - a thread in the serving process must not die noisily
                if str(e) != self.last_error:
                    warnings.warn(f"understudy: writing metrics into {self.path} failed: {e}", RuntimeWarning)
                self.last_error = str(e)

    def stop(self, final_source=None):
        """Stop writing, after a last write (from final_source if given)."""
        self._stop.set()
        self._thread.join(30)
        try:
            self.write_now(final_source)
        finally:
            with self._lock:
                for f in (self._files or {}).values():
                    f.close()
                self._files = None

    def _remove_gauges(self):
        # A process that ended has no current ratios; its counters stay, as
        # prometheus_client's own do.
        try:
            os.unlink(self._gauge_file)
        except OSError:
            pass


def export_multiprocess(path: Optional[str] = None, interval_s: float = MULTIPROCESS_INTERVAL_S, *,
                        top_keys: int = DEFAULT_TOP_KEYS) -> MultiprocessExporter:
    """Write understudy's metrics into prometheus_client's multiprocess
    directory (default $PROMETHEUS_MULTIPROC_DIR) now and every interval_s
    seconds; stop() ends it after a last write."""
    return MultiprocessExporter(path, interval_s, top_keys=top_keys)


# ---- what the config's "metrics" section starts at enable ----------------------------

_state_lock = threading.Lock()
_state: dict = {"mode": None, "error": None}
_active = None            # the MetricsServer, the registered collector or the MultiprocessExporter
_mp_collector = None      # the multiprocess export's, kept for the process's life: its files are
                          # summed with other processes', where a counter going back reads as a reset


def status() -> dict:
    """What the config's "metrics" section started: {"mode": None, "endpoint",
    "registry" or "multiprocess", "url" (endpoint), "path" (multiprocess),
    "error": why it could not start, or None}."""
    with _state_lock:
        return dict(_state)


def _warn(msg: str) -> None:
    _state["error"] = msg
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _on_enable(config_text: str) -> None:
    """Start what the config's "metrics" section asks for. Never raises: a
    failure is a warning (and status()["error"]); understudy runs on without it."""
    global _active, _mp_collector
    _on_disable()
    with _state_lock:
        try:
            section = json.loads(config_text).get("metrics") if config_text else None
        except (ValueError, AttributeError):
            section = None  # the library accepted it; nothing here to start
        _state.clear()
        _state.update(mode=None, error=None)
        if section is None:
            return
        try:
            _prom()
        except MetricsUnavailable as e:
            _warn(f"understudy: the config asks for metrics, but {e}; understudy runs without them")
            return
        top = int(section.get("top_keys", DEFAULT_TOP_KEYS))
        try:
            if "port" in section:
                _start_endpoint(section, UnderstudyCollector(top_keys=top))
            elif os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                if _mp_collector is None or _mp_collector.top_keys != top:
                    _mp_collector = UnderstudyCollector(top_keys=top)
                _active = MultiprocessExporter(collector=_mp_collector)
                _state.update(mode="multiprocess", path=_active.path)
            else:
                from prometheus_client import REGISTRY
                _active = UnderstudyCollector(top_keys=top)
                REGISTRY.register(_active)
                _state.update(mode="registry")
        except Exception as e:  # noqa: BLE001
            _active = None
            _warn(f"understudy: metrics could not be started ({type(e).__name__}: {e}); understudy runs without them")


def _start_endpoint(section: dict, collector: UnderstudyCollector) -> None:
    global _active
    host, port = section.get("host", DEFAULT_HOST), int(section["port"])
    if port != 0:
        rank_text = os.environ.get("LOCAL_RANK", "0")
        try:
            rank = int(rank_text)
        except ValueError:
            _warn(f"understudy: LOCAL_RANK={rank_text!r} is not an integer; the metrics endpoint is not started")
            return
        port += rank
        if not 0 < port <= 65535:
            _warn(f"understudy: metrics.port + LOCAL_RANK = {port} is not a port; the metrics endpoint is not started")
            return
    try:
        _active = MetricsServer(host, port, collector)
    except OSError as e:
        _warn(f"understudy: the metrics endpoint cannot listen on {host}:{port} ({e.strerror or e}); "
              f"understudy runs without it")
        return
    _state.update(mode="endpoint", url=f"http://{host}:{_active.port}/metrics")


def _on_disable() -> None:
    """Stop what _on_enable started (a multiprocess export writes its last figures first)."""
    global _active
    with _state_lock:
        active, _active = _active, None
        if active is None:
            return
        try:
            if isinstance(active, MetricsServer):
                active.stop()
            elif isinstance(active, MultiprocessExporter):
                from . import report
                active.stop(final_source=lambda: report(flush_timings=False))  # never waits on the device
            else:
                from prometheus_client import REGISTRY
                REGISTRY.unregister(active)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"understudy: stopping the metrics failed: {e}", RuntimeWarning, stacklevel=3)
        _state.update(mode=None)
