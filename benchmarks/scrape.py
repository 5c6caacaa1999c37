"""What a Prometheus scrape costs the serving process: how long it takes, and
how long it stalls a Python thread that serves meanwhile.

A child process enables understudy at its defaults (max_routes raised to the
routes asked for, every call keyed) and makes that many gemm routes (16x16-ish
CPU torch.mm calls of distinct K and N, timed). A Python thread then loops on
a few microseconds of work, stamping the clock at each iteration, as a
serving thread's scheduler or tokenizer would, while the main thread reads:

  scrape   prometheus_client.generate_latest over a registry holding
           understudy.metrics.UnderstudyCollector() at its defaults, what
           serve_metrics, the host's registry and the multiprocess export do
           at each scrape
  report   understudy.report(flush_timings=False): the JSON report as a dict,
           what a scrape read before the library folded the figures itself
  idle     time.sleep for as long as the scrapes took: the loop's own floor
           (the interpreter's switch interval, the machine's other work)

Each row: the reading's wall time (median and worst of its repetitions) and
the serving loop's stall, the longest gap between two of its iterations
while the reading ran, and the part of the reading's time the serving
thread spent blocked, neither running nor waiting for a core (from
/proc/self/task/TID/schedstat): waiting for Python's lock, which the
reading held (medians and worsts over the repetitions). On a shared
machine the idle rows are the floor the stalls stand on: the scheduler
takes the serving thread off its core now and then, whatever the process
does; the lock-blocked time does not count those pauses.
Measured in one child per route count, one after the other. The library and
package measured are whatever the environment selects (UNDERSTUDY_LIB,
PYTHONPATH), recorded in the results file, so a run against another build
(--label names it) is kept beside this one's.

    PYTHONPATH=python-shim python3 benchmarks/scrape.py [--routes 4096 65536] [--repeat 20] [--label NAME]
        [--nice -10]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import _results


def child(routes: int, repeat: int) -> dict:
    import torch
    import prometheus_client as prom
    import understudy
    from understudy import metrics

    side = int(round(routes ** 0.5))
    understudy.enable({"max_routes": max(routes, 4096), "defaults": {"key_every": 1},
                       "operators": {"gemm": {"sample": 1.0}}})
    with understudy.phase("decode"):
        a, b = torch.randn(1, side), torch.randn(side, side)
        for k in range(1, side + 1):
            for n in range(1, side + 1):
                torch.mm(a[:, :k], b[:k, :n])
    understudy.flush()
    made = understudy.report()["totals"]["routes"]
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(metrics.UnderstudyCollector())
    readings = {"scrape": lambda: prom.generate_latest(registry), "report": lambda: understudy.report(flush_timings=False)}

    # the serving loop keeps only its gaps longer than FLOOR: a list of every
    # stamp would itself stall the loop whenever it grows
    gaps_seen, stop, FLOOR = [], threading.Event(), 0.0002

    tid = [None]

    def serve():
        tid[0] = threading.get_native_id()
        clock, out = time.perf_counter, gaps_seen.append
        last = clock()
        while not stop.is_set():
            for _ in range(100):
                pass
            now = clock()
            if now - last > FLOOR:
                out((last, now))
            last = now

    def worst_gap(t0, t1):
        return max((b - a for a, b in list(gaps_seen) if b >= t0 and a <= t1), default=FLOOR)

    def sched():
        """The serving thread's time on a core and waiting for one (ns), and the clock."""
        try:
            with open(f"/proc/self/task/{tid[0]}/schedstat") as f:
                on_cpu, queued = (int(x) for x in f.read().split()[:2])
        except (OSError, ValueError, IndexError):
            on_cpu = queued = 0
        return on_cpu, queued, time.perf_counter_ns()

    def blocked(a, b):
        """Of the wall time between two sched() readings, what the serving
        thread spent neither running nor waiting for a core: waiting for
        Python's lock (ms)."""
        return max(0, (b[2] - a[2]) - (b[0] - a[0]) - (b[1] - a[1])) / 1e6

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    time.sleep(0.2)
    rows, spent = [], []

    def measure(name, fn, repeat):
        walls, gaps, locks = [], [], []
        for _ in range(repeat):
            time.sleep(0.05)
            a = sched()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            b = sched()
            time.sleep(0.05)
            walls.append(t1 - t0)
            gaps.append(worst_gap(t0, t1) * 1e3)
            locks.append(blocked(a, b))
        return [made, name, repeat, statistics.median(walls), max(walls), statistics.median(gaps), max(gaps),
                statistics.median(locks), max(locks)]

    for name in ("scrape", "report"):
        rows.append(measure(name, readings[name], repeat))
        spent.append(rows[-1][3])
    # as many idle windows, each as long as the quicker reading takes
    rows.append(measure("idle", lambda: time.sleep(min(spent)), repeat))
    stop.set()
    server.join()
    understudy.disable()
    return {"rows": rows, "library": str(understudy.library_path())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routes", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--repeat", type=int, default=20,
                    help="readings of each kind per route count (a fifth of it, 3 at least, above 8,192 routes)")
    ap.add_argument("--label", default="this tree", help="what the measured library is (recorded)")
    ap.add_argument("--nice", type=int, default=0,
                    help="the children's niceness (negative, as root: fewer of the scheduler's pauses on a shared "
                         "machine, for the serving thread and the reading alike)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.nice:
            os.nice(args.nice)
        print(json.dumps(child(args.child, args.repeat)))
        return
    rows, library = [], None
    for routes in args.routes:
        # fewer repetitions of the slow readings at many routes: each can take seconds
        repeat = args.repeat if routes <= 8192 else max(3, args.repeat // 5)
        out = subprocess.run([sys.executable, __file__, "--child", str(routes), "--repeat", str(repeat),
                              "--nice", str(args.nice)],
                             capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        library = got["library"]
        rows += got["rows"]
    cols = ["routes", "reading", "runs", "median s", "worst s", "stall ms", "worst stall ms", "lock-blocked ms",
            "worst lock-blocked ms"]
    print(f"{'routes':>7} {'reading':>8} {'runs':>4} {'median s':>9} {'worst s':>8} {'stall ms':>9} {'worst':>8}"
          f" {'blocked ms':>11} {'worst':>8}  ({args.label})")
    for r in rows:
        print(f"{r[0]:>7} {r[1]:>8} {r[2]:>4} {r[3]:>9.3f} {r[4]:>8.3f} {r[5]:>9.1f} {r[6]:>8.1f} {r[7]:>11.1f}"
              f" {r[8]:>8.1f}")
    import torch  # noqa: F401 - the environment's torch version in the record
    import understudy  # noqa: F401
    title = f"a scrape and the serving thread's stall ({args.label})"
    _results.write("scrape", [_results.table(title, cols, rows, [",", None, None, ".3f", ".3f", ".1f", ".1f", ".1f", ".1f"])],
                   args={**vars(args), "library": library},
                   notes=["switch interval: a Python thread waits at most "
                          f"{sys.getswitchinterval() * 1e3:.0f} ms for another that runs Python code"])


if __name__ == "__main__":
    main()
