"""The understudy command line (`understudy …`, `python -m understudy …`).

Each subcommand is a row of COMMANDS: its name, a one-line help, an example
(shown by its --help), a function that declares its arguments on an argparse
sub-parser (every argument with a help text), and a function that runs it
with the parsed arguments and returns the exit status. A new subcommand is
two functions and a row.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Callable, NamedTuple

from .tables import ABOVE_ROOF_WORDS, format_report, format_verdicts, score  # noqa: F401  (format_*: re-exported)


class Command(NamedTuple):
    name: str
    help: str
    example: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _fail(msg: str) -> int:
    print(f"understudy: {msg}", file=sys.stderr)
    return 2


def _printable(text: str) -> str:
    from .tables import printable
    return printable(str(text))


def _one_line(text: str) -> str:
    """A message on one line, nothing in it a terminal would act on."""
    return _printable(" ".join(str(text).split("\n")))


# ---- report ---------------------------------------------------------------------------

def _report_args(p):
    p.add_argument("file", help="a JSON report (report.path of a run, or one `understudy merge` wrote)")
    p.add_argument("--shapes", type=int, default=8, help="shape keys shown per operator (default: 8)")
    p.add_argument("--all", action="store_true", help="also the operators that saw no call")


def _report(args) -> int:
    from understudy.merge import MergeError, read_text

    try:
        rep = json.loads(read_text(args.file))
    except MergeError as e:
        return _fail(_one_line(str(e)))
    except ValueError as e:  # the parser's message gives a position, never the text
        return _fail(f"cannot read report '{_printable(args.file)}': not JSON ({_one_line(str(e))})")
    if not isinstance(rep, dict) or rep.get("schema") != "understudy.report":
        return _fail(f"'{_printable(args.file)}' is not an understudy report")
    try:
        table, verdicts = format_report(rep, max_shapes=args.shapes, all_operators=args.all), format_verdicts(rep)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:  # a field missing or of another kind
        return _fail(f"'{_printable(args.file)}' is not a report this version reads ({type(e).__name__}: "
                     f"{_one_line(str(e))[:80]})")
    print(table)
    if verdicts:
        print("\n" + verdicts)
    return 0


# ---- html -----------------------------------------------------------------------------

def _html_args(p):
    p.add_argument("report", help="a JSON report")
    p.add_argument("-o", "--out", required=True, help="the HTML file to write")
    p.add_argument("--all", action="store_true", help="also the operators that saw no call")


def _html(args) -> int:
    from understudy.html import main as html_main

    return html_main(args.report, args.out, all_operators=args.all)


# ---- merge ----------------------------------------------------------------------------

def _merge_args(p):
    p.add_argument("out", help="where the merged report is written (atomically)")
    p.add_argument("reports", nargs="+", metavar="report", help="the JSON reports to merge, one per process")


def _merge(args) -> int:
    import tempfile

    from understudy import UnderstudyError
    from understudy.merge import MergeError, merge_files

    try:
        text, totals = merge_files(args.reports)
    except (MergeError, UnderstudyError) as e:
        return _fail(f"merge: {_one_line(str(e))}")
    d = os.path.dirname(os.path.abspath(args.out))
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".merge-")
    except OSError as e:
        return _fail(f"merge: cannot write into '{d}': {e.strerror}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, args.out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return _fail(f"merge: cannot write '{args.out}': {e.strerror}")
    print(f"merged {len(args.reports)} reports into {_printable(args.out)}: {totals['calls']:.0f} calls, "
          f"{totals['routes']:.0f} shape keys, S_agg {_s_agg_text(totals)}")
    return 0


def _s_agg_text(tot: dict) -> str:
    """S_agg with the share of device time it covers, or why there is none."""
    if tot.get("S_agg") is None:
        return "none (no operator scored)"
    above = int(tot.get("above_roof") or 0)
    return (f"{score(tot['S_agg'], '.4f')} over {100 * tot.get('scored_share', 0):.1f} % of device time"
            + (f"; {above} shape key{'s' if above > 1 else ''} above the roof: {ABOVE_ROOF_WORDS}" if above else ""))


# ---- calibrate ------------------------------------------------------------------------

def _calibrate_args(p):
    p.add_argument("--out", required=True, help="the hardware profile to write (JSON), for \"hardware\": {\"dir\": ...}")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--quick", action="store_true", help="0.6 s of measuring a figure instead of 3 s")


def _calibrate(args) -> int:
    from understudy.calibrate import main as calibrate_main

    return calibrate_main(args.out, args.device, args.quick)


# ---- export-atrex ---------------------------------------------------------------------

def _export_atrex_args(p):
    p.add_argument("out_dir", help="the folder to write shapes.json and operator_importance.json into")
    p.add_argument("report", help="a JSON report")
    p.add_argument("--problems-dir", default=None, help="operator definitions (default: the shipped problems/)")


def _export_atrex(args) -> int:
    from understudy.atrex import export

    try:
        with open(args.report) as f:
            rep = json.load(f)
        os.makedirs(args.out_dir, exist_ok=True)
        done = export(rep, args.out_dir, args.problems_dir)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, RecursionError) as e:
        return _fail(f"export-atrex: {e}")
    print(f"exported {sum(done.values())} shapes of {len(done)} operators to {args.out_dir}: "
          + ", ".join(f"{k} {v}" for k, v in done.items()))
    return 0


# ---- demo -----------------------------------------------------------------------------

def _demo_args(p):
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--tokens", type=int, default=24, help="tokens generated per phase (default: 24)")
    p.add_argument("--report", default="understudy-demo-report.json",
                   help="the first phase's report (the others' names add -shadow and -rollout)")
    p.add_argument("--model", default="small", choices=["small", "llama-8b-shaped", "qwen3-moe-shaped"],
                   help="small (default), or HF models with real serving dimensions and 2 layers (GPU)")


def _demo(args) -> int:
    from understudy.demo import run_demo

    return run_demo(device=args.device, tokens=args.tokens, report_path=args.report, model=args.model)


# ---- run ------------------------------------------------------------------------------

# What `understudy run` enables when neither --config nor $UNDERSTUDY_CONFIG says: every
# shipped operator observed, a report per process in the current directory.
RUN_DEFAULT_CONFIG = '{"report": {"path": "understudy-report-{pid}.json"}}'

# The signals `understudy run` passes on to the command. SIGINT and SIGQUIT from the terminal
# reach the command by themselves (it is in the same process group): run ignores them.
_PASSED_ON = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")


def _run_args(p):
    p.add_argument("--config", default=None,
                   help="a JSON config or a path to one (default: $UNDERSTUDY_CONFIG, else observe every operator "
                        "and write understudy-report-{pid}.json)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]",
                   help="the command to run; every Python process it starts enables understudy when it imports "
                        "torch, whichever interpreter runs it")


def startup_dir() -> str:
    """The folder `understudy run` puts first on PYTHONPATH: its sitecustomize
    enables understudy in any interpreter (understudy/startup/)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


