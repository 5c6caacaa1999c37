"""understudy's figures as Prometheus metrics, through prometheus_client.

A custom collector reads the library's figures at each scrape and turns them
into metric families; three ways expose it:

    understudy.serve_metrics(port=9464)          # an endpoint of its own (loopback by default)
    understudy.metrics.UnderstudyCollector()     # register it in a registry the process serves
    understudy.metrics.export_multiprocess()     # into $PROMETHEUS_MULTIPROC_DIR, for a server
                                                 # in another process (vLLM's /metrics)

or the config's "metrics" section, acted on at enable (docs/metrics.md).
The library reads the routes, derives their figures and folds them into
series (ust_metrics_read) with Python's lock released, and hands over a
document whose size follows the series, not the routes: a scrape never holds
the serving threads' interpreter for longer than it takes to turn a few
hundred figures into samples. Series are per operator and phase; per shape
key only where asked (`top_keys`: those keys of each operator with the most
device time, the others summed into key="other"). Names are in base units;
latency is a histogram whose few buckets are sums of the report's log
buckets, so Prometheus merges processes exactly; every series carries
`model_name` (where known) and `engine`, to be joined with the engine's own.
The library keeps each counter as the sum of what its routes added between
scrapes, so counters only grow for the collector's life, whichever series a
route is counted in (also across a disable and enable).

prometheus_client is needed for metrics only: without it the rest of
understudy works and these functions raise MetricsUnavailable.
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import sys
import threading
import warnings
import weakref
from typing import Callable, Optional

from . import UnderstudyError

DEFAULT_TOP_KEYS = 0
MULTIPROCESS_INTERVAL_S = 5.0
DEFAULT_HOST = "127.0.0.1"

# The exposed latency buckets' upper bounds in ns: 2^10, 2^12, ... 2^30 (1.02 us
# to 1.07 s, four times apart), and +Inf. Each is the lower edge of a report
# bucket, so every report bucket lies inside one exposed bucket and the counts
# carry over exactly (the library re-buckets; these are its bounds).
BUCKET_BOUNDS_NS = tuple(1 << (10 + 2 * j) for j in range(11))
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


# ---- the labels every series carries ------------------------------------------------

_labels_lock = threading.Lock()
_labels: dict = {"model_name": None, "engine": None}  # set by the config or set_labels(); None: from the host
_host: dict = {"engine": None, "model_name": None}     # what the host told (plugins, a model's first forward)
_hf_hook = None


def set_labels(*, model_name: Optional[str] = None, engine: Optional[str] = None) -> None:
    """Name the model and the engine on every series (the config's
    metrics.model_name and metrics.engine do the same at enable); None
    leaves a label to the host's detection."""
    with _labels_lock:
        if model_name is not None:
            _labels["model_name"] = str(model_name)
        if engine is not None:
            _labels["engine"] = str(engine)


def _note_host(engine: Optional[str] = None, model_name: Optional[str] = None) -> None:
    """What a host integration knows (understudy.plugins, the HF hook)."""
    with _labels_lock:
        if engine:
            _host["engine"] = engine
        if model_name:
            _host["model_name"] = model_name


def _engine_of_host() -> str:
    if _host["engine"]:
        return _host["engine"]
    for mod, name in (("vllm", "vllm"), ("sglang", "sglang"), ("transformers", "transformers")):
        if mod in sys.modules:
            return name
    return "torch"


_MODEL_FLAGS = {"vllm": ("--served-model-name", "--model"), "sglang": ("--served-model-name", "--model-path")}


def _model_of_argv(engine: str, argv) -> Optional[str]:
    """The model a vLLM or SGLang command line serves (its served name first,
    as their own metrics' model_name is); multiprocessing's spawned children
    carry their parent's argv."""
    argv = list(argv)
    for flag in _MODEL_FLAGS.get(engine, ()):
        for i, a in enumerate(argv):
            if a == flag and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    if engine == "vllm" and "serve" in argv:  # vllm serve MODEL
        i = argv.index("serve")
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def const_labels() -> list:
    """[(name, value)] every series carries now: engine, and model_name where known."""
    with _labels_lock:
        engine = _labels["engine"] or _engine_of_host()
        model = _labels["model_name"] or _host["model_name"] or _model_of_argv(engine, sys.argv)
    return [("engine", engine)] + ([("model_name", model)] if model else [])


