"""The understudy command line (`understudy …`, `python -m understudy …`).

Each subcommand is a row of COMMANDS: its name, a one-line help, a function
that declares its arguments on an argparse sub-parser, and a function that
runs it with the parsed arguments and returns the exit status. A new
subcommand is two functions and a row.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, NamedTuple

from .tables import format_report, format_verdicts  # noqa: F401  (re-exported for callers of the CLI module)


class Command(NamedTuple):
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _fail(msg: str) -> int:
    print(f"understudy: {msg}", file=sys.stderr)
    return 2


# ---- report ---------------------------------------------------------------------------

def _report_args(p):
    p.add_argument("file")
    p.add_argument("--shapes", type=int, default=8, help="shape keys shown per operator")
    p.add_argument("--all", action="store_true", help="also the operators that saw no call")


def _report(args) -> int:
    try:
        with open(args.file) as f:
            rep = json.load(f)
    except (OSError, ValueError) as e:
        return _fail(f"cannot read report '{args.file}': {e}")
    if not isinstance(rep, dict) or rep.get("schema") != "understudy.report":
        return _fail(f"'{args.file}' is not an understudy report")
    print(format_report(rep, max_shapes=args.shapes, all_operators=args.all))
    verdicts = format_verdicts(rep)
    if verdicts:
        print("\n" + verdicts)
    return 0


# ---- html -----------------------------------------------------------------------------

def _html_args(p):
    p.add_argument("report")
    p.add_argument("-o", "--out", required=True, help="the HTML file to write")
    p.add_argument("--all", action="store_true", help="also the operators that saw no call")


def _html(args) -> int:
    from understudy.html import main as html_main

    return html_main(args.report, args.out, all_operators=args.all)


# ---- merge ----------------------------------------------------------------------------

def _merge_args(p):
    p.add_argument("out", help="where the merged report is written (atomically)")
    p.add_argument("reports", nargs="+")


def _merge(args) -> int:
    import tempfile

    from understudy import UnderstudyError
    from understudy.merge import MergeError, merge

    reports = []
    for p in args.reports:
        try:
            with open(p) as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:
            return _fail(f"cannot read report '{p}': {e}")
    try:
        merged = merge(reports)
    except (MergeError, UnderstudyError) as e:
        return _fail(f"merge: {e}")
    d = os.path.dirname(os.path.abspath(args.out))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".merge-")
    with os.fdopen(fd, "w") as f:
        json.dump(merged, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.out)
    print(f"merged {len(reports)} reports into {args.out}: {merged['totals']['calls']} calls, "
          f"{merged['totals']['routes']} shape keys, S_agg {_s_agg_text(merged['totals'])}")
    return 0


def _s_agg_text(tot: dict) -> str:
    """S_agg with the share of device time it covers, or why there is none."""
    if tot.get("S_agg") is None:
        return "none (no operator scored)"
    return f"{tot['S_agg']:.4f} over {100 * tot.get('scored_share', 0):.1f} % of device time"


# ---- calibrate ------------------------------------------------------------------------

def _calibrate_args(p):
    p.add_argument("--out", required=True)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")


def _calibrate(args) -> int:
    from understudy.calibrate import main as calibrate_main

    return calibrate_main(args.out, args.device, args.quick)


# ---- export-atrex ---------------------------------------------------------------------

def _export_atrex_args(p):
    p.add_argument("out_dir")
    p.add_argument("report")
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
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--report", default="understudy-demo-report.json")
    p.add_argument("--model", default="small", choices=["small", "llama-8b-shaped", "qwen3-moe-shaped"],
                   help="small (default), or HF models with real serving dimensions and 2 layers (GPU)")


def _demo(args) -> int:
    from understudy.demo import run_demo

    return run_demo(device=args.device, tokens=args.tokens, report_path=args.report, model=args.model)


# ---- run ------------------------------------------------------------------------------

# What `understudy run` enables when neither --config nor $UNDERSTUDY_CONFIG says: every
# shipped operator observed, a report per process in the current directory.
RUN_DEFAULT_CONFIG = '{"report": {"path": "understudy-report-{pid}.json"}}'


def _run_args(p):
    p.add_argument("--config", default=None,
                   help="a JSON config or a path to one (default: $UNDERSTUDY_CONFIG, else observe every operator "
                        "and write understudy-report-{pid}.json)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")


def hook_installed() -> bool:
    """Whether this Python's site-packages hold the start-up hook
    (understudy-autoload.pth, installed with the package by pip)."""
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return any(os.path.isfile(os.path.join(d, "understudy-autoload.pth")) for d in dirs)


def _run(args) -> int:
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
    env = dict(os.environ, UNDERSTUDY_CONFIG=config)
    if not hook_installed():
        # A clone, not a pip install: the command's Python finds this package
        # on PYTHONPATH, but only a process that calls understudy.activate()
        # itself takes the config.
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        print("understudy: run: the start-up hook is not installed in this Python (pip install the package): "
              "the command's processes are enabled only where they call understudy.activate()", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)  # the command takes this process's place: its signals, its exit status
    except OSError as e:
        print(f"understudy: run: cannot run '{cmd[0]}': {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


COMMANDS = [
    Command("report", "print a JSON report as a table", _report_args, _report),
    Command("html", "write a report as one self-contained HTML page (roofline chart, verdicts)", _html_args, _html),
    Command("merge", "merge reports from many processes into one, exactly", _merge_args, _merge),
    Command("calibrate", "measure this device's copy bandwidth and matrix rates into a profile", _calibrate_args,
            _calibrate),
    Command("export-atrex", "write the observed workload as Atrex-Bench shapes and importance", _export_atrex_args,
            _export_atrex),
    Command("demo", "generate with a small decoder under understudy and print the report", _demo_args, _demo),
    Command("run", "run a command with understudy enabled in its Python processes ($UNDERSTUDY_CONFIG)", _run_args,
            _run),
]


def parser() -> argparse.ArgumentParser:
    from understudy._version import __version__

    ap = argparse.ArgumentParser(prog="understudy", description="understudy: observe, shadow and roll out kernels "
                                 "in a PyTorch serving process, scored against the roofline.")
    ap.add_argument("--version", action="version", version=f"understudy {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for c in COMMANDS:
        c.arguments(sub.add_parser(c.name, help=c.help, description=c.help))
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return next(c for c in COMMANDS if c.name == args.cmd).run(args)
