"""Reports as text tables, for people: the CLI's `report` and the demo.

Shape keys are printed whole (a column as wide as the longest), figures a
key does not have print as `-` (latency of a key none of whose calls was
timed, S of a key without a floor), operators that saw no call are left out
unless asked for, and each table ends with a legend of its columns."""
from __future__ import annotations


NO_SCORE_HINT = ("no hardware profile matches the device (a CPU has none shipped): "
                 "python -m understudy calibrate --quick --out DIR/cpu.json, then \"hardware\": {\"dir\": DIR}")

DASH = "-"

# A score above 1 means a call ran faster than the floor the hardware
# profile allows: the profile is below what the device achieved. Such a
# score is printed with this mark, never bare.
ABOVE_ROOF = "!"
ABOVE_ROOF_WORDS = "profile below achieved — recalibrate"
RECALIBRATE_HINT = "python -m understudy calibrate --out DIR/NAME.json, then \"hardware\": {\"dir\": DIR}"

REPORT_LEGEND = (
    ("mode", "what the operator's routes do (off, observe, shadow, canary, live, rolled_back)"),
    ("calls", "calls seen (past a thread's warm-up, 1 in key_every keyed stands for key_every: an estimate)"),
    ("capt", "calls made while a CUDA graph was captured (never timed)"),
    ("p50/p90/p99 us", "production's latency over the timed calls, microseconds"),
    ("weight", "share of the estimated device time"),
    ("S", "roofline floor T_SOL / median time; 1 is the hardware's floor"),
    (ABOVE_ROOF, f"after S: measured above its roof (S > 1): {ABOVE_ROOF_WORDS}"),
    (DASH, "not measured: none of the key's calls was timed (its first 3 and a sample after are by default; "
            "sample 0, or calls made during capture, time none), "
           "or no floor (no hardware profile, or a dtype without a peak)"),
)

VERDICT_LEGEND = (
    ("mode", "the route's mode now"),
    ("calls", "sampled calls that ran the candidate beside production"),
    ("verif", "calls whose outputs were compared: pass + fail"),
    ("skip", "sampled but not compared: no free slot, an error, over the shadow budget, or during capture "
             "(the report's skipped_by counts each)"),
    ("speedup", "production's median latency / the candidate's; - when either was not timed"),
)


def printable(text: str) -> str:
    """text with what a terminal would act on escaped as Python writes it:
    control characters (escape sequences, carriage returns, newlines),
    format characters that reorder text (bidirectional overrides), and any
    other character str.isprintable() refuses."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable_strings(obj):
    """obj (a report) with every string in it, keys too, made printable()."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {printable_strings(k): printable_strings(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [printable_strings(v) for v in obj]
    return obj


def _legend(rows) -> list:
    w = max(len(k) for k, _ in rows)
    return ["legend:"] + [f"  {k:<{w}}  {v}" for k, v in rows]


def _us(ns) -> str:
    return f"{ns / 1000.0:.1f}"


def score(v, fmt: str = ".3f") -> str:
    """An S: '-' when null, marked when above 1 (above its roof)."""
    return DASH if v is None else format(v, fmt) + (ABOVE_ROOF if v > 1 else "")


def above_roof_line(rep: dict):
    """The report's flag in one line, or None: how many shape keys were
    measured above their roof (production or candidate)."""
    n = int((rep.get("totals") or {}).get("above_roof") or 0)
    if not n:
        return None
    return (f"{ABOVE_ROOF} {n} shape key{'s' if n > 1 else ''} measured above {'their' if n > 1 else 'its'} roof "
            f"(S > 1): {ABOVE_ROOF_WORDS}: the hardware profile is below what the device achieved "
            f"({RECALIBRATE_HINT})")


