"""Render docs/performance.md, and README.md's overhead table, from benchmarks/results/*.json.

Every benchmark writes its run to benchmarks/results/ (benchmarks/_results.py):
the machine, the versions, the commit, the command and the tables it printed.
This program turns those files into the performance page, whole, every time:
the page is regenerated, never appended to, and says nothing the files do not.
Per benchmark, the newest run of each kind (the machine and the first table's
title, its numbers aside) is shown in full, newest first; older runs of that
kind are listed by date with a link to their file, and so are a benchmark's
oldest kinds where the page would pass 400 lines. The README's overhead table
is the newest GPU run of HF `generate` decode observed at the defaults against
plain torch once its keys are steady (e2e_overhead.py --paired --generate
--modes observe plain --steady), written between two marker lines of README.md.

Commits stay in the results files: the docs cite none (a rendered hash is an
error here, naming the file it came from). The output depends on the files
alone (sorted, no time of rendering), so a check can compare it with what is
committed.

    python3 benchmarks/render_performance.py            # rewrite docs/performance.md and README's table
    python3 benchmarks/render_performance.py --check    # exit 1 if either differs from what it would write

Standard library only: CI runs the check without torch or a GPU.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Any, Iterable, Optional

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PAGE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
SCHEMA = "understudy.benchmark-result"
BEGIN = "<!-- overhead table: written by benchmarks/render_performance.py from benchmarks/results/ -->"
END = "<!-- end of the overhead table -->"
FULL_PER_BENCHMARK = 6  # kinds shown in full per benchmark at most; the rest listed
MAX_LINES = 400  # a docs page's length at most (tests/python/test_docs.py)
HASH = re.compile(r"\b[0-9a-f]{7,40}\b")

# What each benchmark measures and how to run it, in the page's order.
ABOUT = {
    "e2e_overhead": (
        "What observing costs a decode step end to end. HF decoders with random weights (Mistral-7B- and "
        "Qwen2-MoE-shaped, 2 layers) decode greedily; `--paired` measures in one process, neighbouring steps "
        "in two modes (`observe`, `off`, `plain`: understudy's interceptors passed by, `disabled`), each "
        "pair a difference taken moments apart; `--generate` pairs the steps `model.generate` runs; "
        "`--steady` first decodes until every key is past `steady_after`. Without a GPU the decoders run on "
        "the CPU at small widths.",
        "PYTHONPATH=python-shim python3 benchmarks/e2e_overhead.py --paired --generate --modes observe plain "
        "--steady --runs 7"),
    "overhead": (
        "Host time per call of a 16×16 `torch.mm`, back to back (or `--cold MB` after writing host memory), "
        "plain and in each of understudy's modes, in child processes that take turns on one core.",
        "PYTHONPATH=python-shim python3 benchmarks/overhead.py --devices cuda --kids plain understudy"),
    "hop_floor": (
        "The floor of the dispatcher seam without understudy: a kernel of the benchmark's own at "
        "BackendSelect that serves `aten::mm` by redispatching it (and variants), paired against plain "
        "torch in decode steps.",
        "cd benchmarks && python3 hop_floor.py --device cuda --rounds 41"),
    "footprint": (
        "Instructions and cache lines missed per cold call, counted by Callgrind's cache model instead of "
        "a clock: the whole call from torch's entry point, and understudy's own part of it. Needs valgrind.",
        "UNDERSTUDY_LIB=build/libunderstudy.so python3 benchmarks/footprint.py --calls 100"),
    "kernel_time": (
        "Accuracy of understudy's per-call device time in situ: every route's median time per call against "
        "torch.profiler's durations of the same kernels, for held event pairs, plain pairs and the kernel "
        "tracer (`timer.kind` `cupti`).",
        "PYTHONPATH=python-shim python3 benchmarks/kernel_time.py --models mistral qwen-moe --batch 1 8"),
    "cupti_residue": (
        "What the kernel tracer's steps leave on every later launch of the process: the host cost of an empty "
        "kernel's launch (runtime and driver) before each CUPTI step, during it and after it is undone, each "
        "variant in a fresh process (a compiled CUDA program, `benchmarks/cupti_residue.cu`).",
        "python3 benchmarks/cupti_residue.py --rounds 5"),
    "graph_replay": (
        "Replays of a CUDA graph attributed to their routes by the kernel tracer: a decode step run eagerly "
        "and replayed from a graph (`torch.cuda.graph`, or `--compile`), replay time against eager time.",
        "PYTHONPATH=python-shim python3 benchmarks/graph_replay.py --steps 30"),
    "graph_shadow": (
        "A decode step captured with its shadowed `_C::rms_norm`: verdicts in replays, serving under "
        "replay (canary, live), a wrong candidate rolled back, and what each layout costs a replay.",
        "PYTHONPATH=python-shim python3 benchmarks/graph_shadow.py --replays 1000 --rounds 5"),
    "promotion": (
        "False and true promotions of real shadowed candidates: on the CPU identical code (sleep, compute, "
        "compute beside two CPU-bound processes), 10 % faster and 10 % slower; on a GPU (`--device cuda`) "
        "the same Triton kernel as production, and one with a 10 % shorter or longer chain of work; at least "
        "100 routes each; the arms timed on copies in a drawn order, A/A pairs beside them.",
        "PYTHONPATH=python-shim python3 benchmarks/promotion.py [--device cuda]"),
    "scrape": (
        "What a Prometheus scrape costs a serving process at 4,096 and 65,536 routes: its time, and how long "
        "a pure-Python serving thread beside it stalls (its longest gap) and waits on Python's lock (blocked, "
        "from schedstat: neither running nor waiting for a core), against idle windows of the same length and "
        "a read of the JSON report, which a scrape once parsed holding the lock. On a shared machine the stalls "
        "carry the scheduler's pauses; the blocked time does not.",
        "PYTHONPATH=python-shim python3 benchmarks/scrape.py --routes 4096 65536"),
    "hung_candidate": (
        "A candidate that never returns, `guard.deadline_ms` 200, eight serving threads on the CPU: the "
        "throughput of the threads it did not take while its call is inside, over the same threads observed "
        "without it (arms alternating, median over rounds), and how long after its first call the route rolled "
        "back.",
        "PYTHONPATH=python-shim python3 benchmarks/hung_candidate.py --rounds 7"),
    "calibrate": (
        "How long `understudy calibrate --quick` takes on a CPU (the command from start to exit, and the "
        "measuring alone), and its ceilings against the best rates plain torch calls reach in the same "
        "process right after: fp32 `torch.mm` of square sizes 256 to 2048, copies of 256 KiB to 64 MiB. A "
        "ratio below 1 would be a call faster than the profile's floor.",
        "PYTHONPATH=python-shim python3 benchmarks/calibrate.py --runs 5"),
    "compare": (
        "The guard's comparison kernel against the device's copy bandwidth on 256 MB outputs, for a "
        "candidate within tolerance and one far outside it.",
        "PYTHONPATH=python-shim python3 benchmarks/compare.py"),
}


class ResultError(ValueError):
    pass


def load(folder: pathlib.Path = RESULTS) -> list:
    """Every results file, as (name, record), sorted by name."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except ValueError as e:
            raise ResultError(f"{path}: not JSON: {e}") from None
        for field, kind in (("schema", str), ("benchmark", str), ("date", str), ("tables", list)):
            if not isinstance(rec.get(field), kind):
                raise ResultError(f"{path}: '{field}' missing or not a {kind.__name__}")
        if rec["schema"] != SCHEMA:
            raise ResultError(f"{path}: schema {rec['schema']!r}, not {SCHEMA!r}")
        for t in rec["tables"]:
            if not isinstance(t.get("columns"), list) or not isinstance(t.get("rows"), list):
                raise ResultError(f"{path}: a table without columns or rows")
            if any(len(r) != len(t["columns"]) for r in t["rows"]):
                raise ResultError(f"{path}: table {t.get('title')!r} has a row of the wrong length")
        out.append((path.name, rec))
    return out


