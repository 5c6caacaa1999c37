"""Prometheus text exposition of the report's figures, served on loopback.

    understudy.serve_metrics(port=9464)        # http://127.0.0.1:9464/metrics

A fleet aggregates with Prometheus itself: counters are per process and
labelled by operator, dispatcher op, shape key and phase; latency is exposed
as a summary (p50/p90/p99, sum, count). Scrapes read the live report without
waiting for the device (timings still in flight appear at the next scrape).
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kv) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kv.items()) + "}"


def _num(v) -> str:
    if v is None:
        return "NaN"
    return repr(float(v)) if isinstance(v, float) else str(v)


def metrics_text(rep: dict) -> str:
    """The exposition (text format 0.0.4) of one report: each metric family once,
    HELP and TYPE first, then all its samples."""
    families: dict = {}

    def metric(name, kind, help_, labels, value, suffix=""):
        fam = families.setdefault(name, {"kind": kind, "help": help_, "samples": []})
        fam["samples"].append(f"{name}{suffix}{labels} {_num(value)}")

    for o in rep["operators"]:
        ol = _labels(operator=o["name"])
        metric("understudy_operator_weight", "gauge", "share of the observed device time", ol, o["weight"])
        if "roofline" in o:
            metric("understudy_operator_roofline_s", "gauge", "production's S_i (T_SOL / time, median over shape keys)",
                   ol, o["roofline"]["S"])
            if "S_candidate" in o["roofline"]:
                metric("understudy_operator_candidate_roofline_s", "gauge", "the candidate's S_i", ol,
                       o["roofline"]["S_candidate"])
                metric("understudy_operator_candidate_coverage", "gauge",
                       "shape keys with a verified candidate / shape keys seen", ol, o["roofline"]["coverage"])
        for s in o["shapes"]:
            sl = dict(operator=o["name"], op=s["op"], key=s["key"], phase=s.get("phase", "unknown"),
                      device=s["device"])
            lb = _labels(**sl)
            metric("understudy_calls_total", "counter", "intercepted calls", lb, s["calls"])
            metric("understudy_timed_calls_total", "counter", "calls whose latency was measured", lb, s["timed"])
            metric("understudy_captured_calls_total", "counter", "calls made during CUDA graph capture", lb,
                   s["captured"])
            metric("understudy_measured_device_time_ns_total", "counter", "device time of the timed calls (ns)", lb,
                   s["device_time_ns"])
            metric("understudy_estimated_device_time_ns", "gauge",
                   "device time of all calls, the timed sum scaled by calls / timed (ns)", lb, s["est_device_time_ns"])
            lat = s["latency_ns"]
            empty = lat["count"] == 0
            for q, k in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
                metric("understudy_latency_ns", "summary", "production latency (ns)", _labels(**sl, quantile=q),
                       None if empty else lat[k])
            metric("understudy_latency_ns", "summary", "", lb, lat["sum"], "_sum")
            metric("understudy_latency_ns", "summary", "", lb, lat["count"], "_count")
            if "shadow" in s:
                sh = s["shadow"]
                for f in ("calls", "verified", "passed", "failed", "skipped"):
                    metric(f"understudy_shadow_{f}_total", "counter", f"shadow calls: {f}", lb, sh[f])
                metric("understudy_rolled_back", "gauge", "1 once the route's candidate was rolled back", lb,
                       1 if s.get("mode") == "rolled_back" else 0)
                if sh.get("speedup") is not None:
                    metric("understudy_candidate_speedup", "gauge", "production p50 / candidate p50", lb, sh["speedup"])
            ro = s.get("rollout")
            if ro is not None:
                for arm in ("production", "candidate"):
                    metric("understudy_served_total", "counter", "calls whose outputs an arm served (outside capture)",
                           _labels(**sl, arm=arm), ro["served"][arm])
                    metric("understudy_captured_arm_total", "counter", "graph captures by the arm captured",
                           _labels(**sl, arm=arm), ro["captured"][arm])
                metric("understudy_served_candidate_verified_total", "counter",
                       "candidate-served calls whose verification ran", lb, ro["served"]["candidate_verified"])
                metric("understudy_route_mode", "gauge", "1 for the mode the route's router is in",
                       _labels(**sl, mode=ro["mode"]), 1)
                if ro.get("canary") is not None:
                    metric("understudy_route_canary_share", "gauge", "the candidate's share of calls in canary mode",
                           lb, ro["canary"])
                metric("understudy_route_transitions_total", "counter", "mode transitions of the route", lb,
                       ro["transitions"])
            if s.get("roofline", {}).get("S") is not None:
                metric("understudy_roofline_s", "gauge", "production's S on the shape key", lb, s["roofline"]["S"])
    tot = rep["totals"]
    metric("understudy_internal_errors_total", "counter", "understudy failures (production served)", "",
           tot.get("internal_errors", 0))
    metric("understudy_untracked_calls_total", "counter", "calls beyond max_routes", "", tot.get("untracked", 0))
    if "S_agg" in tot:
        metric("understudy_s_agg", "gauge", "sum_i w_i S_i, production", _labels(phase="all"), tot["S_agg"])
        metric("understudy_s_agg_candidate", "gauge", "sum_i w_i S_i, candidates", _labels(phase="all"),
               tot["S_agg_candidate"])
        for ph, x in tot.get("phases", {}).items():
            metric("understudy_s_agg", "gauge", "", _labels(phase=ph), x["S_agg"])
            metric("understudy_s_agg_candidate", "gauge", "", _labels(phase=ph), x["S_agg_candidate"])
    out = []
    for name, fam in families.items():
        out.append(f"# HELP {name} {fam['help']}")
        out.append(f"# TYPE {name} {fam['kind']}")
        if fam["kind"] == "summary":  # quantiles, then _sum and _count, per label set
            out += [x for x in fam["samples"] if "quantile=" in x]
            out += [x for x in fam["samples"] if "quantile=" not in x]
        else:
            out += fam["samples"]
    return "\n".join(out) + "\n"


class MetricsServer:
    """A loopback HTTP server answering GET /metrics; stop() shuts it down."""

    def __init__(self, host: str, port: int, source):
        source_ = source

        class Handler(BaseHTTPRequestHandler):
            # an idle or slow client is dropped, not given a thread for ever
            timeout = 10

            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                try:
                    body = metrics_text(source_()).encode()
                    code = 200
                except Exception as e:  # understudy disabled, ...: say so, keep serving
                    body = f"# understudy: {e}\n".encode()
                    code = 503
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # the serving process's stderr is not ours
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="understudy-metrics", daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_metrics(port: int = 9464, host: str = "127.0.0.1", source=None) -> MetricsServer:
    """Serve /metrics on host:port (port 0: any free port, see .port). Loopback by
    default: exposing it further is the operator's decision."""
    if source is None:
        from . import report

        def source():
            return report(flush_timings=False)
    return MetricsServer(host, port, source)
