"""The understudy command line: `report FILE`, `merge`, `calibrate`, `export-atrex` and `demo`."""
from __future__ import annotations

import argparse
import json
import os
import sys


from .tables import format_report, format_verdicts  # noqa: F401  (re-exported for callers of the CLI module)


def _merge_cmd(out: str, paths: list) -> int:
    import os
    import tempfile

    from understudy import UnderstudyError
    from understudy.merge import MergeError, merge

    reports = []
    for p in paths:
        try:
            with open(p) as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"understudy: cannot read report '{p}': {e}", file=sys.stderr)
            return 2
    try:
        merged = merge(reports)
    except (MergeError, UnderstudyError) as e:
        print(f"understudy: merge: {e}", file=sys.stderr)
        return 2
    d = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".merge-")
    with os.fdopen(fd, "w") as f:
        json.dump(merged, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    print(f"merged {len(reports)} reports into {out}: {merged['totals']['calls']} calls, "
          f"{merged['totals']['routes']} shape keys, S_agg {merged['totals']['S_agg']:.4f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="understudy")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("report", help="print a JSON report as a table")
    rp.add_argument("file")
    rp.add_argument("--shapes", type=int, default=8, help="shape keys shown per operator")
    rp.add_argument("--all", action="store_true", help="also the operators that saw no call")
    mp = sub.add_parser("merge", help="merge reports from many processes into one, exactly")
    mp.add_argument("out", help="where the merged report is written (atomically)")
    mp.add_argument("reports", nargs="+")
    cp = sub.add_parser("calibrate", help="measure this device's copy bandwidth and matrix rates into a profile")
    cp.add_argument("--out", required=True)
    cp.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    cp.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    xp = sub.add_parser("export-atrex", help="write the observed workload as Atrex-Bench shapes and importance")
    xp.add_argument("out_dir")
    xp.add_argument("report")
    xp.add_argument("--problems-dir", default=None, help="operator definitions (default: the shipped problems/)")
    dp = sub.add_parser("demo", help="generate with a small decoder under understudy and print the report")
    dp.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    dp.add_argument("--tokens", type=int, default=24)
    dp.add_argument("--report", default="understudy-demo-report.json")
    dp.add_argument("--model", default="small", choices=["small", "llama-8b-shaped", "qwen3-moe-shaped"],
                    help="small (default), or HF models with real serving dimensions and 2 layers (GPU)")
    hp = sub.add_parser("html", help="write a report as one self-contained HTML page (roofline chart, verdicts)")
    hp.add_argument("report")
    hp.add_argument("-o", "--out", required=True, help="the HTML file to write")
    hp.add_argument("--all", action="store_true", help="also the operators that saw no call")
    args = ap.parse_args(argv)
    if args.cmd == "html":
        from understudy.html import main as html_main

        return html_main(args.report, args.out, all_operators=args.all)
    if args.cmd == "report":
        try:
            with open(args.file) as f:
                rep = json.load(f)
        except (OSError, ValueError) as e:
            print(f"understudy: cannot read report '{args.file}': {e}", file=sys.stderr)
            return 2
        if rep.get("schema") != "understudy.report":
            print(f"understudy: '{args.file}' is not an understudy report", file=sys.stderr)
            return 2
        print(format_report(rep, max_shapes=args.shapes, all_operators=args.all))
        verdicts = format_verdicts(rep)
        if verdicts:
            print("\n" + verdicts)
        return 0
    if args.cmd == "merge":
        return _merge_cmd(args.out, args.reports)
    if args.cmd == "calibrate":
        from understudy.calibrate import main as calibrate_main

        return calibrate_main(args.out, args.device, args.quick)
    if args.cmd == "export-atrex":
        from understudy.atrex import export

        try:
            with open(args.report) as f:
                rep = json.load(f)
            os.makedirs(args.out_dir, exist_ok=True)
            done = export(rep, args.out_dir, args.problems_dir)
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, RecursionError) as e:
            print(f"understudy: export-atrex: {e}", file=sys.stderr)
            return 2
        print(f"exported {sum(done.values())} shapes of {len(done)} operators to {args.out_dir}: "
              + ", ".join(f"{k} {v}" for k, v in done.items()))
        return 0
    from understudy.demo import run_demo

    return run_demo(device=args.device, tokens=args.tokens, report_path=args.report, model=args.model)
