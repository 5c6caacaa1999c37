"""Merge understudy reports from many processes (tensor-parallel ranks, many
servers) into one, exactly.

Only additive figures are combined here: counts, sums and histogram buckets
add, maxima take the largest; a route's mode is the common one,
"rolled_back" when any process rolled it back, else "mixed"; the earliest
rollback evidence and the latest rollout transition are kept. Every derived
figure (quantiles, device-time estimates, weights, speedups, S and S_agg) is
then computed by the library from the combined figures (understudy.derive,
that is ust_report_derive), by the one set of rules the in-process report
uses, so a merged report and an in-process one agree by construction.
Derived figures of the input reports are never read."""
from __future__ import annotations

from typing import Iterable

from . import derive


def _hist_add(acc: dict | None, h: dict) -> dict:
    acc = acc or {"buckets": {}, "sum": 0}
    for i, n in h.get("buckets", []):
        acc["buckets"][int(i)] = acc["buckets"].get(int(i), 0) + int(n)
    acc["sum"] += h.get("sum", 0)
    return acc


def _hist_json(acc: dict) -> dict:
    """The additive part of a histogram: its sum and its buckets, ascending (the order the library reads)."""
    b = acc["buckets"]
    return {"sum": acc["sum"], "buckets": [[i, b[i]] for i in sorted(b) if b[i]]}


ADD_SHAPE = ("calls", "estimated", "captured", "timing_dropped", "first_timed", "first_time_ns", "steady_timed",
             "steady_time_ns", "steady_calls", "kernel_timed", "kernel_span_ns", "replayed", "held_timed",
             "hold_expired")
ADD_SHADOW = ("calls", "verified", "passed", "failed", "skipped", "unverifiable", "bytes_copied", "overdue",
              "process_passed")
ADD_ROOF = ("calls", "unscored", "tsol_ns_sum", "time_ns_sum", "candidate_calls", "candidate_tsol_ns_sum",
            "candidate_time_ns_sum", "work_calls", "flops_sum", "bytes_sum", "scored_by_callees")


class MergeError(ValueError):
    """The reports do not combine; the message says which and why."""


def _rollout_add(acc, ro, t):
    """Fold one process's rollout figures of a route into t["_rollout"]:
    served and captured calls and transitions add; the mode is the common
    one, else "mixed"; the last transition is the latest; a promotion's
    state is per process and left out."""
    if acc is None:
        acc = t["_rollout"] = {"mode": ro["mode"], "served": {k: 0 for k in ro["served"]},
                               "captured": {k: 0 for k in ro["captured"]}, "transitions": 0}
    elif acc["mode"] != ro["mode"]:
        acc["mode"] = "mixed"
    for part in ("served", "captured"):
        for k, v in ro[part].items():
            acc[part][k] = acc[part].get(k, 0) + v
    acc["transitions"] += ro["transitions"]
    last = ro.get("last_transition")
    if last and (acc.get("last_transition") is None or last["unix_ms"] > acc["last_transition"]["unix_ms"]):
        acc["last_transition"] = last


TIMER_ADD = ("windows", "window_ns", "elapsed_ns", "yields", "windows_cut", "kernels", "kernel_ns", "attributed_kernels",
             "attributed_ns", "calls_timed", "calls_dropped", "calls_empty", "calls_replayed", "captured_unmapped", "records_lost",
             "graph_unknown_kernels", "graph_unknown_ns", "graph_own_kernels", "graph_own_ns")


def _timer_merge(reports: list) -> dict:
    """The timer sections added up: counts summed, the unattributed kernels
    summed by name (the top ten kept); kind "cupti" when any report's was."""
    timers = [r["timer"] for r in reports if isinstance(r.get("timer"), dict)]
    out: dict = {"kind": "cupti" if any(t.get("kind") == "cupti" for t in timers)
                 else (timers[0].get("kind", "events") if timers else "events")}
    for k in TIMER_ADD:
        out[k] = sum(t.get(k, 0) for t in timers)
    names: dict = {}
    for t in timers:
        for u in t.get("unattributed", []):
            acc = names.setdefault(u["name"], {"name": u["name"], "ns": 0, "kernels": 0})
            acc["ns"] += u.get("ns", 0)
            acc["kernels"] += u.get("kernels", 0)
    out["unattributed"] = sorted(names.values(), key=lambda u: -u["ns"])[:10]
    phases: dict = {}
    for t in timers:
        for name, ph in (t.get("phases") or {}).items():
            acc = phases.setdefault(name, {"kernel_ns": 0, "attributed_ns": 0})
            acc["kernel_ns"] += ph.get("kernel_ns", 0)
            acc["attributed_ns"] += ph.get("attributed_ns", 0)
    if phases:
        out["phases"] = phases
    return out


