"""Reports as text tables, for people: the CLI's `report` and the demo."""
from __future__ import annotations


def _us(ns: float) -> str:
    return f"{ns / 1000.0:9.1f}"


def format_report(rep: dict, *, max_shapes: int = 8) -> str:
    """A readable table of a report: operators by weight, their hottest shape keys."""
    lines = []
    tot = rep.get("totals", {})
    lines.append(f"understudy report (schema {rep.get('schema')} v{rep.get('version')}, "
                 f"torch {rep.get('torch_version') or '?'}, pid {rep.get('pid')})")
    lines.append(f"calls {int(tot.get('calls', 0))}  timed {int(tot.get('timed', 0))}  "
                 f"captured {int(tot.get('captured', 0))}  routes {int(tot.get('routes', 0))}  "
                 f"untracked {int(tot.get('untracked', 0))}  internal errors {int(tot.get('internal_errors', 0))}  "
                 f"device time {tot.get('est_device_time_ns', 0) / 1e6:.3f} ms")
    if tot.get("S_agg"):
        cov = [f"{o['name']} {o['roofline']['coverage']:.2f}" for o in rep.get("operators", [])
               if "coverage" in o.get("roofline", {})]
        lines.append(f"roofline: S_agg production {tot['S_agg']:.3f}, candidates {tot.get('S_agg_candidate', 0):.3f} "
                     f"(S = T_SOL / median time; 1 is the hardware's floor)"
                     + (f"; candidate coverage: {', '.join(cov)}" if cov else ""))
    lines.append("")
    head = (f"{'operator / shape key':<64} {'mode':>8} {'calls':>8} {'capt':>6} {'p50 us':>9} {'p90 us':>9} "
            f"{'p99 us':>9} {'weight':>7} {'S':>7}")
    lines.append(head)
    lines.append("-" * len(head))
    ops = sorted(rep.get("operators", []), key=lambda o: (-o.get("weight", 0), -o.get("calls", 0)))
    for op in ops:
        roof = op.get("roofline", {})
        s_op = f"{roof['S']:7.3f}" if roof.get("scored_shapes") else f"{'-':>7}"
        lines.append(f"{op['name']:<64} {op['mode']:>8} {int(op['calls']):>8} {int(op['captured']):>6} "
                     f"{'':>9} {'':>9} {'':>9} {op['weight']:>7.3f} {s_op}")
        shapes = sorted(op.get("shapes", []), key=lambda s: (-s.get("weight", 0), -s.get("calls", 0)))
        for s in shapes[:max_shapes]:
            lat = s["latency_ns"]
            key = s["key"]
            if len(key) > 62:
                key = key[:59] + "..."
            sr = s.get("roofline", {}).get("S")
            lines.append(f"  {key:<62} {'':>8} {int(s['calls']):>8} {int(s['captured']):>6} "
                         f"{_us(lat['p50'])} {_us(lat['p90'])} {_us(lat['p99'])} {s['weight']:>7.3f} "
                         + (f"{sr:7.3f}" if sr is not None else f"{'-':>7}"))
        if len(shapes) > max_shapes:
            lines.append(f"  ... {len(shapes) - max_shapes} more shape keys")
    return "\n".join(lines)


def format_verdicts(rep: dict) -> str:
    """Shadow verdicts per route: verified / passed / failed, speedup, rollbacks with evidence."""
    rows = [(op, s) for op in rep.get("operators", []) for s in op.get("shapes", []) if "shadow" in s]
    if not rows:
        return ""
    lines = []
    head = (f"{'shadow verdicts: route':<58} {'candidate':<34} {'mode':>11} {'calls':>6} {'verif':>6} "
            f"{'pass':>5} {'fail':>5} {'skip':>5} {'speedup':>8}")
    lines.append(head)
    lines.append("-" * len(head))
    for op, s in rows:
        sh = s["shadow"]
        key = s["key"] if len(s["key"]) <= 58 else s["key"][:55] + "..."
        cand = op.get("candidate", {}).get("name", "?")
        cand = cand if len(cand) <= 34 else cand[:31] + "..."
        speed = f"{sh['speedup']:.2f}x" if sh.get("speedup") else "-"
        lines.append(f"{key:<58} {cand:<34} {s.get('mode', '?'):>11} {int(sh['calls']):>6} {int(sh['verified']):>6} "
                     f"{int(sh['passed']):>5} {int(sh['failed']):>5} {int(sh['skipped']):>5} {speed:>8}")
        ev = sh.get("rollback")
        if ev:
            what = f"  rolled back at shadow call {int(ev['shadow_call'])}: {ev['reason']}"
            if ev.get("output"):
                what += f" in {ev['output']}"
            if "mismatches" in ev:
                what += (f", {int(ev['mismatches'])} of {int(ev['elements'])} elements outside atol {ev['atol']:g} "
                         f"rtol {ev['rtol']:g}, max abs err {ev['max_abs_err']:.3g}")
                fm = ev.get("first_mismatch")
                if fm:
                    what += f", first at {fm['index']}"
            if ev.get("message"):
                what += f" ({ev['message']})"
            if ev.get("while_serving"):
                what += (f"; while serving: {int(ev.get('served_before_verdict', 0))} calls served by the candidate "
                         f"from the failing one until the verdict")
            lines.append(what)
        ro = s.get("rollout")
        if ro and (ro["served"]["candidate"] or ro.get("last_transition")):
            sv = ro["served"]
            what = (f"  served: candidate {int(sv['candidate'])} ({int(sv['candidate_verified'])} verified), "
                    f"production {int(sv['production'])}")
            last = ro.get("last_transition")
            if last:
                what += f"; {int(ro['transitions'])} transitions, last {last['from']} -> {last['to']} by {last['by']}"
                if last.get("reason"):
                    what += f" ({last['reason']})"
            lines.append(what)
    return "\n".join(lines)