def _watch_hf_models(on: bool) -> None:
    """Under Hugging Face transformers, the model's name (config.name_or_path)
    from the first forward of a model that has one; the global hook goes
    once it has been seen."""
    global _hf_hook
    if _hf_hook is not None:
        _hf_hook.remove()
        _hf_hook = None
    if not on or _labels["model_name"] or _host["model_name"] or _engine_of_host() != "transformers":
        return  # vLLM and SGLang name their model on the command line; a hook would stay for nothing
    try:
        from torch.nn.modules.module import register_module_forward_pre_hook
    except ImportError:
        return

    def seen(module, args):
        name = getattr(getattr(module, "config", None), "name_or_path", None)
        if isinstance(name, str) and name:
            _note_host(model_name=name)
            _watch_hf_models(False)

    _hf_hook = register_module_forward_pre_hook(seen)


# ---- the families -------------------------------------------------------------------

# Counters of a series: the document's name -> (metric, help, the label the part fills and its value, divisor)
_COUNTERS = {
    "calls": ("understudy_calls_total", "intercepted calls (estimated past a thread's warm-up: defaults.key_every)",
              None, 1),
    "captured_calls": ("understudy_captured_calls_total", "calls made during CUDA graph capture", None, 1),
    "captured_candidate": ("understudy_captured_candidate_calls_total",
                           "calls captured into a CUDA graph with the candidate (of the captured calls)", None, 1),
    "timings_dropped": ("understudy_timings_dropped_total", "sampled calls left untimed (no timer was free)",
                        None, 1),
    "roofline_calls": ("understudy_roofline_scored_calls_total",
                       "timed calls scored against the roofline floor", None, 1),
    "roofline_unscored": ("understudy_roofline_unscored_calls_total",
                          "timed calls without a floor (no peak for their dtype)", None, 1),
    "roofline_floor_ns": ("understudy_roofline_floor_seconds_total",
                          "sum of the roofline floors (T_SOL) of the scored calls", None, 1e9),
    "roofline_time_ns": ("understudy_roofline_measured_seconds_total",
                         "sum of the measured times of the scored calls", None, 1e9),
    "cand_roofline_calls": ("understudy_candidate_roofline_scored_calls_total",
                            "passing shadow calls of the candidate scored against the roofline floor", None, 1),
    "cand_roofline_floor_ns": ("understudy_candidate_roofline_floor_seconds_total",
                               "sum of the roofline floors of the candidate's scored calls", None, 1e9),
    "cand_roofline_time_ns": ("understudy_candidate_roofline_measured_seconds_total",
                              "sum of the candidate's measured times on its scored calls", None, 1e9),
    "shadow_passed": ("understudy_shadow_calls_total",
                      "shadow calls by outcome (passed and failed are the verified ones)", ("outcome", "passed"), 1),
    "shadow_failed": ("understudy_shadow_calls_total", None, ("outcome", "failed"), 1),
    "shadow_skipped": ("understudy_shadow_calls_total", None, ("outcome", "skipped"), 1),
    "shadow_unverifiable": ("understudy_shadow_calls_total", None, ("outcome", "unverifiable"), 1),
    "shadow_overdue": ("understudy_shadow_overdue_calls_total", "candidate calls slower than the guard's deadline",
                       None, 1),
    "shadow_bytes": ("understudy_shadow_copied_bytes_total", "bytes copied for shadow snapshots", None, 1),
    "aa_runs": ("understudy_aa_runs_total", "A/A runs (production run twice)", None, 1),
    "aa_mismatching": ("understudy_aa_mismatching_runs_total", "A/A runs whose two results differed", None, 1),
    "served_production": ("understudy_served_calls_total",
                          "calls served outside graph capture, by the arm that served them", ("arm", "production"), 1),
    "served_candidate": ("understudy_served_calls_total", None, ("arm", "candidate"), 1),
    "served_verified": ("understudy_served_candidate_verified_calls_total",
                        "candidate-served calls whose verification ran (of the candidate's)", None, 1),
    "transitions": ("understudy_route_transitions_total", "mode transitions of routes", None, 1),
}
_HISTOGRAMS = {
    "latency": ("understudy_latency_seconds", "production latency of the timed calls "
                "(its _count is the timed calls, its _sum their device time)"),
    "candidate_latency": ("understudy_candidate_latency_seconds", "candidate latency of the shadowed calls"),
}