def _run(args) -> int:
    import subprocess
    import tempfile

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return _fail("run: no command given (understudy run [--config CONFIG] -- CMD [ARG...])")
    config = args.config if args.config is not None else (os.environ.get("UNDERSTUDY_CONFIG") or RUN_DEFAULT_CONFIG)
    if config.lstrip().startswith("{"):
        try:
            json.loads(config)
        except ValueError as e:
            return _fail(f"run: the config is not JSON: {e}")
    else:
        try:
            with open(config, "rb") as f:
                json.loads(f.read())
        except (OSError, ValueError) as e:
            return _fail(f"run: cannot read the config file '{config}': {e}")
        config = os.path.abspath(config)  # the command may change directory
    fd, record = tempfile.mkstemp(prefix="understudy-run-", suffix=".jsonl")
    os.close(fd)
    env = dict(os.environ, UNDERSTUDY_CONFIG=config, UNDERSTUDY_RUN_REPORTS=record)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [startup_dir(), env.get("PYTHONPATH")]))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        try:
            child = subprocess.Popen(cmd, env=env)
        except OSError as e:
            print(f"understudy: run: cannot run '{cmd[0]}': {e.strerror}", file=sys.stderr)
            return 127
        status = _wait_passing_signals(child)
        print(f"understudy: {_run_reports_line(record)}", file=sys.stderr, flush=True)
    finally:
        os.unlink(record)
    if status < 0:  # the command died of a signal: so does run, and its parent sees the same status
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def _wait_passing_signals(child) -> int:
    """Waits for child, passing on the signals run receives; its exit status
    (negative: the signal it died of)."""
    def pass_on(signum, frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for name in _PASSED_ON:
        signal.signal(getattr(signal, name), pass_on)
    for name in ("SIGINT", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    return child.wait()


def _run_reports_line(record: str) -> str:
    """One line naming the reports the command's processes wrote, from the
    list they kept in record (activation.note_report)."""
    entries = []
    try:
        with open(record) as f:
            for line in f:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    if not entries:
        return ("run: no process of the command enabled understudy (a Python process enables it when it imports "
                "torch; `understudy doctor` tells which interpreters can)")
    written = []  # (path, pid, calls)
    for e in entries:
        for path in (e.get("own"), e.get("path")):
            if not path or any(w[0] == path for w in written):
                continue
            try:
                with open(path) as f:
                    rep = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(rep, dict) and rep.get("pid") == e.get("pid"):
                written.append((path, e.get("pid"), (rep.get("totals") or {}).get("calls", 0)))
                break
    n = len({e.get("pid") for e in entries})
    procs = f"{n} process{'es' if n != 1 else ''}"
    if not written:
        if not any(e.get("path") for e in entries):
            return f"run: understudy ran in {procs}; the config names no report.path, so no report was written"
        return (f"run: understudy ran in {procs}, and none left a report of its own (a report is written at exit, "
                f"on SIGTERM and every report.interval_s; a process that observed no call leaves another's in place)")
    names = [_shown(w[0]) for w in written]
    if len(written) == 1:
        return f"run: report written to {names[0]} ({written[0][2]} calls); read it with: understudy report {names[0]}"
    listed = ", ".join(f"{name} ({w[2]} calls)" for name, w in zip(names, written))
    line = f"run: {len(written)} reports written: {listed}"
    if len({w[1] for w in written}) > 1:
        line += f"; one report of them all: understudy merge merged.json {' '.join(names)}"
    return line


def _shown(path: str) -> str:
    """path relative to the current directory where it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


# ---- doctor ---------------------------------------------------------------------------

def _doctor_args(p):
    p.add_argument("commands", nargs="*", metavar="command",
                   help="commands to look at too (console scripts such as transformers or torchrun): which "
                        "interpreter each runs, and whether understudy would be on in it")


# Run in each interpreter (any Python 3): what it holds, without importing torch.
_PROBE = r"""
import json, os, sys
out = {"executable": sys.executable, "prefix": sys.prefix, "version": "%d.%d.%d" % sys.version_info[:3]}
try:
    import importlib.util, site
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    out["pth"] = [d for d in dirs if os.path.isfile(os.path.join(d, "understudy-autoload.pth"))]
    spec = importlib.util.find_spec("understudy")
    out["understudy"] = spec.origin if spec else None
    spec = importlib.util.find_spec("torch")
    out["torch_at"] = os.path.dirname(spec.origin) if spec and spec.origin else None
    if spec:
        import importlib.metadata as md
        try:
            out["torch"] = md.version("torch")
        except Exception:
            out["torch"] = "?"
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def _interpreters_on_path() -> list:
    """(name as found, path) of each python, python3, python3.N on PATH, in PATH's order."""
    import re

    found, seen = [], set()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(d or os.curdir))
        except OSError:
            continue
        for n in names:
            p = os.path.join(d or os.curdir, n)
            if re.fullmatch(r"python(3(\.\d+)?)?", n) and os.access(p, os.X_OK) and os.path.isfile(p) \
                    and os.path.abspath(p) not in seen:
                seen.add(os.path.abspath(p))
                found.append(os.path.abspath(p))
    return found


def _script_interpreter(path: str):
    """The interpreter a console script's first line names (pip's `#!/bin/sh`
    form with an exec line too), or None."""
    import re
    import shutil

    try:
        with open(path, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace")
    except OSError:
        return None
    if not head.startswith("#!"):
        return None
    first = head[2:].splitlines()[0].split()
    if not first:
        return None
    if os.path.basename(first[0]) == "env" and len(first) > 1:
        return shutil.which(first[-1])
    if os.path.basename(first[0]) in ("sh", "bash"):
        m = re.search(r"exec' +'?([^' ]+)", head)
        return m.group(1) if m else None
    return first[0]


def _probe(python: str):
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "UNDERSTUDY_CONFIG"}
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "does not run: " + (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[0]}


def _verdicts(info: dict, built, ours: str):
    """(with UNDERSTUDY_CONFIG alone, under understudy run) for the
    interpreter a probe described: each "yes ..." or "no: why"."""
    if info.get("error"):
        return (f"no: {info['error']}",) * 2
    if tuple(int(x) for x in info["version"].split(".")[:2]) < (3, 9):
        return (f"no: Python {info['version']} is older than the 3.9 understudy needs",) * 2
    if not info.get("torch_at"):
        return ("no: no torch here (understudy enables itself when torch is imported)",) * 2
    own = os.path.dirname(info["understudy"]) if info.get("understudy") else None
    if own and os.path.realpath(own) != os.path.realpath(ours):
        run = f"yes (its own understudy, {own})"
    elif built and info.get("torch") not in ("?", built):
        run = f"no: its torch {info['torch']} is not the {built} understudy's library was built against"
    else:
        run = "yes"
    if not info.get("pth"):
        alone = "no: no understudy-autoload.pth in its site-packages (use understudy run, or pip install " \
                "understudy with this interpreter)"
    elif not own:
        alone = "no: understudy-autoload.pth is there, the understudy package is not"
    elif run.startswith("no"):
        alone = run
    else:
        alone = f"yes (understudy-autoload.pth in {info['pth'][0]})"
    return alone, run


def _doctor(args) -> int:
    import shutil

    import understudy

    ours = os.path.dirname(os.path.abspath(understudy.__file__))
    built = None
    try:
        understudy._load()
        built = understudy._lib.ust_torch_version().decode()
        lib = f"library {understudy.library_path()}, built against torch {built}"
    except Exception as e:  # the library is what doctor looks at: it reports, never fails
        lib = f"its library cannot be loaded here: {e}"
    print(f"understudy {understudy.__version__} in {ours}; {lib}")
    print(f"under `understudy run`, the command's processes take understudy from {startup_dir()} (on PYTHONPATH)")
    print()
    commands = []
    for c in args.commands:
        path = shutil.which(c)
        if path is None:
            print(f"{c}: not found on PATH")
            continue
        python = _script_interpreter(path)
        if python is None and os.path.basename(path).startswith("python"):
            python = path
        if python is None:
            print(f"{c} ({path}): not a Python console script")
            continue
        commands.append((f"{c} ({path}) runs {python}", python))
    on_path = _interpreters_on_path()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        infos = dict(zip([p for _, p in commands] + on_path, pool.map(_probe, [p for _, p in commands] + on_path)))
    blocks = list(commands)
    same = {}  # one block per interpreter (its real executable and prefix), naming every path to it
    for p in on_path:
        info = infos[p]
        key = (os.path.realpath(info["executable"]), info["prefix"]) if "executable" in info else p
        if key in same:
            same[key].append(p)
        else:
            same[key] = [p]
            blocks.append((None, p))
    for title, python in blocks:
        info = infos[python]
        if title is None:
            names = same[(os.path.realpath(info["executable"]), info["prefix"]) if "executable" in info else python]
            title = names[0] + (f" (also {', '.join(names[1:])})" if len(names) > 1 else "")
        if info.get("error"):
            print(f"{title}: {info['error']}")
            continue
        alone, run = _verdicts(info, built, ours)
        real = info["executable"]
        what = [f"Python {info['version']}", f"torch {info['torch']}" if info.get("torch") else "no torch"]
        if os.path.realpath(real) != os.path.realpath(python):
            what.append(f"runs {real}")
        print(f"{title}: {', '.join(what)}")
        print(f"    UNDERSTUDY_CONFIG set: {alone}")
        print(f"    understudy run:        {run}")
    return 0


# ---- candidate ------------------------------------------------------------------------

def _candidate_args(p):
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION", help="add")
    a = sub.add_parser("add", help="name an entry point in a file as an operator's candidate, pinned to its bytes",
                       description="Load FILE::ENTRY in a process of its own, adapt it to the schema of --like, "
                                   "and write the operator's candidate (the file, its entry, SHA-256 and target) "
                                   "into --config, or print it. KernelBench's ModelNew and KernelAgent's "
                                   "kernel_function are found without ::ENTRY.")
    a.add_argument("ref", metavar="FILE::ENTRY", help="a Python file and its entry point (a function or a class)")
    a.add_argument("--like", required=True, help="the op it stands in for (aten::silu, _C::rms_norm)")
    a.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="a module to import first, which defines the --like op (vllm._C); repeatable")
    a.add_argument("--schema", help="the --like op's schema, where it is not defined here "
                                    "('_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()')")
    a.add_argument("--operator", help="the operator (default: the definition that binds --like)")
    a.add_argument("--config", help="a JSON config file to write the candidate into (made when missing)")
    a.add_argument("--mode", default="shadow", help="the operator's mode (default: shadow)")
    a.add_argument("--sample", type=float, help="the operator's sample share")
    a.add_argument("--arg", action="append", default=[], metavar="PARAM=ARG",
                   help="map the entry's parameter PARAM to the op's argument ARG; repeatable")
    a.add_argument("--style", choices=["value", "destination"], help="how the entry gives its results "
                   "(default: destination when a parameter maps to an argument the op writes)")
    a.add_argument("--init", help="a class entry's constructor arguments, as a JSON list or object")
    a.add_argument("--qualify", choices=["process", "here"], default="process",
                   help="process (default): it runs in a process of its own until a route qualified it")
    a.add_argument("--qualify-calls", type=int, default=3, help="passing calls a route needs there (default 3)")


