"""Does a candidate that hangs take the serving threads with it? Real runs on the CPU.

SERVERS threads serve aten::silu on a 16 x 64 tensor as fast as they can,
each checking every result against torch's silu computed before understudy
was enabled. A torch-op candidate of the same schema (registered here with
understudy.register_candidate) never returns from a call until the run
releases it; understudy is configured with guard.deadline_ms 200, in shadow
or live. Each round measures, in one process and in an order that
alternates from round to round:

- plain: the operator observed, SERVERS - 1 threads serving and one idle
  thread (so that as many threads compete for the cores and the GIL as in
  the other arm);
- hung: SERVERS threads serving through the guarded route; once a call
  entered the candidate, the route has rolled back and every call inside is
  found past its deadline, the threads that did not enter it are measured.

Both arms count the calls the serving threads (SERVERS - 1 of them; those
that entered the candidate are left out) complete while each completes
--calls more; the table prints per mode the median over rounds of hung
over plain, the rounds' lowest and highest, the plain calls per second, the
threads held, and the time from the first call's entry into the candidate
to the rollback read in the report (guard.deadline_ms is 200). The target
(issue 56): the other threads keep serving at >= 95 % of their plain
throughput, the route rolled back within 2 x the deadline.

    PYTHONPATH=python-shim python3 benchmarks/hung_candidate.py [--rounds 7] [--calls 5000]

The machine is shared and noisy: the figures are for this run, on this
machine; the alternating order and the median over rounds are what make
them comparable.
"""
import argparse
import pathlib
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F

import _results

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402

SERVERS = 8
DEADLINE_MS = 200


class Hang:
    """The candidate's switch: from the hang_from-th call of a round on,
    each call waits for the round's release."""

    def __init__(self):
        self.release = threading.Event()
        self.entered = []
        self.entered_at = None
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, x):
        with self.lock:
            self.calls += 1
            if self.release.is_set():
                return F.silu(x)
            self.entered.append(threading.current_thread().name)
            if self.entered_at is None:
                self.entered_at = time.perf_counter()
        self.release.wait(timeout=600)
        return F.silu(x)


STATE = {"hang": Hang()}
CANDIDATE = understudy.register_candidate("ust_bench::silu_hangs", lambda x: STATE["hang"](x), like="aten::silu")


def route(rep):
    (op,) = [o for o in rep["operators"] if o["name"] == "silu"]
    (s,) = op["shapes"]
    return s


def until(pred, what, timeout=120.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"hung_candidate: waited {timeout:.0f} s for {what}")
        time.sleep(0.002)


def serve(x, want, counts, i, stop, errors):
    try:
        while not stop.is_set():
            if not torch.equal(F.silu(x), want):
                errors.append(f"thread {i}: a wrong result")
            counts[i] += 1
    except Exception as e:  # noqa: BLE001 - reported, the run fails on it
        errors.append(f"thread {i}: {e!r}")


def idle(stop):
    stop.wait()


def rate(counts, who, n):
    c0, t0 = [counts[i] for i in who], time.perf_counter()
    until(lambda: all(counts[i] - c >= n for i, c in zip(who, c0)), f"each serving thread completes {n} calls")
    return sum(counts[i] - c for i, c in zip(who, c0)) / (time.perf_counter() - t0)


