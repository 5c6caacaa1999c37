"""Merge understudy reports from many processes (tensor-parallel ranks, many
servers) into one, exactly: counts, histograms and sums add; quantiles,
weights, S and S_agg are recomputed from the merged figures by the same
rules the library uses."""
from __future__ import annotations

import math
from typing import Iterable

SUB_BITS = 4
SUB = 1 << SUB_BITS


def _lower(i: int) -> int:
    if i < SUB:
        return i
    e = (i - SUB) // SUB + SUB_BITS
    return (SUB + (i - SUB) % SUB) << (e - SUB_BITS)


def _width(i: int) -> int:
    return 1 if i < SUB else 1 << ((i - SUB) // SUB)


def quantile(buckets: dict, count: int, q: float) -> float:
    """The library's rule: the representative value of the bucket holding rank ceil(q * count)."""
    if count == 0:
        return 0.0
    rank = max(1, math.ceil(q * count))
    seen = 0
    for i in sorted(buckets):
        seen += buckets[i]
        if seen >= rank:
            return _lower(i) + (_width(i) - 1) / 2.0
    return 0.0


def _hist_add(acc: dict | None, h: dict) -> dict:
    acc = acc or {"buckets": {}, "sum": 0}
    for i, n in h.get("buckets", []):
        acc["buckets"][int(i)] = acc["buckets"].get(int(i), 0) + int(n)
    acc["sum"] += h.get("sum", 0)
    return acc


def _hist_json(acc: dict) -> dict:
    b = acc["buckets"]
    count = sum(b.values())
    return {"p50": quantile(b, count, 0.5), "p90": quantile(b, count, 0.9), "p99": quantile(b, count, 0.99),
            "count": count, "sum": acc["sum"], "buckets": [[i, b[i]] for i in sorted(b) if b[i]]}


def _median(v: list) -> float:
    if not v:
        return 0.0
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


ADD_SHAPE = ("calls", "timed", "captured", "timing_dropped", "device_time_ns", "est_device_time_ns")
ADD_SHADOW = ("calls", "verified", "passed", "failed", "skipped", "unverifiable")
ADD_ROOF = ("calls", "unscored", "tsol_ns_sum", "time_ns_sum", "candidate_calls", "candidate_tsol_ns_sum",
            "candidate_time_ns_sum")


class MergeError(ValueError):
    pass


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


def merge(reports: Iterable[dict]) -> dict:
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
                                           "candidate": o.get("candidate"), "shapes": {}})
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
            for s in o["shapes"]:
                t = m["shapes"].get(s["key"])
                if t is None:
                    t = m["shapes"][s["key"]] = {k: s[k] for k in ("key", "op", "mode", "phase", "device", "dtypes", "dims")
                                                 if k in s}
                    t.update({k: 0 for k in ADD_SHAPE})
                    t["_lat"] = None
                for k in ADD_SHAPE:
                    t[k] += s.get(k, 0)
                t["_lat"] = _hist_add(t["_lat"], s["latency_ns"])
                if s.get("mode") == "rolled_back":
                    t["mode"] = "rolled_back"
                elif s.get("mode") != t.get("mode") and t.get("mode") != "rolled_back":
                    t["mode"] = "mixed"  # the processes' routers were in different modes
                if "rollout" in s:
                    _rollout_add(t.setdefault("_rollout", None), s["rollout"], t)
                if "shadow" in s:
                    sh = t.setdefault("_shadow", {k: 0 for k in ADD_SHADOW} | {
                        "max_abs_err": 0.0, "max_rel_err": 0.0, "_cand": None, "rollback": None,
                        "aa": {"runs": 0, "mismatching": 0, "max_abs_err": 0.0, "max_rel_err": 0.0}})
                    for k in ADD_SHADOW:
                        sh[k] += s["shadow"].get(k, 0)
                    for k in ("max_abs_err", "max_rel_err"):
                        sh[k] = max(sh[k], s["shadow"].get(k, 0.0))
                    sh["_cand"] = _hist_add(sh["_cand"], s["shadow"]["candidate_latency_ns"])
                    aa = s["shadow"].get("aa", {})
                    for k in ("runs", "mismatching"):
                        sh["aa"][k] += aa.get(k, 0)
                    for k in ("max_abs_err", "max_rel_err"):
                        sh["aa"][k] = max(sh["aa"][k], aa.get(k, 0.0))
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

    total_est = sum(t["est_device_time_ns"] for m in ops.values() for t in m["shapes"].values())
    total_ph: dict = {}
    for m in ops.values():
        for t in m["shapes"].values():
            ph = t.get("phase", "unknown")
            total_ph[ph] = total_ph.get(ph, 0.0) + t["est_device_time_ns"]
    s_agg_ph = {p: 0.0 for p in total_ph}
    s_agg_cand_ph = {p: 0.0 for p in total_ph}
    out_ops, tot = [], {k: 0 for k in ("calls", "timed", "captured", "untracked", "shadow_calls", "verified",
                                       "failed", "rollbacks")}
    s_agg = s_agg_cand = 0.0
    for name, m in ops.items():
        shapes, s_vals, c_vals = [], [], []
        ph_est, ph_s, ph_c, ph_routes = {}, {}, {}, {}
        tsol_sum = time_sum = 0.0
        cand_routes = covered = 0
        for t in m["shapes"].values():
            s = {k: v for k, v in t.items() if not k.startswith("_")}
            s["weight"] = t["est_device_time_ns"] / total_est if total_est > 0 else 0.0
            s["latency_ns"] = _hist_json(t["_lat"])
            ph = t.get("phase", "unknown")
            ph_est[ph] = ph_est.get(ph, 0.0) + t["est_device_time_ns"]
            ph_routes[ph] = ph_routes.get(ph, 0) + 1
            if "_shadow" in t:
                sh = t["_shadow"]
                cand = _hist_json(sh["_cand"])
                p50p, p50c = s["latency_ns"]["p50"], cand["p50"]
                s["shadow"] = {k: sh[k] for k in ADD_SHADOW} | {
                    "max_abs_err": sh["max_abs_err"], "max_rel_err": sh["max_rel_err"],
                    "candidate_latency_ns": cand, "speedup": p50p / p50c if p50p > 0 and p50c > 0 else None,
                    "aa": sh["aa"], "rollback": sh["rollback"]}
                tot["shadow_calls"] += sh["calls"]
                tot["verified"] += sh["verified"]
                tot["failed"] += sh["failed"]
                tot["rollbacks"] += 1 if s["mode"] == "rolled_back" else 0
            if "_rollout" in t:
                s["rollout"] = t["_rollout"]
            if "_roof" in t:
                # S = mean T_SOL / median time, as the library computes it
                rf = t["_roof"]
                p50 = s["latency_ns"]["p50"]
                cp50 = s["shadow"]["candidate_latency_ns"]["p50"] if "shadow" in s else 0
                sp = rf["tsol_ns_sum"] / rf["calls"] / p50 if rf["calls"] and p50 > 0 else None
                sc = (rf["candidate_tsol_ns_sum"] / rf["candidate_calls"] / cp50
                      if rf["candidate_calls"] and cp50 > 0 and s["mode"] != "rolled_back" else None)
                s["roofline"] = {"hardware": rf["hardware"], "calls": rf["calls"],
                                 "tsol_ns_mean": rf["tsol_ns_sum"] / rf["calls"] if rf["calls"] else 0.0,
                                 **{k: rf[k] for k in ADD_ROOF if k != "calls"}, "S": sp, "S_candidate": sc}
                if "estimate" in rf:
                    s["roofline"]["estimate"] = rf["estimate"]
                if sp is not None:
                    s_vals.append(sp)
                    ph_s.setdefault(ph, []).append(sp)
                    tsol_sum += rf["tsol_ns_sum"]
                    time_sum += rf["time_ns_sum"]
                if "shadow" in s:
                    cand_routes += 1
                    if sc is not None:
                        c_vals.append(sc)
                        ph_c.setdefault(ph, []).append(sc)
                        covered += 1
            shapes.append(s)
            for k in ("calls", "timed", "captured"):
                tot[k] += t[k]
        est = sum(t["est_device_time_ns"] for t in m["shapes"].values())
        w = est / total_est if total_est > 0 else 0.0
        o = {"name": name, "mode": m["modes"].pop() if len(m["modes"]) == 1 else "mixed",
             "sample": m["src"].get("sample"), "definition": m["src"].get("definition"), "bindings": m["bindings"],
             "calls": sum(t["calls"] for t in m["shapes"].values()),
             "timed": sum(t["timed"] for t in m["shapes"].values()),
             "captured": sum(t["captured"] for t in m["shapes"].values()), "untracked": m["untracked"],
             "device_time_ns": sum(t["device_time_ns"] for t in m["shapes"].values()),
             "est_device_time_ns": est, "weight": w}
        if m["candidate"] is not None:
            o["candidate"] = m["candidate"]
        roof = {"scored_shapes": len(s_vals), "S": _median(s_vals),
                "S_weighted": tsol_sum / time_sum if time_sum > 0 else 0.0}
        if m["candidate"] is not None:
            roof["S_candidate"] = _median(c_vals)
            roof["coverage"] = covered / cand_routes if cand_routes else 0.0
            s_agg_cand += w * roof["S_candidate"]
        s_agg += w * roof["S"]
        o["roofline"] = roof
        o["phases"] = {}
        for ph in ph_routes:
            wp = ph_est[ph] / total_ph[ph] if total_ph.get(ph, 0) > 0 else 0.0
            x = {"est_device_time_ns": ph_est[ph], "weight": wp, "S": _median(ph_s.get(ph, []))}
            s_agg_ph[ph] += wp * x["S"]
            if m["candidate"] is not None:
                x["S_candidate"] = _median(ph_c.get(ph, []))
                s_agg_cand_ph[ph] += wp * x["S_candidate"]
            o["phases"][ph] = x
        o["shapes"] = shapes
        tot["untracked"] += m["untracked"]
        out_ops.append(o)
    first = reports[0]
    return {
        "schema": "understudy.report", "version": 1, "library_version": first.get("library_version"),
        "torch_version": first.get("torch_version"), "merged_from": len(reports),
        "hosts": sorted({r.get("host", "") for r in reports}),
        "started_unix_ms": min(r.get("started_unix_ms", 0) for r in reports),
        "generated_unix_ms": max(r.get("generated_unix_ms", 0) for r in reports),
        "histogram": first["histogram"], "operators": out_ops,
        "totals": tot | {"routes": sum(len(m["shapes"]) for m in ops.values()),
                         "internal_errors": sum(r["totals"].get("internal_errors", 0) for r in reports),
                         "est_device_time_ns": total_est, "S_agg": s_agg, "S_agg_candidate": s_agg_cand,
                         "phases": {p: {"est_device_time_ns": total_ph[p], "S_agg": s_agg_ph[p],
                                        "S_agg_candidate": s_agg_cand_ph[p]} for p in total_ph if total_ph[p] > 0}},
    }