class _Families:
    """Metric families whose series all carry the constant labels."""

    def __init__(self, const):
        from prometheus_client import metrics_core
        self.core = metrics_core
        self.names = [k for k, _ in const]
        self.values = [v for _, v in const]

    def counter(self, name, help_, labels=()):
        return self.core.CounterMetricFamily(name, help_, labels=list(labels) + self.names)

    def gauge(self, name, help_, labels=()):
        return self.core.GaugeMetricFamily(name, help_, labels=list(labels) + self.names)

    def histogram(self, name, help_, labels=()):
        return self.core.HistogramMetricFamily(name, help_, labels=list(labels) + self.names)

    def add(self, fam, values, *rest):
        fam.add_metric(list(values) + self.values, *rest)


def _series_families(doc: dict, fams: _Families):
    """The counters and histograms of the document's series."""
    from prometheus_client.utils import floatToGoString
    keyed = bool(doc.get("keyed"))
    series_labels = ["operator"] + (["key"] if keyed else []) + ["phase"]
    bounds = doc.get("bounds_ns") or BUCKET_BOUNDS_NS
    les = [floatToGoString(b / 1e9) for b in bounds] + ["+Inf"]
    counters, hists = {}, {}
    for s in doc.get("series", ()):
        values = [s["operator"]] + ([s.get("key", "")] if keyed else []) + [s["phase"]]
        for name, v in s.get("counters", {}).items():
            spec = _COUNTERS.get(name)
            if spec is None:
                continue
            metric, help_, part, scale = spec
            fam = counters.get(metric)
            if fam is None:
                if help_ is None:  # a part of a family named first by another entry
                    help_ = next(h for m, h, _, _ in _COUNTERS.values() if m == metric and h)
                fam = counters[metric] = fams.counter(metric, help_, series_labels + ([part[0]] if part else []))
            fams.add(fam, values + ([part[1]] if part else []), float(v) / scale)
        for name, (metric, help_) in _HISTOGRAMS.items():
            h = s.get(name)
            if h is None:
                continue
            fam = hists.get(metric)
            if fam is None:
                fam = hists[metric] = fams.histogram(metric, help_, series_labels)
            cum, buckets = 0.0, []
            for le, n in zip(les, h["buckets"]):
                cum += float(n)
                buckets.append((le, cum))
            fams.add(fam, values, buckets, float(h["sum_ns"]) / 1e9)
    yield from counters.values()
    yield from hists.values()


