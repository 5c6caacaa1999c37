"""Where a benchmark's run is kept: benchmarks/results/<name>-<UTC time>.json.

A figure means something only with the machine, the versions and the code it
was measured on, so every benchmark hands the tables it printed to write(),
which adds them: the machine (CPU model, GPU name), torch, CUDA, understudy's
version, the commit of the tree it ran from (`git rev-parse --short HEAD`,
null outside a git checkout; `dirty` when tracked files differ from it), the
command line, its parsed arguments and the date. docs/performance.md is
rendered from these files by benchmarks/render_performance.py, never edited
by hand, and a file is never rewritten: a new run is a new file.

    _results.write("overhead", [_results.table("host time per call", ["device", "us"], rows)],
                   args=args)

UNDERSTUDY_BENCH_RESULTS names another folder to write into (a scratch run,
a test), or "off" to write nothing. UNDERSTUDY_BENCH_COMMIT names the commit
for a copy of the tree whose git metadata is not its own (a machine the tree
was copied to); its `dirty` is then unknown (null). Only the standard library is used, so
the renderer and the tests read these files without torch.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any, Iterable, Optional, Sequence

SCHEMA = "understudy.benchmark-result"
VERSION = 1
HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          formats: Optional[Sequence[Optional[str]]] = None) -> dict:
    """One printed table: a title, its column names and its rows (numbers
    as numbers; None where a row has no figure). formats: a format spec per
    column for the rendered page ("+.2f", ".1%", ","), None for the
    default. A figure that is not finite (nan: nothing to measure) is
    stored as None."""
    rows = [[None if isinstance(v, float) and not math.isfinite(v) else v for v in r] for r in rows]
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"table {title!r}: a row of {len(r)} values for {len(columns)} columns: {r}")
    out = {"title": title, "columns": list(columns), "rows": rows}
    if formats is not None:
        if len(formats) != len(columns):
            raise ValueError(f"table {title!r}: {len(formats)} formats for {len(columns)} columns")
        out["formats"] = list(formats)
    return out


def cpu_model() -> Optional[str]:
    """The CPU's model name, as understudy.calibrate names a host's profile.
    Read here again rather than imported from it: that module imports
    torch, and footprint.py's parent process writes its results without the
    package on its path."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git(*args: str) -> Optional[str]:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def commit() -> dict:
    """The commit of the tree the benchmark ran from, and whether tracked
    files differ from it (a run of uncommitted code says so)."""
    named = os.environ.get("UNDERSTUDY_BENCH_COMMIT", "").strip()
    if named:
        return {"commit": named, "dirty": None}
    head = _git("rev-parse", "--short", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if head else None
    return {"commit": head, "dirty": bool(status) if status is not None else None}


def environment(device: Optional[str] = None) -> dict:
    """Machine and versions. torch is read only where the benchmark
    imported it already (a Callgrind parent may not have)."""
    torch = sys.modules.get("torch")
    gpu = None
    cuda = None
    if torch is not None:
        cuda = getattr(torch.version, "cuda", None)
        try:
            if device != "cpu" and torch.cuda.is_available():
                gpu = torch.cuda.get_device_name()
        except Exception:  # a driver that cannot answer: the run is still worth keeping
            gpu = None
    understudy = sys.modules.get("understudy")
    return {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu},
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "cuda": cuda,
        "understudy": getattr(understudy, "__version__", None),
        "python": platform.python_version(),
    }


def record(name: str, tables: Sequence[dict], *, args: Any = None, notes: Sequence[str] = (),
           device: Optional[str] = None, argv: Optional[Sequence[str]] = None,
           when: Optional[datetime.datetime] = None) -> dict:
    """The result as write() stores it (see the module's docstring)."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    argv = list(sys.argv if argv is None else argv)
    if argv:
        try:
            argv[0] = os.path.relpath(os.path.abspath(argv[0]), ROOT)
        except ValueError:
            pass
    parsed = vars(args) if args is not None and not isinstance(args, dict) else args
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "benchmark": name,
        "date": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **commit(),
        **environment(device),
        "command": " ".join(["python3", *argv]),
        "args": parsed,
        "tables": list(tables),
        "notes": list(notes),
    }


def dumps(rec: dict) -> str:
    """A record as JSON, indented, with each table row on one line (a file
    to read as well as to parse)."""
    def one(t: dict) -> str:
        head = json.dumps({k: v for k, v in t.items() if k != "rows"}, ensure_ascii=False)[:-1]
        rows = ",\n".join("   " + json.dumps(r, ensure_ascii=False) for r in t["rows"])
        return f'  {head}, "rows": [\n{rows}\n  ]}}'
    text = json.dumps({**rec, "tables": None}, indent=1, ensure_ascii=False)
    return text.replace('"tables": null', '"tables": [\n' + ",\n".join(one(t) for t in rec["tables"]) + "\n ]",
                        1) + "\n"


def write(name: str, tables: Sequence[dict], **kw: Any) -> Optional[pathlib.Path]:
    """Write one run to benchmarks/results/<name>-<UTC time>.json (a new
    file; -2, -3, ... when that name is taken) and say where on stderr.
    Returns the path, or None when UNDERSTUDY_BENCH_RESULTS is "off". A
    file that cannot be written is said, not raised: the run printed its
    tables already."""
    where = os.environ.get("UNDERSTUDY_BENCH_RESULTS", "")
    if where == "off":
        return None
    rec = record(name, tables, **kw)
    folder = pathlib.Path(where) if where else RESULTS
    stamp = rec["date"].replace("-", "").replace(":", "")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:
            path = folder / f"{name}-{stamp}{'' if n == 1 else f'-{n}'}.json"
            try:
                with open(path, "x") as f:
                    f.write(dumps(rec))
                break
            except FileExistsError:
                n += 1
    except OSError as e:
        print(f"{name}: the results file was not written: {e}", file=sys.stderr)
        return None
    shown = os.path.relpath(path)
    print(f"{name}: results written to {path if shown.startswith('..') else shown}", file=sys.stderr)
    return path