def candidate_headline(rep: dict) -> list:
    """The candidates against production where both ran: S of the
    candidates over their own scored shape keys beside production's S over
    the same keys (each weighted by the keys' device time), overall and per
    operator with a candidate. [] when no operator has one."""
    tot = (rep.get("totals") or {}).get("candidate_routes")
    if not tot:
        return []

    def one(c):
        if not c.get("routes"):
            return "no shape key with a verified, scored candidate yet"
        n = int(c["routes"])
        return (f"S {score(c['S_candidate'])} against production's {score(c['S_production'])} on the same "
                f"{n} shape key{'s' if n > 1 else ''} ({100 * c['device_share']:.1f} % of device time)")

    lines = [f"candidates on their own routes: {one(tot)}"]
    per_op = [o for o in rep.get("operators", []) if (o.get("roofline") or {}).get("candidate_routes")]
    if len(per_op) > 1:
        lines += [f"  {o['name']} ({(o.get('candidate') or {}).get('name', '?')}): "
                  f"{one(o['roofline']['candidate_routes'])}" for o in per_op]
    return lines


def hidden_operators(rep: dict) -> list:
    """Names of the operators that saw no call, in report order."""
    return [o["name"] for o in rep.get("operators", []) if not o.get("calls")]


def format_report(rep: dict, *, max_shapes: int = 8, all_operators: bool = False, legend: bool = True) -> str:
    """A readable table of a report: operators by weight, their hottest shape
    keys. Operators without calls only with all_operators. Strings from the
    report are printed with control characters escaped (printable())."""
    rep = printable_strings(rep)
    lines = []
    tot = rep.get("totals", {})
    lines.append(f"understudy report (schema {rep.get('schema')} v{rep.get('version')}, "
                 f"torch {rep.get('torch_version') or '?'}, pid {rep.get('pid')})")
    lines.append(f"calls {int(tot.get('calls', 0))}  timed {int(tot.get('timed', 0))}  "
                 f"captured {int(tot.get('captured', 0))}  routes {int(tot.get('routes', 0))}  "
                 f"untracked {int(tot.get('untracked', 0))}  internal errors {int(tot.get('internal_errors', 0))}  "
                 f"device time {tot.get('est_device_time_ns', 0) / 1e6:.3f} ms"
                 # past a thread's warm-up: calls counted without a key, which the keys' estimated calls stand for
                 + (f"  (tallied {int(tot['tallied'])}: keys' calls estimated)" if tot.get("tallied") else ""))
    if tot.get("S_agg") is not None:
        cov = [f"{o['name']} {o['roofline']['coverage']:.2f}" for o in rep.get("operators", [])
               if "coverage" in o.get("roofline", {})]
        lines.append(f"roofline: S_agg production {score(tot['S_agg'])} over the scored "
                     f"{100 * tot.get('scored_share', 0):.1f} % of device time "
                     f"(S = T_SOL / median time; 1 is the hardware's floor)"
                     + (f"; candidate coverage: {', '.join(cov)}" if cov else ""))
        lines += candidate_headline(rep)
        flag = above_roof_line(rep)
        if flag:
            lines.append(flag)
    elif tot.get("calls"):
        lines.append("roofline: nothing scored (S_agg null): " + NO_SCORE_HINT)
    hidden = [] if all_operators else hidden_operators(rep)
    if hidden:
        lines.append(f"{len(hidden)} operators without calls not shown (--all shows them)")
    lines.append("")
    ops = sorted((o for o in rep.get("operators", []) if o["name"] not in hidden),
                 key=lambda o: (-o.get("weight", 0), -o.get("calls", 0), o["name"]))
    rows = []  # (label, mode, calls, capt, p50, p90, p99, weight, S)
    for op in ops:
        roof = op.get("roofline", {})
        rows.append((op["name"], op["mode"], str(int(op["calls"])), str(int(op["captured"])), "", "", "",
                     f"{op['weight']:.3f}" if op.get("timed") else DASH,
                     score(roof["S"]) if roof.get("scored_shapes") else DASH))
        shapes = sorted(op.get("shapes", []), key=lambda s: (-s.get("weight", 0), -s.get("calls", 0), s["key"]))
        for s in shapes[:max_shapes]:
            lat = s["latency_ns"]
            timed = bool(s.get("timed"))
            rows.append(("  " + s["key"], "", str(int(s["calls"])), str(int(s["captured"])),
                         *(_us(lat[q]) if timed else DASH for q in ("p50", "p90", "p99")),
                         f"{s['weight']:.3f}" if timed else DASH,
                         score(s.get("roofline", {}).get("S"))))
        if len(shapes) > max_shapes:
            rows.append((f"  ... {len(shapes) - max_shapes} more shape keys (--shapes N shows more)",) + ("",) * 8)
    head = ("operator / shape key", "mode", "calls", "capt", "p50 us", "p90 us", "p99 us", "weight", "S")
    kw = max([len(head[0])] + [len(r[0]) for r in rows if not r[0].lstrip().startswith("...")])
    widths = [kw] + [max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i])
                     for i in range(1, len(head))]

    def line(r):
        return " ".join([f"{r[0]:<{widths[0]}}"] + [f"{c:>{w}}" for c, w in zip(r[1:], widths[1:])]).rstrip()

    lines.append(line(head))
    lines.append("-" * len(line(head)))
    lines += [line(r) for r in rows]
    limited = [s for op in ops for s in op.get("shapes", [])
               if (s.get("graph") or {}).get("status") == "observe-only"]
    if limited:  # every one, however many shapes the table shows
        lines += ["", "observe-only under CUDA graphs (no verdict flows in their replays):"]
        lines += [f"  {s['key']}: {s['graph']['reason']}" for s in limited]
    if legend:
        lines += [""] + _legend(REPORT_LEGEND)
    return "\n".join(lines)


