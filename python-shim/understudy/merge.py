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
Derived figures of the input reports are never read.

merge_files() reads the reports one at a time, each shape as it comes
(the report's text is walked, never held as one object graph), so memory
follows one report's text and the merged figures, not the number of
reports; the merged report is written as the library prints it."""
from __future__ import annotations

import json
import os
import stat
from typing import Iterable, Iterator, Optional

from . import derive


def _hist_add(acc: dict | None, h: dict, field: str) -> dict:
    acc = acc or {"buckets": {}, "sum": 0}
    if not isinstance(h, dict):
        raise MergeError(f"'{field}' is {_show(h)}, not a histogram")
    for pair in h.get("buckets", []):
        if not isinstance(pair, list) or len(pair) != 2:
            raise MergeError(f"'{field}.buckets' holds {_show(pair)}, not an [index, count] pair")
        i, n = (int(_n(x, field + ".buckets")) for x in pair)
        acc["buckets"][i] = acc["buckets"].get(i, 0) + n
    acc["sum"] += _n(h.get("sum"), field + ".sum")
    return acc


def _hist_json(acc: dict) -> dict:
    """The additive part of a histogram: its sum and its buckets, ascending (the order the library reads)."""
    b = acc["buckets"]
    return {"sum": acc["sum"], "buckets": [[i, b[i]] for i in sorted(b) if b[i]]}


ADD_SHAPE = ("calls", "estimated", "captured", "timing_dropped", "kernel_lost", "pair_failed", "first_timed",
             "first_time_ns", "steady_timed", "steady_time_ns", "steady_calls", "kernel_timed", "kernel_span_ns",
             "kernels", "replayed", "held_timed", "hold_expired")
ADD_SHADOW = ("calls", "verified", "passed", "failed", "skipped", "unverifiable", "bytes_copied", "overdue",
              "process_passed")
ADD_ROOF = ("calls", "unscored", "tsol_ns_sum", "time_ns_sum", "candidate_calls", "candidate_tsol_ns_sum",
            "candidate_time_ns_sum", "work_calls", "flops_sum", "bytes_sum", "scored_by_callees")


class MergeError(ValueError):
    """The reports do not combine; the message says which and why."""


def _n(v, field: str):
    """v, a count or a sum (absent: 0); MergeError naming the field otherwise."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MergeError(f"'{field}' is {_show(v)}, not a number")
    return v


def _show(v) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


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
            acc[part][k] = acc[part].get(k, 0) + _n(v, f"rollout.{part}.{k}")
    acc["transitions"] += _n(ro.get("transitions"), "rollout.transitions")
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


class _Merger:
    """The figures of the reports added so far (add() one at a time)."""

    def __init__(self):
        self.n = 0
        self.first: Optional[dict] = None
        self.seen: dict = {}
        self.ops: dict = {}
        self.heads: list = []  # per report: host, started, generated, hardware, timer, graphs, internal errors

    def add(self, head: dict, operators: Iterable) -> None:
        """One report: its top-level fields but operators (head), and its
        operators as (operator fields but shapes, its shapes), each iterated once."""
        i = self.n
        if head.get("schema") != "understudy.report" or head.get("version") != 1:
            raise MergeError(f"report {i} is not an understudy.report v1")
        if not isinstance(head.get("histogram"), dict):
            raise MergeError(f"report {i} has no histogram scheme")
        if self.first is None:
            self.first = head
        elif head["histogram"].get("scheme") != self.first["histogram"].get("scheme"):
            raise MergeError(f"report {i} uses histogram scheme {head['histogram'].get('scheme')!r}")
        ident = (head.get("host"), head.get("pid"), head.get("started_unix_ms"))
        if ident in self.seen:
            raise MergeError(f"reports {self.seen[ident]} and {i} come from the same process (host {ident[0]}, pid "
                             f"{ident[1]}, started {ident[2]}): a process's reports are snapshots, merge only its last")
        self.seen[ident] = i
        self.n += 1
        self.heads.append(None)
        self.set_head(head)
        where = ""
        try:
            for o, shapes in operators:
                where = f"operator {o.get('name')!r}"
                self._operator(o, shapes)
        except MergeError as e:
            raise MergeError(f"report {i}: {where}: {e}" if where else f"report {i}: {e}") from None
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise MergeError(f"report {i}: {where or 'its operators'}: malformed ({type(e).__name__}: {e})") from None

    def set_head(self, head: dict) -> None:
        """The last report's fields beside its operators (again once those
        after its operators are read)."""
        try:
            totals = head.get("totals") if isinstance(head.get("totals"), dict) else {}
            hardware = head.get("hardware", [])
            if not isinstance(hardware, list) or not all(isinstance(h, dict) and "name" in h for h in hardware):
                raise MergeError(f"'hardware' is {_show(hardware)}, not a list of profiles")
            self.heads[-1] = {
                "host": head.get("host", ""), "started": _n(head.get("started_unix_ms"), "started_unix_ms"),
                "generated": _n(head.get("generated_unix_ms"), "generated_unix_ms"), "hardware": hardware,
                "timer": head.get("timer"), "graphs": head.get("graphs") if isinstance(head.get("graphs"), dict) else {},
                "internal_errors": _n(totals.get("internal_errors"), "totals.internal_errors")}
        except MergeError as e:
            raise MergeError(f"report {self.n - 1}: {e}") from None

    def _operator(self, o: dict, shapes: Iterable) -> None:
        m = self.ops.setdefault(o["name"], {"src": o, "modes": set(), "bindings": [], "untracked": 0,
                                            "tallied": 0, "candidate": o.get("candidate"), "shapes": {}})
        m["modes"].add(o["mode"])
        cand = o.get("candidate")
        if cand is not None:
            if m["candidate"] is None:
                m["candidate"] = cand
            elif (m["candidate"].get("name"), m["candidate"].get("sha256")) != (cand.get("name"), cand.get("sha256")):
                raise MergeError(f"ran different candidates ({m['candidate'].get('name')} and {cand.get('name')}): "
                                 f"their figures do not combine")
        m["bindings"] += [b for b in o["bindings"] if b not in m["bindings"]]
        m["untracked"] += _n(o.get("untracked"), "untracked")
        m["tallied"] += _n(o.get("tallied"), "tallied")
        for s in shapes:
            try:
                self._shape(m, s)
            except MergeError as e:
                raise MergeError(f"shape {s.get('key')!r}: {e}") from None

    @staticmethod
    def _shape(m: dict, s: dict) -> None:
        t = m["shapes"].get(s["key"])
        if t is None:
            t = m["shapes"][s["key"]] = {k: s[k] for k in ("key", "op", "mode", "phase", "device", "dtypes", "dims")
                                         if k in s}
            t.update({k: 0 for k in ADD_SHAPE})
            t["_lat"] = None
        for k in ADD_SHAPE:
            t[k] += _n(s.get(k), k)
        g = t.setdefault("graph", {"unseen_kernels": 0, "unseen_ns": 0, "changed": 0, "dropped": 0})
        for k in ("unseen_kernels", "unseen_ns", "changed", "dropped"):
            g[k] += _n((s.get("graph") or {}).get(k), "graph." + k)  # status and reason are derived again
        t["_lat"] = _hist_add(t["_lat"], s["latency_ns"], "latency_ns")
        if s.get("mode") == "rolled_back":
            t["mode"] = "rolled_back"
        elif s.get("mode") != t.get("mode") and t.get("mode") != "rolled_back":
            t["mode"] = "mixed"  # the processes' routers were in different modes
        if "rollout" in s:
            _rollout_add(t.setdefault("_rollout", None), s["rollout"], t)
        if "shadow" in s:
            sh = t.setdefault("_shadow", {k: 0 for k in ADD_SHADOW} | {
                "max_abs_err": 0.0, "max_rel_err": 0.0, "_cand": None, "rollback": None, "repro": None, "skipped_by": {},
                "aa": {"runs": 0, "mismatching": 0, "max_abs_err": 0.0, "max_rel_err": 0.0},
                "graph": {"shadowed": 0, "plain": 0, "beside": 0, "ungated": 0, "exposed": 0, "reason": None}})
            for k in ADD_SHADOW:
                sh[k] += _n(s["shadow"].get(k), "shadow." + k)
            for k in ("max_abs_err", "max_rel_err"):
                sh[k] = max(sh[k], _n(s["shadow"].get(k), "shadow." + k))
            sh["_cand"] = _hist_add(sh["_cand"], s["shadow"]["candidate_latency_ns"], "shadow.candidate_latency_ns")
            aa = s["shadow"].get("aa", {})
            for k in ("runs", "mismatching"):
                sh["aa"][k] += _n(aa.get(k), "shadow.aa." + k)
            for k, n in s["shadow"].get("skipped_by", {}).items():
                sh["skipped_by"][k] = sh["skipped_by"].get(k, 0) + _n(n, "shadow.skipped_by." + k)
            for k in ("max_abs_err", "max_rel_err"):
                sh["aa"][k] = max(sh["aa"][k], _n(aa.get(k), "shadow.aa." + k))
            gr = s["shadow"].get("graph") or {}
            for k in ("shadowed", "plain", "beside", "ungated", "exposed"):
                sh["graph"][k] += _n(gr.get(k), "shadow.graph." + k)
            sh["graph"]["reason"] = sh["graph"]["reason"] or gr.get("reason")
            ev = s["shadow"].get("rollback")
            kept = s["shadow"].get("repro")
            if ev and (sh["rollback"] is None or _n(ev["unix_ms"], "shadow.rollback.unix_ms") < sh["rollback"]["unix_ms"]):
                sh["rollback"] = ev
                sh["repro"] = kept or sh["repro"]  # the earliest rollback's kept call, else any
            elif kept and sh["repro"] is None:
                sh["repro"] = kept
        if "roofline" in s:
            rf = t.setdefault("_roof", {k: 0 for k in ADD_ROOF} | {"hardware": None})
            for k in ADD_ROOF:
                rf[k] += _n(s["roofline"].get(k), "roofline." + k)
            rf["hardware"] = rf["hardware"] or s["roofline"].get("hardware")
            if "estimate" in s["roofline"]:
                rf["estimate"] = s["roofline"]["estimate"]

    def combined(self) -> dict:
        """The merged additive report, to derive."""
        if self.n == 0:
            raise MergeError("nothing to merge")
        out_ops = []
        for name, m in self.ops.items():
            shapes = []
            for t in m["shapes"].values():
                s = {k: v for k, v in t.items() if not k.startswith("_")}
                s["latency_ns"] = _hist_json(t["_lat"])
                if "_roof" in t:
                    s["roofline"] = dict(t["_roof"])
                if "_shadow" in t:
                    sh = t["_shadow"]
                    s["shadow"] = {k: sh[k] for k in ADD_SHADOW} | {
                        "skipped_by": sh["skipped_by"], "max_abs_err": sh["max_abs_err"],
                        "max_rel_err": sh["max_rel_err"], "candidate_latency_ns": _hist_json(sh["_cand"]),
                        "aa": sh["aa"], "graph": sh["graph"], "rollback": sh["rollback"], "repro": sh["repro"]}
                if "_rollout" in t:
                    s["rollout"] = t["_rollout"]
                shapes.append(s)
            o = {"name": name, "mode": next(iter(m["modes"])) if len(m["modes"]) == 1 else "mixed",
                 "sample": m["src"].get("sample"), "definition": m["src"].get("definition"),
                 "bindings": m["bindings"], "untracked": m["untracked"], "tallied": m["tallied"]}
            for k in ("sample_steady", "steady_after", "key_every", "key_after"):  # the first report's, as its sample
                if k in m["src"]:
                    o[k] = m["src"][k]
            if m["candidate"] is not None:
                o["candidate"] = m["candidate"]
            o["shapes"] = shapes
            out_ops.append(o)
        first, heads = self.first, self.heads
        try:
            timer = _timer_merge([{"timer": h["timer"]} for h in heads])
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise MergeError(f"a report's timer section is malformed ({type(e).__name__}: {e})") from None
        return {
            "schema": "understudy.report", "version": 1, "library_version": first.get("library_version"),
            "torch_version": first.get("torch_version"), "merged_from": self.n,
            "hosts": sorted({str(h["host"]) for h in heads}),
            "started_unix_ms": min(h["started"] for h in heads),
            "generated_unix_ms": max(h["generated"] for h in heads),
            "histogram": first["histogram"], "operators": out_ops,
            "hardware": list({hw["name"]: hw for h in heads for hw in h["hardware"]}.values()),
            "timer": timer,
            "graphs": {k: sum(_n(h["graphs"].get(k), "graphs." + k) for h in heads)
                       for k in ("sites", "live", "open", "unknown", "lost", "launched", "refused", "gated",
                                 "gated_replays", "gate_failed", "hosted", "host_starts", "unseen")},
            "totals": {"untracked": sum(m["untracked"] for m in self.ops.values()),
                       "tallied": sum(m["tallied"] for m in self.ops.values()),
                       "internal_errors": sum(h["internal_errors"] for h in heads)},
        }


def merge(reports: Iterable[dict]) -> dict:
    """One report from the last reports of many processes (borrowed, not
    modified). Raises MergeError for inputs that do not combine (not a
    report, another histogram scheme, two snapshots of one process, different
    candidates for an operator, a figure that is not a number), and
    UnderstudyError when the library that derives the figures cannot be
    loaded."""
    m = _Merger()
    for r in reports:
        if not isinstance(r, dict):
            raise MergeError(f"report {m.n} is not an understudy.report v1")
        ops = r.get("operators")
        if not isinstance(ops, list):
            m.add(r, ())
            raise MergeError(f"report {m.n - 1} has no operators list")
        m.add(r, ((o, o.get("shapes", ())) for o in ops if isinstance(o, dict)))
    return derive(m.combined())


# ---- merging files, one report and one shape at a time -----------------------------------

REPORT_MAX = 8 << 30  # a report larger than this is refused rather than read


def read_text(path: str) -> str:
    """A report file's text: a regular file (a FIFO or a device at the path
    must not block the merge), UTF-8. MergeError says why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise MergeError(f"cannot read report '{path}': {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MergeError(f"'{path}' is not a regular file (a report is one)")
        if st.st_size > REPORT_MAX:
            raise MergeError(f"'{path}' is {st.st_size} bytes, more than the {REPORT_MAX} a report may have")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(REPORT_MAX + 1)
    except OSError as e:
        raise MergeError(f"cannot read report '{path}': {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MergeError(f"'{path}' is not UTF-8 text (byte {e.start})") from None


_WS = " \t\n\r"


class _Walk:
    """A JSON text walked from its top-level object down to the operators'
    shapes; every other value is decoded whole (they are small)."""

    def __init__(self, text: str, name: str):
        self.text, self.name, self.i = text, name, 0
        self.dec = json.JSONDecoder()

    def fail(self, what: str):
        raise MergeError(f"'{self.name}' is not a JSON report: {what} at character {self.i}")

    def skip(self):
        t, i = self.text, self.i
        while i < len(t) and t[i] in _WS:
            i += 1
        self.i = i

    def expect(self, c: str):
        self.skip()
        if self.text[self.i:self.i + 1] != c:
            self.fail(f"'{c}' expected")
        self.i += 1

    def value(self):
        self.skip()
        try:
            v, self.i = self.dec.raw_decode(self.text, self.i)
        except ValueError as e:
            self.fail(str(e).split(":")[0])
        return v

    def members(self) -> Iterator[str]:
        """The keys of the object that starts here, each before its value is read."""
        self.expect("{")
        self.skip()
        if self.text[self.i:self.i + 1] == "}":
            self.i += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                self.fail("a key expected")
            self.expect(":")
            yield key
            self.skip()
            c = self.text[self.i:self.i + 1]
            self.i += 1
            if c == "}":
                return
            if c != ",":
                self.fail("',' or '}' expected")

    def elements(self) -> Iterator[None]:
        """Once per element of the array that starts here, before the element is read."""
        self.expect("[")
        self.skip()
        if self.text[self.i:self.i + 1] == "]":
            self.i += 1
            return
        while True:
            yield None
            self.skip()
            c = self.text[self.i:self.i + 1]
            self.i += 1
            if c == "]":
                return
            if c != ",":
                self.fail("',' or ']' expected")


def _operators_of(w: _Walk) -> Iterator:
    """(operator's fields but shapes, its shapes one at a time) per operator.
    A report lists shapes last (the library writes them so); fields after
    them are read too, and go with the operator at its next use."""
    for _ in w.elements():
        o: dict = {}
        shapes_seen = False
        for key in w.members():
            if key == "shapes" and not shapes_seen:
                shapes_seen = True
                yield o, (w.value() for _ in w.elements())
            else:
                o[key] = w.value()
        if not shapes_seen:
            yield o, ()


def _add_file(m: _Merger, path: str) -> None:
    text = read_text(path)
    w = _Walk(text, path)
    head: dict = {}
    walked = False
    for key in w.members():
        if key == "operators" and head.get("schema") == "understudy.report" and not walked:
            walked = True  # the library writes a report's schema first and its operators before the rest
            m.add(head, _operators_of(w))
        else:
            head[key] = w.value()
    w.skip()
    if w.i != len(text):
        w.fail("text after the report")
    if walked:
        m.set_head(head)  # with the fields that follow the operators
        return
    ops = head.get("operators")
    m.add(head, ((o, o.get("shapes", ())) for o in ops if isinstance(o, dict)) if isinstance(ops, list) else ())
    if not isinstance(ops, list):
        raise MergeError(f"'{path}' has no operators list")


def merge_files(paths: Iterable[str]) -> tuple:
    """The reports at paths merged: (the merged report's JSON text, as the
    library derives and prints it, and its totals). Reads one report at a
    time. Raises MergeError (naming the file) and UnderstudyError as merge()."""
    import ctypes

    from . import _check, _load
    m = _Merger()
    for p in paths:
        try:
            _add_file(m, p)
        except MergeError as e:
            msg = str(e)
            raise MergeError(msg if p in msg else f"{p}: {msg}") from None
    lib = _load()
    text = json.dumps(m.combined(), separators=(",", ":")).encode()
    del m  # the sums live on in text alone while the library derives
    out = ctypes.c_void_p()
    _check(lib.ust_report_derive(text, ctypes.byref(out)))
    del text
    try:
        derived = ctypes.string_at(out.value)
    finally:
        lib.ust_free(out)
    at = derived.rfind(b'"totals":')
    totals, _ = json.JSONDecoder().raw_decode(derived[at + len(b'"totals":'):].decode())
    return derived, totals