def machine(rec: dict) -> str:
    m = rec.get("machine") or {}
    if m.get("gpu"):
        return m["gpu"]
    if m.get("cpu"):
        cores = f", {m['cores']} cores" if m.get("cores") else ""
        return f"{m['cpu']}{cores}, no GPU"
    return m.get("note") or "a machine not recorded"


def kind(rec: dict) -> tuple:
    """Runs of one kind: the same machine and the same first title, its numbers aside."""
    title = rec["tables"][0].get("title", "") if rec["tables"] else ""
    return machine(rec), re.sub(r"\d+(\.\d+)?", "#", title)


def cell(v: Any, spec: Optional[str]) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v).replace("|", "\\|")
    if spec:
        return format(v, spec)
    return format(v, ",")


def table_md(t: dict) -> list:
    cols, rows = t["columns"], t["rows"]
    specs = t.get("formats") or [None] * len(cols)
    numeric = [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows if r[i] is not None)
               for i in range(len(cols))]
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v, s) for v, s in zip(r, specs)) + " |" for r in rows]
    return lines


def versions(rec: dict) -> str:
    parts = [rec["date"][:10], machine(rec)]
    if rec.get("torch"):
        parts.append(f"torch {rec['torch']}")
    if rec.get("cuda"):
        parts.append(f"CUDA {rec['cuda']}")
    if rec.get("understudy"):
        parts.append(f"understudy {rec['understudy']}")
    return " · ".join(parts)


def run_md(name: str, rec: dict, link: str) -> list:
    out = [f"{versions(rec)} · [results file]({link}{name})", ""]
    if rec.get("command"):
        out += [f"`{rec['command']}`", ""]
    for t in rec["tables"]:
        if t.get("title"):
            out += [f"*{t['title']}*", ""]
        out += table_md(t) + [""]
    for n in rec.get("notes") or []:
        out.append(f"- {n}")
    if rec.get("notes"):
        out.append("")
    return out