def _figure_families(doc: dict, fams: _Families):
    """Per operator and per process: routes by mode and under graphs, ratios, totals, timer, window."""
    info = fams.gauge("understudy_build_info", "the library and torch versions (value 1)",
                      ["version", "torch_version"])
    fams.add(info, [str(doc.get("library_version", "")), str(doc.get("torch_version", ""))], 1)
    yield info
    routes = fams.gauge("understudy_routes", "routes (shape keys) of each operator by mode (the modes it has routes "
                        "in; every mode for an operator with a candidate)", ["operator", "mode"])
    graphs = fams.gauge("understudy_routes_graph",
                        "routes (shape keys) of each operator by how they stand under CUDA graphs: gated (verdicts "
                        "flow in replays), observed (replays timed, no candidate captured), observe_only (the "
                        "report's graph.reason says why)", ["operator", "status"])
    share = fams.gauge("understudy_operator_device_time_ratio",
                       "the operator's share of this process's estimated device time", ["operator"])
    ratio = fams.gauge("understudy_operator_roofline_ratio",
                       "production's S_i: T_SOL / median time, the median over its shape keys "
                       "(cumulative since enable)", ["operator"])
    cratio = fams.gauge("understudy_operator_candidate_roofline_ratio", "the candidate's S_i (cumulative since enable)",
                        ["operator"])
    cover = fams.gauge("understudy_operator_candidate_coverage_ratio",
                       "shape keys with a verified candidate / shape keys seen", ["operator"])
    above = fams.gauge("understudy_operator_above_roof_keys",
                       "shape keys measured faster than their roofline floor (S > 1, production or candidate): "
                       "profile below achieved, recalibrate", ["operator"])
    untracked = fams.counter("understudy_untracked_calls_total", "calls beyond max_routes (served, not keyed)",
                             ["operator"])
    tallied = fams.counter("understudy_tallied_calls_total",
                           "calls counted without a key past a thread's warm-up (defaults.key_every): the shape "
                           "keys' call counts stand for them", ["operator"])
    for o in doc.get("operators", ()):
        op = o["name"]
        for m in _MODES:
            n = (o.get("routes") or {}).get(m, 0)
            if n or o.get("candidate"):
                fams.add(routes, [op, m], n)
        g = o.get("graph") or {}
        if any(g.get(st) for st in _GRAPH_STATUSES):
            for st in _GRAPH_STATUSES:
                fams.add(graphs, [op, st], g.get(st, 0))
        fams.add(share, [op], float(o.get("weight") or 0.0))
        if o.get("S") is not None:
            fams.add(ratio, [op], o["S"])
        if o.get("S_candidate") is not None:
            fams.add(cratio, [op], o["S_candidate"])
        if o.get("coverage") is not None:
            fams.add(cover, [op], o["coverage"])
        if o.get("above_roof") is not None:  # the library gives it where a key was scored
            fams.add(above, [op], float(o["above_roof"]))
        fams.add(untracked, [op], float(o.get("untracked", 0)))
        fams.add(tallied, [op], float(o.get("tallied", 0)))
    yield from (m for m in (routes, graphs, share, ratio, cratio, cover, above, untracked, tallied) if m.samples)
    tot = doc.get("totals") or {}
    ierr = fams.counter("understudy_internal_errors_total", "understudy's own failures (production served each call)")
    fams.add(ierr, [], float(tot.get("internal_errors", 0)))
    yield ierr
    scored = fams.gauge("understudy_scored_device_time_ratio",
                        "the share of the estimated device time whose shape keys have an S "
                        "(were measured against a floor)")
    fams.add(scored, [], float(tot.get("scored_share") or 0.0))
    yield scored
    yield from _timer_families(doc.get("timer") or {}, fams)
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
            g = fams.gauge(name, help_)
            fams.add(g, [], float(cr[key]))
            yield g
    # S_agg over all phases is a family of its own, without a phase label:
    # the per-phase family has no "all" series repeating the others.
    for key, name, help_ in (("S_agg", "understudy_aggregate_roofline_ratio",
                              "S_agg = sum_i w_i S_i over every phase, production (cumulative since enable)"),
                             ("S_agg_candidate", "understudy_aggregate_candidate_roofline_ratio",
                              "S_agg with the verified candidates (cumulative since enable)")):
        if tot.get(key) is not None:
            g = fams.gauge(name, help_)
            fams.add(g, [], tot[key])
            yield g
        g = fams.gauge(name.replace("understudy_", "understudy_phase_", 1),
                       help_.replace("over every phase", "within one phase"), ["phase"])
        for ph, x in sorted((tot.get("phases") or {}).items()):
            if x.get(key) is not None:
                fams.add(g, [ph], x[key])
        if g.samples:
            yield g
    yield from _windowed_families(doc, fams)
    yield from _candidate_families(doc, fams)


def _candidate_families(doc: dict, fams: _Families):
    """Which implementation serves: each operator's candidate by its
    source (value 1), and its routes by who serves them now."""
    info = fams.gauge("understudy_candidate_info", "an operator's candidate: its name and where it comes from, the "
                      "label the report names it by (value 1)", ["operator", "candidate", "kind", "source"])
    serving = fams.gauge("understudy_routes_serving", "routes of an operator with a candidate by the implementation "
                         "that serves them now: production, candidate or both (canary)", ["operator", "implementation"])
    for c in doc.get("candidates", ()):
        fams.add(info, [c["operator"], str(c.get("candidate", "")), str(c.get("kind", "")), str(c.get("source", ""))],
                 1)
        for impl in ("production", "candidate", "both"):
            fams.add(serving, [c["operator"], impl], float((c.get("serving") or {}).get(impl, 0)))
    yield from (m for m in (info, serving) if m.samples)