def merge(reports: Iterable[dict]) -> dict:
    """One report from the last reports of many processes (borrowed, not
    modified). Raises MergeError for inputs that do not combine (not a
    report, another histogram scheme, two snapshots of one process, different
    candidates for an operator), and UnderstudyError when the library that
    derives the figures cannot be loaded."""
    reports = list(reports)
    if not reports:
        raise MergeError("nothing to merge")
    for i, r in enumerate(reports):
        if r.get("schema") != "understudy.report" or r.get("version") != 1:
            raise MergeError(f"report {i} is not an understudy.report v1")
        if r.get("histogram", {}).get("scheme") != reports[0]["histogram"]["scheme"]:
            raise MergeError(f"report {i} uses histogram scheme {r.get('histogram', {}).get('scheme')!r}")
    seen = {}
    for i, r in enumerate(reports):
        ident = (r.get("host"), r.get("pid"), r.get("started_unix_ms"))
        if ident in seen:
            raise MergeError(f"reports {seen[ident]} and {i} come from the same process (host {ident[0]}, pid "
                             f"{ident[1]}, started {ident[2]}): a process's reports are snapshots, merge only its last")
        seen[ident] = i
    ops: dict = {}
    for r in reports:
        for o in r["operators"]:
            m = ops.setdefault(o["name"], {"src": o, "modes": set(), "bindings": [], "untracked": 0,
                                           "tallied": 0, "candidate": o.get("candidate"), "shapes": {}})
            m["modes"].add(o["mode"])
            cand = o.get("candidate")
            if cand is not None:
                if m["candidate"] is None:
                    m["candidate"] = cand
                elif (m["candidate"].get("name"), m["candidate"].get("sha256")) != (cand.get("name"), cand.get("sha256")):
                    raise MergeError(f"operator '{o['name']}' ran different candidates ({m['candidate'].get('name')} "
                                     f"and {cand.get('name')}): their figures do not combine")
            m["bindings"] += [b for b in o["bindings"] if b not in m["bindings"]]
            m["untracked"] += o.get("untracked", 0)
            m["tallied"] += o.get("tallied", 0)
            for s in o["shapes"]:
                t = m["shapes"].get(s["key"])
                if t is None:
                    t = m["shapes"][s["key"]] = {k: s[k] for k in ("key", "op", "mode", "phase", "device", "dtypes", "dims")
                                                 if k in s}
                    t.update({k: 0 for k in ADD_SHAPE})
                    t["_lat"] = None
                for k in ADD_SHAPE:
                    t[k] += s.get(k, 0)
                g = t.setdefault("graph", {"unseen_kernels": 0, "unseen_ns": 0, "changed": 0, "dropped": 0})
                for k in ("unseen_kernels", "unseen_ns", "changed", "dropped"):
                    g[k] += (s.get("graph") or {}).get(k, 0)  # status and reason are derived again
                t["_lat"] = _hist_add(t["_lat"], s["latency_ns"])
                if s.get("mode") == "rolled_back":
                    t["mode"] = "rolled_back"
                elif s.get("mode") != t.get("mode") and t.get("mode") != "rolled_back":
                    t["mode"] = "mixed"  # the processes' routers were in different modes
                if "rollout" in s:
                    _rollout_add(t.setdefault("_rollout", None), s["rollout"], t)
                if "shadow" in s:
                    sh = t.setdefault("_shadow", {k: 0 for k in ADD_SHADOW} | {
                        "max_abs_err": 0.0, "max_rel_err": 0.0, "_cand": None, "rollback": None, "skipped_by": {},
                        "aa": {"runs": 0, "mismatching": 0, "max_abs_err": 0.0, "max_rel_err": 0.0},
                        "graph": {"shadowed": 0, "plain": 0, "beside": 0, "ungated": 0, "exposed": 0, "reason": None}})
                    for k in ADD_SHADOW:
                        sh[k] += s["shadow"].get(k, 0)
                    for k in ("max_abs_err", "max_rel_err"):
                        sh[k] = max(sh[k], s["shadow"].get(k, 0.0))
                    sh["_cand"] = _hist_add(sh["_cand"], s["shadow"]["candidate_latency_ns"])
                    aa = s["shadow"].get("aa", {})
                    for k in ("runs", "mismatching"):
                        sh["aa"][k] += aa.get(k, 0)
                    for k, n in s["shadow"].get("skipped_by", {}).items():
                        sh["skipped_by"][k] = sh["skipped_by"].get(k, 0) + n
                    for k in ("max_abs_err", "max_rel_err"):
                        sh["aa"][k] = max(sh["aa"][k], aa.get(k, 0.0))
                    gr = s["shadow"].get("graph") or {}
                    for k in ("shadowed", "plain", "beside", "ungated", "exposed"):
                        sh["graph"][k] += gr.get(k, 0)
                    sh["graph"]["reason"] = sh["graph"]["reason"] or gr.get("reason")
                    ev = s["shadow"].get("rollback")
                    if ev and (sh["rollback"] is None or ev["unix_ms"] < sh["rollback"]["unix_ms"]):
                        sh["rollback"] = ev
                if "roofline" in s:
                    rf = t.setdefault("_roof", {k: 0 for k in ADD_ROOF} | {"hardware": None})
                    for k in ADD_ROOF:
                        rf[k] += s["roofline"].get(k, 0)
                    rf["hardware"] = rf["hardware"] or s["roofline"].get("hardware")
                    if "estimate" in s["roofline"]:
                        rf["estimate"] = s["roofline"]["estimate"]

    out_ops = []
    for name, m in ops.items():
        shapes = []
        for t in m["shapes"].values():
            s = {k: v for k, v in t.items() if not k.startswith("_")}
            s["latency_ns"] = _hist_json(t["_lat"])
            if "_roof" in t:
                s["roofline"] = dict(t["_roof"])
            if "_shadow" in t:
                sh = t["_shadow"]
                s["shadow"] = {k: sh[k] for k in ADD_SHADOW} | {
                    "skipped_by": sh["skipped_by"], "max_abs_err": sh["max_abs_err"], "max_rel_err": sh["max_rel_err"],
                    "candidate_latency_ns": _hist_json(sh["_cand"]), "aa": sh["aa"], "graph": sh["graph"],
                    "rollback": sh["rollback"]}
            if "_rollout" in t:
                s["rollout"] = t["_rollout"]
            shapes.append(s)
        o = {"name": name, "mode": m["modes"].pop() if len(m["modes"]) == 1 else "mixed",
             "sample": m["src"].get("sample"), "definition": m["src"].get("definition"), "bindings": m["bindings"],
             "untracked": m["untracked"], "tallied": m["tallied"]}
        for k in ("sample_steady", "steady_after", "key_every", "key_after"):  # the first report's, as its sample
            if k in m["src"]:
                o[k] = m["src"][k]
        if m["candidate"] is not None:
            o["candidate"] = m["candidate"]
        o["shapes"] = shapes
        out_ops.append(o)
    first = reports[0]
    combined = {
        "schema": "understudy.report", "version": 1, "library_version": first.get("library_version"),
        "torch_version": first.get("torch_version"), "merged_from": len(reports),
        "hosts": sorted({r.get("host", "") for r in reports}),
        "started_unix_ms": min(r.get("started_unix_ms", 0) for r in reports),
        "generated_unix_ms": max(r.get("generated_unix_ms", 0) for r in reports),
        "histogram": first["histogram"], "operators": out_ops,
        "hardware": list({h["name"]: h for r in reports for h in r.get("hardware", [])}.values()),
        "timer": _timer_merge(reports),
        "graphs": {k: sum((r.get("graphs") or {}).get(k, 0) for r in reports)
                   for k in ("sites", "live", "open", "unknown", "lost", "launched", "refused", "gated",
                             "gated_replays", "gate_failed", "hosted", "host_starts", "unseen")},
        "totals": {"untracked": sum(m["untracked"] for m in ops.values()),
                   "tallied": sum(m["tallied"] for m in ops.values()),
                   "internal_errors": sum(r["totals"].get("internal_errors", 0) for r in reports)},
    }
    return derive(combined)