def newest_first(items: Iterable) -> list:
    return sorted(items, key=lambda nr: (nr[1]["date"], nr[0]), reverse=True)


def page(results: list) -> str:
    """The page, with as many kinds per benchmark in full as fit in
    MAX_LINES: the oldest kinds of each benchmark are listed instead."""
    for full in range(FULL_PER_BENCHMARK, 0, -1):
        text = page_with(results, full)
        if text.count("\n") <= MAX_LINES:
            return text
    raise ResultError(f"docs/performance.md would be longer than {MAX_LINES} lines with one run of each kind "
                      "of each benchmark in full")


def page_with(results: list, full_per_benchmark: int) -> str:
    by_bench: dict = {}
    for name, rec in results:
        by_bench.setdefault(rec["benchmark"], []).append((name, rec))
    order = [b for b in ABOUT if b in by_bench] + sorted(b for b in by_bench if b not in ABOUT)
    out = ["# Performance", "",
           "<!-- Written by benchmarks/render_performance.py from benchmarks/results/*.json: "
           "edit those files or the renderer, not this page. -->", "",
           "What understudy costs and how well it measures, from the benchmarks' own results files. Each "
           "benchmark writes its run to `benchmarks/results/` (machine, versions, commit, command, the tables "
           "it printed); this page is regenerated from them by `python3 benchmarks/render_performance.py`. "
           "The machines are shared and noisy: compare figures within one run, not across runs or machines. "
           "How the figures are taken: [timing](timing.md); the benchmarks as tests of a change: "
           "[testing](testing.md).", ""]
    for bench in order:
        runs = newest_first(by_bench[bench])
        about, how = ABOUT.get(bench, ("", ""))
        out += [f"## {bench}", ""]
        if about:
            out += [about, ""]
        if how:
            out += [f"Run: `{how}`", ""]
        kinds: dict = {}
        for name, rec in runs:
            kinds.setdefault(kind(rec), []).append((name, rec))
        shown = 0
        older = []
        for k, members in kinds.items():  # newest kind first: runs are newest first
            if shown < full_per_benchmark:
                out += run_md(*members[0], "../benchmarks/results/")
                shown += 1
                older += members[1:]
            else:
                older += members
        if older:
            out += ["Earlier runs: " + "; ".join(f"[{rec['date'][:10]}, {machine(rec)}](../benchmarks/results/{name})"
                                                 for name, rec in newest_first(older)), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def headline(results: list) -> Optional[tuple]:
    """The newest GPU run of `generate` decode observed at the defaults (no
    --config, no --timer), keys steady, against plain torch."""
    for name, rec in newest_first(results):
        a = rec.get("args") or {}
        if (rec["benchmark"] == "e2e_overhead" and a.get("paired") and a.get("generate")
                and list(a.get("modes") or []) == ["observe", "plain"] and a.get("steady")
                and not a.get("config") and not a.get("timer")  # at the defaults
                and (rec.get("machine") or {}).get("gpu")):
            return name, rec
    return None


def readme_block(results: list) -> str:
    found = headline(results)
    if found is None:
        return "\n".join([BEGIN, "", "No GPU run of `e2e_overhead.py --paired --generate --modes observe plain --steady` "
                          "is in `benchmarks/results/` yet.", "", END])
    name, rec = found
    return "\n".join([BEGIN, "", f"{versions(rec)} ([results file](benchmarks/results/{name})):", "",
                      *table_md(rec["tables"][0]), "", END])


def with_block(readme: str, block: str) -> str:
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ResultError(f"README.md must hold the line {BEGIN!r} once, and {END!r} once after it")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def no_hashes(text: str, where: str, results: list) -> None:
    for m in HASH.finditer(text):
        if re.search("[a-f]", m.group()):
            src = [n for n, r in results if m.group() in json.dumps({k: v for k, v in r.items() if k != "commit"})]
            raise ResultError(f"{where} would cite {m.group()!r} (from {', '.join(src) or 'the renderer'}): "
                              "commits belong in a results file's 'commit', not in its text")


def rendered(results: list, readme_text: str) -> dict:
    """{path: text} of everything this program writes."""
    text = page(results)
    block = readme_block(results)
    no_hashes(text, "docs/performance.md", results)
    no_hashes(block, "README.md's overhead table", results)
    return {PAGE: text, README: with_block(readme_text, block)}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description="Render docs/performance.md and README.md's overhead table "
                                             "from benchmarks/results/*.json.")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = ap.parse_args(argv)
    try:
        out = rendered(load(), README.read_text())
    except ResultError as e:
        print(f"render_performance: {e}", file=sys.stderr)
        return 2
    stale = [p for p, text in out.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"render_performance: {p.relative_to(ROOT)} differs from what benchmarks/results/ renders: "
                  "run python3 benchmarks/render_performance.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(out[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