def plain_arm(x, want, calls, errors):
    understudy.enable({"operators": {"silu": "observe"}, "report": {"interval_s": 0}})
    counts, stop = [0] * SERVERS, threading.Event()
    threads = [threading.Thread(target=idle, args=(stop,))] + [
        threading.Thread(target=serve, args=(x, want, counts, i, stop, errors)) for i in range(1, SERVERS)]
    try:
        for t in threads:
            t.start()
        rate(counts, range(1, SERVERS), calls // 5)  # warm
        return rate(counts, range(1, SERVERS), calls)
    finally:
        stop.set()
        for t in threads:
            t.join()
        understudy.disable()


def hung_arm(mode, x, want, calls, errors):
    STATE["hang"] = hang = Hang()
    understudy.enable({"operators": {"silu": {"mode": mode, "sample": 1.0, "guard": {"deadline_ms": DEADLINE_MS},
                                              "candidate": {"torch_op": CANDIDATE, "target": "aten::silu"}}},
                       "report": {"interval_s": 0}})
    counts, stop = [0] * SERVERS, threading.Event()
    threads = [threading.Thread(target=serve, args=(x, want, counts, i, stop, errors), name=f"server-{i}")
               for i in range(SERVERS)]
    try:
        for t in threads:
            t.start()
        until(lambda: hang.entered, "a call to enter the candidate")
        until(lambda: route(understudy.report())["mode"] == "rolled_back", "the route to roll back")
        rolled = time.perf_counter() - hang.entered_at
        until(lambda: (f := route(understudy.report())["in_flight"])["inside"] == len(set(hang.entered)) == f["swept"],
              "every call inside to be found past its deadline")
        held = sorted(set(hang.entered))
        free = [i for i in range(SERVERS) if f"server-{i}" not in held][:SERVERS - 1]
        got = rate(counts, free, calls)
        if hang.release.is_set():
            raise RuntimeError("hung_candidate: the candidate was released before the measure ended")
        return got, len(held), rolled
    finally:
        hang.release.set()
        stop.set()
        for t in threads:
            t.join()
        understudy.disable()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5000, help="calls each measured thread completes per arm")
    ap.add_argument("--modes", nargs="+", default=["shadow", "live"], choices=["shadow", "live"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(16, 64)
    want = F.silu(x)
    errors = []
    rows = []
    for mode in args.modes:
        ratios, plains, helds, rolls = [], [], [], []
        for r in range(args.rounds):
            if r % 2 == 0:
                p = plain_arm(x, want, args.calls, errors)
                h, held, rolled = hung_arm(mode, x, want, args.calls, errors)
            else:
                h, held, rolled = hung_arm(mode, x, want, args.calls, errors)
                p = plain_arm(x, want, args.calls, errors)
            ratios.append(h / p)
            plains.append(p)
            helds.append(held)
            rolls.append(rolled * 1e3)
            print(f"{mode} round {r + 1}: plain {p:.0f} calls/s, hung {h:.0f} calls/s (ratio {h / p:.3f}), "
                  f"{held} thread(s) held, rolled back {rolled * 1e3:.0f} ms after the first entry", flush=True)
        if errors:
            raise SystemExit(f"hung_candidate: serving threads saw errors: {errors[:3]}")
        rows.append([mode, args.rounds, statistics.median(ratios), min(ratios), max(ratios),
                     statistics.median(plains), max(helds), statistics.median(rolls), max(rolls)])
    t = _results.table(
        f"{SERVERS} serving threads, a candidate that hangs, guard.deadline_ms {DEADLINE_MS}: the other threads' "
        f"throughput while the hung call is inside over the same threads' plain (observed), {args.calls} calls "
        "each per arm, arms alternating",
        ["mode", "rounds", "hung/plain (median)", "lowest", "highest", "plain calls/s", "threads held (max)",
         "rollback after entry, ms (median)", "worst, ms"],
        rows, [None, None, ".3f", ".3f", ".3f", ",.0f", None, ".0f", ".0f"])
    print()
    print(f"{'mode':8s} {'rounds':>6s} {'hung/plain':>11s} {'range':>13s} {'plain/s':>9s} {'held':>5s} "
          f"{'rollback ms':>12s} {'worst':>6s}")
    for m, n, med, lo, hi, p, held, roll, worst in rows:
        print(f"{m:8s} {n:6d} {med:11.3f} {lo:6.3f}-{hi:6.3f} {p:9.0f} {held:5d} {roll:12.0f} {worst:6.0f}")
    _results.write("hung_candidate", [t], args=args)


if __name__ == "__main__":
    main()