def _import_modules(imports):
    """--import's modules (names, or .py paths), imported in turn; the
    message naming the first that fails, or None."""
    import importlib
    import importlib.util

    for m in imports:
        try:
            if m.endswith(".py"):
                spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(m))[0], m)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            else:
                importlib.import_module(m)
        except Exception as e:
            return f"--import {m}: {type(e).__name__}: {e}"
    return None


def _pairs(items, what):
    """--arg's A=B items as a dict; ValueError naming one without '='."""
    out = {}
    for item in items:
        a, sep, b = item.partition("=")
        if not sep or not a or not b:
            raise ValueError(f"--arg '{item}' must be {what}")
        out[a] = b
    return out


def _candidate(args) -> int:
    from understudy import files

    why = _import_modules(args.imports)
    if why is not None:
        return _fail(why)
    try:
        mapping = _pairs(args.arg, "PARAM=ARG")
    except ValueError as e:
        return _fail(str(e))
    init = None
    if args.init is not None:
        try:
            init = json.loads(args.init)
        except ValueError as e:
            return _fail(f"--init is not JSON: {e}")
    try:
        out = files.add(args.ref, like=args.like, schema=args.schema, config=args.config, operator=args.operator,
                        mode=args.mode, sample=args.sample, args=mapping, style=args.style, init=init,
                        qualify=args.qualify, qualify_calls=args.qualify_calls)
    except ValueError as e:
        return _fail(str(e))
    chk = out["checked"]
    if chk:
        how = ", ".join(f"{p}->{t}" for p, t in chk.get("args", {}).items())
        print(f"{args.ref}: {chk.get('form')} '{chk.get('entry')}', {chk.get('style')}-returning, {how}"
              + (f"; ignores {', '.join(chk['ignores'])}" if chk.get("ignores") else ""), file=sys.stderr)
    if args.config:
        print(f"operators.{out['operator']}.candidate written to {args.config}", file=sys.stderr)
    print(json.dumps({"operators": {out["operator"]: out["entry"]}}, indent=2))
    return 0