def rollback_line(ev: dict) -> str:
    """The rollback evidence of a route in one sentence."""
    what = f"rolled back at shadow call {int(ev['shadow_call'])}: {ev['reason']}"
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
    return what


def format_verdicts(rep: dict, *, legend: bool = True) -> str:
    """Shadow verdicts per route: verified / passed / failed, speedup, rollbacks with evidence
    (strings from the report with control characters escaped)."""
    rep = printable_strings(rep)
    pairs = [(op, s) for op in rep.get("operators", []) for s in op.get("shapes", []) if "shadow" in s]
    if not pairs:
        return ""
    head = ("shadow verdicts: route", "candidate", "mode", "calls", "verif", "pass", "fail", "skip", "speedup")
    rows = []
    for op, s in pairs:
        sh = s["shadow"]
        rows.append((s["key"], op.get("candidate", {}).get("name", "?"), s.get("mode", "?"),
                     *(str(int(sh[k])) for k in ("calls", "verified", "passed", "failed", "skipped")),
                     f"{sh['speedup']:.2f}x" if sh.get("speedup") else DASH))
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]

    def line(r):
        return " ".join([f"{r[0]:<{widths[0]}}", f"{r[1]:<{widths[1]}}"]
                        + [f"{c:>{w}}" for c, w in zip(r[2:], widths[2:])]).rstrip()

    lines = candidate_headline(rep)
    lines += ([""] if lines else []) + [line(head), "-" * len(line(head))]
    for (op, s), r in zip(pairs, rows):
        lines.append(line(r))
        ev = s["shadow"].get("rollback")
        if ev:
            lines.append("  " + rollback_line(ev))
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
        pr = (ro or {}).get("promotion") or {}
        if pr.get("state") in ("rejected", "inconclusive", "dry_run") and pr.get("note"):
            # a decision short of a move, its reason first: "inconclusive: A/A spread 0.12 > delta 0.05; n 400: ..."
            lines.append(f"  promotion {pr['state']}: {pr['note']}")
    if legend:
        lines += [""] + _legend(VERDICT_LEGEND)
    return "\n".join(lines)