def _timer_families(tm: dict, fams: _Families):
    """The kernel tracer: which timer is on, its coverage (the share of all
    kernel time in its windows launched inside calls of bound ops), and the
    kernel time in its windows, attributed or not."""
    info = fams.gauge("understudy_timer_info", "the timer producing device times (value 1), and why the "
                      "kernel tracer is not that timer when it is not", ["kind", "state", "why"])
    fams.add(info, [str(tm.get("kind", "events")), str(tm.get("state", "")), str(tm.get("why", ""))], 1)
    yield info
    if tm.get("coverage") is not None:
        g = fams.gauge("understudy_kernel_coverage_ratio",
                       "kernel time launched inside calls of bound ops / all kernel time, in the tracer's "
                       "windows (cumulative since enable)")
        fams.add(g, [], float(tm["coverage"]))
        yield g
    phased = [(name, ph) for name, ph in (tm.get("phases") or {}).items() if ph.get("coverage") is not None]
    if phased:
        g = fams.gauge("understudy_phase_kernel_coverage_ratio",
                       "the coverage of the kernels launched in a phase (by the launching thread's "
                       "ust_phase; known with timer.correlation callbacks)", ["phase"])
        for name, ph in phased:
            fams.add(g, [name], float(ph["coverage"]))
        yield g
    if tm.get("kernel_ns", 0) > 0:
        k = fams.counter("understudy_window_kernel_seconds", "kernel time recorded in the tracer's windows",
                         ["attributed"])
        fams.add(k, ["yes"], float(tm.get("attributed_ns", 0)) / 1e9)
        fams.add(k, ["no"], float(tm.get("kernel_ns", 0) - tm.get("attributed_ns", 0)) / 1e9)
        yield k
    top = fams.gauge("understudy_unattributed_kernel_seconds",
                     "the kernels with the most time that no bound op launched (what to bind next)", ["kernel"])
    for u in tm.get("unattributed", []):
        fams.add(top, [str(u.get("name", ""))[:120]], float(u.get("ns", 0)) / 1e9)
    if top.samples:
        yield top


def _windowed_families(doc: dict, fams: _Families):
    """S over the report's recent window (report.window_s; between one and
    two windows long), beside the cumulative ratios above: a regression
    shows here within a window instead of being damped by everything since
    enable."""
    win = doc.get("window")
    if not win:
        return
    ratio = fams.gauge("understudy_operator_roofline_ratio_window",
                       "production's S_i over the recent window (report.window_s)", ["operator"])
    for o in win.get("operators", ()):
        if o.get("S") is not None:
            fams.add(ratio, [o["name"]], o["S"])
    if ratio.samples:
        yield ratio
    tot = win.get("totals") or {}
    if tot.get("S_agg") is not None:
        agg = fams.gauge("understudy_aggregate_roofline_ratio_window", "S_agg over the recent window (report.window_s)")
        fams.add(agg, [], tot["S_agg"])
        yield agg
    span = fams.gauge("understudy_window_seconds", "the span the window figures cover")
    fams.add(span, [], float(win.get("span_s", 0.0)))
    yield span


# ---- the collector --------------------------------------------------------------------