def _repro_args(p):
    p.add_argument("report", help="a report (JSON) that keeps a failing call (a route's shadow.repro)")
    p.add_argument("--route", default=None, metavar="KEY", help="the route whose kept call to replay (default: "
                   "the first one kept)")
    p.add_argument("--config", default=None, help="the config that named the candidate (JSON or a path): needed "
                   "for candidates from files, Solutions or hub layers; a native candidate or a torch op defined "
                   "by --import is found from the report alone")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (one that registers the candidate's torch op); repeatable")
    p.add_argument("--device", default=None, help="replay on this device (default: the call's own)")
    p.add_argument("--list", action="store_true", help="list the kept calls and exit")
    p.add_argument("--workload", default=None, metavar="DIR",
                   help="instead of replaying, write the call as a FlashInfer-Bench workload into the dataset "
                        "folder DIR (needs --definition)")
    p.add_argument("--definition", default=None, metavar="FILE", help="the FlashInfer-Bench Definition (JSON) the "
                   "workload is of")
    p.add_argument("--arg", action="append", default=[], metavar="INPUT=ARG",
                   help="a Definition input that is the op's argument ARG (where the names differ); repeatable")


def _repro(args) -> int:
    from understudy import repro

    why = _import_modules(args.imports)
    if why is not None:
        return _fail(f"repro: {why}")
    try:
        rep = repro.load(args.report)
        if args.list:
            for c in repro.kept(rep):
                call = c["repro"]["call"]
                print(f"{c['key']}: {call['reason']}" + (f" in {call['output']}" if call.get("output") else "")
                      + f", candidate {c['repro']['candidate'].get('label')}, {call['bytes']} bytes kept")
            return 0
        if args.workload is not None:
            if args.definition is None:
                return _fail("repro: --workload needs --definition FILE (the FlashInfer-Bench Definition)")
            mapping = _pairs(args.arg, "INPUT=ARG")
            w = repro.export_workload(rep, args.workload, definition=args.definition, key=args.route,
                                      args=mapping or None)
            print(f"workload {w['workload']['uuid']} of {w['definition']} written to {args.workload} "
                  f"(axes {w['workload']['axes']})")
            return 0
        config = None
        if args.config is not None:
            config = json.loads(args.config) if args.config.lstrip().startswith("{") else repro.load(args.config)
        r = repro.replay(rep, key=args.route, config=config, device=args.device)
    except (repro.ReproError, ValueError) as e:
        return _fail(f"repro: {e}")
    print(repro.summary(r))
    return 0 if r["same"] else 1


COMMANDS = [
    Command("report", "print a JSON report as tables: operators by weight, shape keys, verdicts",
            "understudy report understudy-report.json --shapes 20", _report_args, _report),
    Command("html", "write a report as one self-contained HTML page (roofline chart, verdicts)",
            "understudy html understudy-report.json -o report.html", _html_args, _html),
    Command("merge", "merge reports from many processes into one, exactly",
            "understudy merge merged.json /tmp/us-0.json /tmp/us-1.json", _merge_args, _merge),
    Command("calibrate", "measure this device's copy bandwidth and matrix rates into a profile",
            "understudy calibrate --device cpu --quick --out hw/cpu.json", _calibrate_args, _calibrate),
    Command("export-atrex", "write the observed workload as Atrex-Bench shapes and importance",
            "understudy export-atrex atrex-out understudy-report.json", _export_atrex_args, _export_atrex),
    Command("demo", "generate with a small decoder under understudy and print the report",
            "understudy demo --device cpu --tokens 16", _demo_args, _demo),
    Command("run", "run a command with understudy enabled in its Python processes ($UNDERSTUDY_CONFIG)",
            "understudy run --config '{\"report\": {\"path\": \"r-{pid}.json\"}}' -- transformers serve MODEL",
            _run_args, _run),
    Command("candidate", "add a candidate from a file (KernelBench ModelNew, KernelAgent kernel_function)",
            "understudy candidate add kernels/rms.py::ModelNew --like _C::rms_norm --config understudy.json",
            _candidate_args, _candidate),
    Command("repro", "replay a failing call a report keeps, or export it as a FlashInfer-Bench workload",
            "understudy repro understudy-report.json --import my_kernels", _repro_args, _repro),
    Command("doctor", "tell which Python interpreters on PATH would enable understudy, and why not",
            "understudy doctor transformers torchrun", _doctor_args, _doctor),
]


def parser() -> argparse.ArgumentParser:
    from understudy._version import __version__

    ap = argparse.ArgumentParser(prog="understudy", description="understudy: observe, shadow and roll out kernels "
                                 "in a PyTorch serving process, scored against the roofline.",
                                 epilog="example:\n  understudy run -- python3 serve.py",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"understudy {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help="one of the commands below")
    for c in COMMANDS:
        c.arguments(sub.add_parser(c.name, help=c.help, description=c.help, epilog=f"example:\n  {c.example}",
                                   formatter_class=argparse.RawDescriptionHelpFormatter))
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        status = next(c for c in COMMANDS if c.name == args.cmd).run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return status
    except BrokenPipeError:
        # The reader went away (`understudy report FILE | head`): the output
        # that is left goes nowhere, quietly, and the status says why.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 128 + signal.SIGPIPE