class UnderstudyCollector:
    """A prometheus_client collector of understudy's figures.

    source: None for this process's live figures, read by the library from
    its routes without waiting for the device (timings still in flight
    appear at the next scrape) and without a JSON report between; or a
    callable returning a report (dict), whose figures are taken as it gives
    them. top_keys: shape keys per operator with series of their own (a
    `key` label), chosen by estimated device time, the others summed into
    key="other"; 0 (the default): series per operator and phase. labels:
    {"model_name", "engine"} for every series; None: the config's, else the
    host's (const_labels()).

    collect() never raises: figures that cannot be read (understudy not
    enabled, a malformed report) give understudy_enabled 0 beside the
    counters so far, and count understudy_metrics_errors_total when it was
    an error. Thread-safe: scrapes are serialised."""

    def __init__(self, source: Optional[Callable[[], dict]] = None, *, top_keys: int = DEFAULT_TOP_KEYS,
                 labels: Optional[dict] = None):
        _prom()
        if not isinstance(top_keys, int) or isinstance(top_keys, bool) or not 0 <= top_keys <= 65536:
            raise ValueError(f"top_keys must be an integer in [0, 65536], not {top_keys!r}")
        self.source = source
        self.top_keys = top_keys
        self.labels = dict(labels) if labels is not None else None
        self.last_error: Optional[str] = None
        self._lock = threading.Lock()
        self._reader = None
        self._series_doc: dict = {}  # the series of the last figures read (shown again when a read fails)
        self._errors = 0

    def describe(self):
        # Nothing: registering must not read a report (understudy may not be enabled yet).
        return []

    def _read(self) -> dict:
        from . import _check, _load
        lib = _load()
        if self._reader is None:
            handle = ctypes.c_void_p()
            _check(lib.ust_metrics_new(self.top_keys, ctypes.byref(handle)))
            self._reader = handle
            weakref.finalize(self, lib.ust_metrics_free, handle)
        text = None if self.source is None else json.dumps(self.source()).encode()
        out = ctypes.c_void_p()
        _check(lib.ust_metrics_read(self._reader, text, ctypes.byref(out)))  # Python's lock released inside
        try:
            return json.loads(ctypes.string_at(out.value))
        finally:
            lib.ust_free(out)

    def read(self) -> dict:
        """The figures now, folded into this collector's series: the
        library's document (docs/metrics.md, "The figures"). Raises
        UnderstudyError when they cannot be read."""
        with self._lock:
            return self._read()

    def collect(self):
        fams = _Families(sorted((self.labels or {}).items()) if self.labels is not None else const_labels())
        with self._lock:
            doc, rest = None, []
            try:
                doc = self._read()
                self._series_doc = {k: doc[k] for k in ("series", "keyed", "bounds_ns") if k in doc}
                rest = list(_figure_families(doc, fams))
            except UnderstudyError as e:  # the counters so far; not enabled is not a fault
                doc, self.last_error = None, str(e)
                if e.name != "UST_ESTATE":  # enabled, and the figures could not be read (out of memory)
                    self._errors += 1
            except Exception as e:  # noqa: BLE001 - a scrape must not fail the host's /metrics
                doc, self.last_error = None, f"{type(e).__name__}: {e}"
                self._errors += 1
            families = list(_series_families(self._series_doc, fams))
            up = fams.gauge("understudy_enabled", "1 when the figures were read at this scrape")
            fams.add(up, [], 1 if doc is not None else 0)
            err = fams.counter("understudy_metrics_errors_total", "scrapes whose figures could not be turned into metrics")
            fams.add(err, [], self._errors)
        return families + [up, err] + (rest if doc is not None else [])


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
    exposition: text or OpenMetrics as the scraper asks, gzip where
    accepted); .port is the bound port, stop() closes it.

    One thread accepts connections and watches them; a connection costs a
    thread only once its request has arrived, and then one of `workers`
    threads serves it. A connection that sends nothing for idle_timeout_s
    is closed, so are the oldest beyond max_idle, and a request that comes
    while every worker is busy and as many wait is answered by closing its
    connection: idle or slow clients cannot take the threads a scrape needs.
    stop() ends every thread and connection."""

    def __init__(self, host: str, port: int, collector: UnderstudyCollector, *, workers: int = 2,
                 idle_timeout_s: float = 10.0, max_idle: int = 64):
        _prom()
        import selectors
        import socket
        from prometheus_client.exposition import MetricsHandler
        self.collector = collector
        self.host = host
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_idle = int(max_idle)
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        self._sock = socket.socket(family, kind, proto)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                self._sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            self._sock.bind(addr)
            self._sock.listen(128)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self.port = self._sock.getsockname()[1]
        self._handler = type("UnderstudyMetricsHandler", (MetricsHandler,),
                             {"registry": _registry_of(collector), "timeout": self.idle_timeout_s})
        self._selector = selectors.DefaultSelector()
        self._read_event = selectors.EVENT_READ
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._idle: dict = {}      # socket -> (address, deadline on the monotonic clock), oldest first
        self._serving: set = set()  # sockets a worker holds
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(2 * max(1, int(workers)))  # serving and waiting
        self._queue: list = []
        self._queued = threading.Condition(self._lock)
        self._stopping = False
        self._workers = [threading.Thread(target=self._work, name=f"understudy-metrics-{i}", daemon=True)
                         for i in range(max(1, int(workers)))]
        for t in self._workers:
            t.start()
        self._thread = threading.Thread(target=self._watch, name="understudy-metrics", daemon=True)
        self._thread.start()

    def _watch(self):
        import time
        while not self._stopping:
            try:
                events = self._selector.select(timeout=min(1.0, self.idle_timeout_s))
            except OSError:
                break
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    continue
                if key.fileobj is self._sock:
                    self._accept(time.monotonic())
                else:
                    self._ready(key.fileobj)
            now = time.monotonic()
            for conn in [c for c, (_, deadline) in self._idle.items() if deadline <= now]:
                self._drop(conn)

    def _accept(self, now):
        while True:
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            while len(self._idle) >= self.max_idle:  # the oldest idle connection makes room
                self._drop(next(iter(self._idle)))
            try:
                self._selector.register(conn, self._read_event, None)
            except (OSError, ValueError):
                conn.close()
                continue
            self._idle[conn] = (addr, now + self.idle_timeout_s)

    def _drop(self, conn):
        self._idle.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError, OSError):
            pass
        conn.close()

    def _ready(self, conn):
        addr, _ = self._idle.pop(conn, (None, 0))
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError, OSError):
            pass
        if not self._slots.acquire(blocking=False):  # every worker busy and as many waiting
            conn.close()
            return
        with self._queued:
            self._queue.append((conn, addr))
            self._queued.notify()

    def _work(self):
        while True:
            with self._queued:
                while not self._queue and not self._stopping:
                    self._queued.wait()
                if self._stopping:
                    return
                conn, addr = self._queue.pop(0)
                self._serving.add(conn)
            try:
                conn.setblocking(True)
                self._handler(conn, addr, self)
            except Exception:  # noqa: BLE001 - a client that went away, a timeout: the next one is served
                pass
            finally:
                with self._lock:
                    self._serving.discard(conn)
                try:
                    conn.close()
                except OSError:
                    pass
                self._slots.release()

    def threads(self) -> int:
        """The threads this endpoint runs (alive)."""
        return sum(t.is_alive() for t in [self._thread, *self._workers])

    def stop(self):
        import socket
        with self._queued:
            self._stopping = True
            self._queued.notify_all()
            queued, self._queue = self._queue, []
            for conn in self._serving:  # a worker blocked on a slow client returns at once
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(10)
        for t in self._workers:
            t.join(10)
        for conn, _ in queued:
            conn.close()
        for conn in list(self._idle):
            self._drop(conn)
        self._selector.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()


def serve_metrics(port: int = 9464, host: str = DEFAULT_HOST, source=None, *,
                  top_keys: int = DEFAULT_TOP_KEYS, idle_timeout_s: float = 10.0) -> MetricsServer:
    """Serve /metrics on host:port (port 0: any free port, see .port). Loopback
    by default: exposing it further is the operator's decision. Raises
    MetricsUnavailable without prometheus_client, OSError when the port
    cannot be bound."""
    return MetricsServer(host, port, UnderstudyCollector(source, top_keys=top_keys), idle_timeout_s=idle_timeout_s)


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
        with _labels_lock:
            _labels.update(model_name=section.get("model_name"), engine=section.get("engine"))
        _watch_hf_models(True)
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
    _watch_hf_models(False)
    with _state_lock:
        active, _active = _active, None
        if active is None:
            return
        try:
            if isinstance(active, MetricsServer):
                active.stop()
            elif isinstance(active, MultiprocessExporter):
                active.stop()  # a last write of the live figures (never waits on the device)
            else:
                from prometheus_client import REGISTRY
                REGISTRY.unregister(active)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"understudy: stopping the metrics failed: {e}", RuntimeWarning, stacklevel=3)
        _state.update(mode=None)
