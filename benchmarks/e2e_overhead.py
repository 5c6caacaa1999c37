"""End-to-end cost of understudy on HF decode, at its default configuration.

HF decoders with random weights (a Mistral-7B-shaped and a Qwen2-MoE-shaped
one, --layers layers, bf16) generate --tokens new tokens greedily at each
--batch. Two processes take turns on the GPU: one plain (never loads understudy),
one that enabled understudy once at its defaults (every shipped operator
observed, a sample of the calls timed, events around them) or with --timer cupti
(the kernel tracer, its windows sized to its 1 % budget), and keeps it
enabled, as a serving process would. Rounds
interleave them after a warm-up of both; the table prints the median wall
time of each over the rounds, their ratio, the range of the rounds' ratios
(each round's observed over the plain run beside it), and how many tracer windows the
observed process had concluded by its last round.

Processes taking turns resolve only what the machine's drift between rounds
leaves (on a shared machine, rounds of one run differ by 10 % and more).
--paired measures in one process instead, step against step: the decoder
decodes --tokens steps by hand (a forward and the argmax of its logits,
synchronised), understudy enabled as above, every operator's mode switched
between steps (untimed) so that consecutive steps run --modes A, B, B, A,
... (B, A, A, B, ... in every other run), one step more run untimed after
each switch (what the switch left cold is paid there); each pair of
neighbouring timed steps gives a difference, taken moments apart on nearly
the same cache lengths. The
table prints the median step in B, the median difference (A minus B;
observe minus off by default, observe minus observe for the method's own
bias) with a 95 % interval of that median (order statistics of the
differences), their ratio, and the intercepted calls per step. Off still
passes each call through understudy's interceptor. The mode plain takes
understudy out of the dispatcher for its steps: a fallthrough kernel
registered (torch.library) over each of its interceptors, as torch's own
BackendSelect fallback is one, so that the dispatcher skips the key as it
does without understudy, and dropped again for the other mode's steps
(--modes observe plain: understudy against plain torch, in one process;
plain plain: the method's own bias with the switch it makes). Every switch
makes and drops the fallthroughs alike, whichever mode it sets. The mode
disabled disables understudy for its steps (its interceptors stay
registered, as they do for the life of the process, and hand every call on
at once: the dispatcher's hop through them and nothing of the router) and
enables it again, a new engine, for the other mode's steps (so only
against plain, off or itself, and not with --steady: an observed step
would start its keys anew): --modes disabled plain measures what intercepting costs before
understudy does anything with a call, with a bias: for about 100 ms the steps after a switch
that enabled run slower than those after one that disabled (seen on the CPU), and every switch
to the other mode enables again. --modes off plain measures the hop without that switch (mode
off adds a few instructions to it).
--generate runs --paired's steps inside model.generate (greedy) instead:
a logits processor, called once a step after its forward, synchronises,
times the step that ended and switches the mode, so that a step is what
HF decoding runs end to end (generate's own work between forwards with
the forward), the switches outside every step.
--runs N makes N runs, each a process of its own that measures every
row in turn, and prints each row's median over its runs: the median of
interleaved runs that a budget is stated in.
--steady first decodes observed until every key the decode calls is past
its operator's steady_after (defaults: 4,096 calls, after which 1 call in
256 is timed instead of 1 in 16): the state of a process that has served a
while; the table says how many warm-up steps that took. Its column keyed is
the share of the calls counted (the warm-up's among them) that were keyed one
by one: past a thread's first calls the defaults key 1 call in 64 of an
operator without a candidate and tally the others (defaults.key_every).
Where a mode observes (and neither is disabled: each enable starts a
thread's warm-up again), one more run after the rounds, every step
observed, counts the calls keyed one by one and those timed per decode
step (keyed/step, timed/step): what observing does past tallying.

    PYTHONPATH=python-shim python3 benchmarks/e2e_overhead.py [--rounds 7] [--batch 1 8] [--timer cupti]
    PYTHONPATH=python-shim python3 benchmarks/e2e_overhead.py --paired [--rounds 7] [--batch 1 8] [--steady] [--generate]
        [--runs 7 [--until S]]

Without a GPU (or with --device cpu) the decoders run on the CPU at small
widths (hidden 256, fp32, one torch thread): their steps are bound by the
host, as a GPU decode step is, and the paired figures measure the host's
part of what understudy costs a step (no CUDA stream, launch or event).
"""
import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

import _results
import models

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "python-shim"))
import understudy  # noqa: E402


DEVICE = "cuda"  # --device
GENERATE = False  # --generate: --paired's steps inside model.generate


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build(kind, layers):
    """The decoder --models names (benchmarks/models.py), at small widths on the CPU."""
    return models.build(kind, layers, DEVICE, small=DEVICE == "cpu")


def device_name():
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (small widths, fp32)"


def prompt(batch):
    return torch.randint(1, 32000, (batch, 16), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1))


def timed_generate(model, ids, tokens):
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    sync()
    return time.perf_counter() - t0


def server(observed):
    """Runs requests read from stdin: "setup KIND BATCH TOKENS LAYERS" builds a
    model, "run" times one generate and prints seconds (and, observed, the
    tracer's windows so far). The observed server enables understudy once, at
    its defaults, for its whole life, as a serving process would."""
    if observed:
        understudy.enable(json.loads(observed))
    model = ids = None
    tokens = 0
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "setup":
            model = None
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            model = build(cmd[1], int(cmd[4]))
            ids = prompt(int(cmd[2]))
            tokens = int(cmd[3])
            for _ in range(2):
                timed_generate(model, ids, tokens)  # warm-up
            print("ready", flush=True)
        elif cmd[0] == "run":
            t = timed_generate(model, ids, tokens)
            w = understudy.report()["timer"].get("windows", 0) if observed else 0
            print(t, w, flush=True)


def measure(kids, kind, batch, tokens, layers, rounds):
    for k in kids.values():
        k.stdin.write(f"setup {kind} {batch} {tokens} {layers}\n")
        k.stdin.flush()
        assert k.stdout.readline().strip() == "ready"
    times = {name: [] for name in kids}
    windows = 0
    for _ in range(rounds):
        for name, k in kids.items():
            k.stdin.write("run\n")
            k.stdin.flush()
            t, w = k.stdout.readline().split()
            times[name].append(float(t))
            windows = max(windows, int(w))
    pairs = sorted(o / p for p, o in zip(times["plain"], times["observed"]))
    return statistics.median(times["plain"]), statistics.median(times["observed"]), windows, pairs[0], pairs[-1]


def median_interval(xs):
    """The median of xs and a 95 % interval of it from order statistics
    (the ranks a binomial(n, 1/2) puts 1.96 standard deviations either side
    of n/2)."""
    xs = sorted(xs)
    n = len(xs)
    half = 0.98 * n ** 0.5  # 1.96 standard deviations of binomial(n, 1/2)
    mid = (n - 1) / 2  # the median's rank, from 0
    lo, hi = max(math.floor(mid - half), 0), min(math.ceil(mid + half), n - 1)
    return statistics.median(xs), xs[lo], xs[hi]


def decode(model, ids, plan, on_step=None, after_prefill=None):
    """A prefill of ids (then after_prefill()), then one greedy decode step
    per mode in plan (on_step(i, mode) before step i): each step's wall
    time, synchronised. Where after_prefill or on_step switched the mode
    (returned true), one more step runs untimed first: what a switch leaves
    cold or rebuilt (torch's dispatch tables, understudy's policies) is
    paid there, not by the timed step of one mode. With --generate the
    steps are model.generate's (decode_generate)."""
    if GENERATE:
        return decode_generate(model, ids, plan, on_step, after_prefill)
    times = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        switched = after_prefill is not None and after_prefill()
        for i, mode in enumerate(plan):
            if on_step is not None:
                switched = on_step(i, mode) or switched
            if switched:
                out = model(nxt, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                switched = False
            sync()
            t0 = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            sync()
            times.append(time.perf_counter() - t0)
    return times


def decode_generate(model, ids, plan, on_step=None, after_prefill=None):
    """decode() with the steps model.generate runs (greedy): a logits
    processor, called once a step after the step's forward, synchronises,
    ends the step that ran and sets the next one's mode; a stopping
    criterion ends the generation once the plan has run. A step's time runs
    from the processor's return to its next call: generate's own work
    between forwards (the next step's inputs, the cache's update, the
    token's selection and the stopping checks) with the forward, what a
    step of HF decoding costs end to end; the switches themselves, inside
    the processor, fall outside every step."""
    from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
    times = []  # the plan's steps timed so far: the next one is plan[len(times)]
    # when the step running now began (None: the prefill, or the untimed step
    # after a switch), whether it is that untimed step, whether the prefill is done
    st = {"start": None, "untimed": False, "prefilled": False}

    class Steps(LogitsProcessor):
        def __call__(self, input_ids, scores):
            sync()
            now = time.perf_counter()
            if st["start"] is not None:
                times.append(now - st["start"])
            i = len(times)
            if i == len(plan):
                return scores  # Done ends the generation
            if st["untimed"]:  # the step after a switch ran: plan[i] now, timed
                st["untimed"] = False
            else:
                switched = not st["prefilled"] and after_prefill is not None and after_prefill()
                st["prefilled"] = True
                if on_step is not None:
                    switched = on_step(i, plan[i]) or switched
                st["untimed"] = switched
            st["start"] = None if st["untimed"] else time.perf_counter()
            return scores

    class Done(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = len(times) == len(plan)
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    # at most an untimed step before each of the plan's, and the prefill's token
    most = 2 * len(plan) + 1
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=most, min_new_tokens=most, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([Steps()]),
                       stopping_criteria=StoppingCriteriaList([Done()]))
    if len(times) != len(plan):
        raise SystemExit(f"e2e_overhead.py: generate ran {len(times)} timed steps of {len(plan)}")
    return times


def paired_rounds(model, ids, modes, rounds, tokens, switch, count, counts):
    """rounds + 1 runs of tokens decode steps (the first a warm-up), each
    step in modes[0] or modes[1], switch(mode) setting one between steps
    (untimed) and saying whether it switched: ABBA..., and BAAB... in every
    other run, so that the step after the prefill (and the trend of a run)
    fall to both modes alike. Returns the steps of modes[1] paired, the
    differences (modes[0] minus modes[1]) of neighbouring steps, and per run
    past the warm-up what count() grew by over its decode, per step run in
    a mode that counts(mode) accepts."""
    base, diffs, per_step = [], [], []
    first, second = modes
    for r in range(rounds + 1):
        a_, b_ = (first, second) if r % 2 == 0 else (second, first)
        plan = [(a_, b_, b_, a_)[i % 4] for i in range(tokens)]
        # the steps run: the plan's and the untimed one after each switch
        # (after the prefill, and before every odd step)
        counted = sum(map(counts, [*plan, plan[0], *plan[1::2]]))
        before = []

        def prefilled(plan=plan, before=before):
            before.append(count())
            return switch(plan[0])  # a run of a length not a multiple of 4 ends in the other mode
        # where the plan changes mode (also when both are one mode)
        times = decode(model, ids, plan, lambda i, mode: i % 2 == 1 and switch(mode), prefilled)
        if r == 0:
            continue
        per_step.append((count() - before[0]) / max(counted, 1))
        for i in range(0, tokens - 1, 2):
            # the step of modes[0] in this pair: by position, so that a mode
            # against itself is paired both ways too
            at = i if (i % 4 == 0) == (r % 2 == 0) else i + 1
            diffs.append(times[at] - times[2 * i + 1 - at])
            base.append(times[2 * i + 1 - at])
    return base, diffs, per_step


def use_device(name, prog):
    """Where the decoders run: name, else the GPU when torch sees one (the
    CPU with one torch thread)."""
    global DEVICE
    DEVICE = name or ("cuda" if torch.cuda.is_available() else "cpu")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{prog}: --device cuda, and torch sees no CUDA GPU")
    if DEVICE == "cpu":
        torch.set_num_threads(1)


def key_calls():
    """{shape key: (calls, its operator's steady_after or None)}."""
    return {s["key"]: (s["calls"], o.get("steady_after")) for o in understudy.report()["operators"]
            for s in o["shapes"]}


def warm_to_steady(model, ids, tokens):
    """Decode observed, --tokens steps a run, until every key that a run's
    decode steps call (at least once a step: not the prefill's) is past its
    operator's steady_after; the decode steps it took."""
    steps = 0
    while steps < 200_000:
        before = key_calls()
        decode(model, ids, ["observe"] * tokens)
        steps += tokens
        grown = [(n, after) for k, (n, after) in key_calls().items() if n - before.get(k, (0, None))[0] >= tokens]
        if all(after is None or n > after for n, after in grown):
            break
    return steps


class Plain:
    """Understudy out of the dispatcher while entered: a fallthrough kernel
    registered at BackendSelect over the interceptor of each op named (as
    "ns::op[.overload]"), so that the dispatcher skips the key for them as
    it does without understudy (torch's BackendSelect fallback is a
    fallthrough); leave() drops them and the interceptors serve again."""

    def __init__(self, names):
        self.names = [n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "BackendSelect")]
        self.libs = None

    def enter(self):
        if self.libs is not None:
            return
        import warnings
        self.libs = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that a kernel is overridden
            for name in self.names:
                ns, op = name.split("::", 1)
                lib = self.libs.get(ns) or self.libs.setdefault(ns, torch.library.Library(ns, "IMPL"))
                lib.impl(op, torch.library.fallthrough_kernel, "BackendSelect")

    def leave(self):
        if self.libs is None:
            return
        for lib in self.libs.values():
            lib._destroy()
        self.libs = None


def paired(kind, batch, tokens, layers, rounds, config, modes, steady=False, pass_by=None):
    """Neighbouring decode steps with every operator in modes[0] and in
    modes[1] (see the module's doc): (median step in modes[1], the
    differences, intercepted calls per step where they are counted: not
    with the mode off, the warm-up steps --steady took, the share keyed, and
    the calls keyed and timed per observed step: observed_steps)."""
    model = build(kind, layers)
    ids = prompt(batch)
    understudy.enable(config)
    ops = [o["name"] for o in understudy.report()["operators"] if o["bindings"]]
    plain = Plain([b for o in understudy.report()["operators"] for b in o["bindings"]
                   if not pass_by or any(b == n or b.startswith(n + ".") for n in pass_by)])
    # the mode understudy's operators keep while plain or disabled steps pass them by
    held = next((m for m in modes if m not in ("plain", "disabled")), "observe")

    def set_all(mode):
        plain.leave()
        plain.enter()
        if mode == "disabled":
            understudy.disable()
        else:
            if not understudy.is_enabled():
                understudy.enable(config)
            for name in ops:
                understudy.set_mode(name, held if mode == "plain" else mode)
        if mode != "plain":
            plain.leave()
        return True

    def calls():  # not counted with the mode off, nor while disabled
        return sum(o["calls"] for o in understudy.report()["operators"]) if understudy.is_enabled() else 0
    warm = warm_to_steady(model, ids, tokens) if steady else 0
    base, diffs, steps_calls = paired_rounds(model, ids, modes, rounds, tokens, set_all, calls,
                                             lambda m: m not in ("off", "plain", "disabled"))
    keyed = keyed_share(understudy.report()) if understudy.is_enabled() else float("nan")
    # (not after disabled steps: enable() made a new engine, whose warm-up keys every call)
    sampled = observed_steps(model, ids, tokens, set_all) if "observe" in modes and "disabled" not in modes \
        else (float("nan"),) * 2
    plain.leave()
    understudy.disable()
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(base), diffs, statistics.median(steps_calls), warm, keyed, sampled


def observed_steps(model, ids, tokens, set_all):
    """After the rounds, one more run of tokens decode steps observed: the
    calls keyed one by one and the calls timed, per decode step (the
    prefill's left out)."""
    def seen():
        shapes = [s for o in understudy.report()["operators"] for s in o["shapes"]]
        return sum(s["calls"] - s.get("estimated", 0) for s in shapes), sum(s["timed"] for s in shapes)
    set_all("observe")
    before = []
    decode(model, ids, ["observe"] * tokens, after_prefill=lambda: before.append(seen()))
    (k0, t0), (k1, t1) = before[0], seen()
    return (k1 - k0) / tokens, (t1 - t0) / tokens


def keyed_share(rep):
    """Of the calls a report counted, the share keyed one by one (the others
    tallied without a key: defaults.key_every); nan where it counted none."""
    seen = sum(s["calls"] - s.get("estimated", 0) for o in rep["operators"] for s in o["shapes"])
    total = seen + rep["totals"].get("tallied", 0)
    return seen / total if total else float("nan")


def paired_title(args):
    """What a --paired table measured, in words (its results file's title)."""
    first, second = args.modes
    return (f"{first} − {second}, neighbouring steps paired"
            + (", the steps model.generate runs" if args.generate else ", steps driven by hand")
            + (", after decoding observed until every decode key is steady" if args.steady else "")
            + (f", timer {args.timer}" if args.timer else "")
            + (f", config {args.config}" if args.config else "")
            + (f", plain passes by {' '.join(args.pass_by)} alone" if args.pass_by else ""))


def runs(args):
    """--paired --runs N: N runs, each a process of its own (torch, the models
    and understudy made anew: interleaved runs) that
    measures every row (model, batch) in turn, so that a drift of the machine
    falls on all rows alike; each row printed as it ends, then per row the
    median over its runs of the ratio and of the difference. --until: no row
    starts once that many seconds have passed."""
    import subprocess
    import tempfile
    # this run's own arguments, the last of each repeated option standing (argparse)
    argv = [sys.executable, __file__, *sys.argv[1:], "--runs", "1", "--row-json", "--device", DEVICE]
    deadline = None if args.until is None else time.time() + args.until
    argv += ["--deadline", repr(deadline)] if deadline is not None else []
    got = {(kind, b): [] for kind in args.models for b in args.batch}
    header = True
    for n in range(args.runs):
        if deadline is not None and time.time() > deadline:
            break
        # its stderr in a file: a pipe the parent does not read while it reads
        # stdout would stop the child once full (torch's and HF's warnings)
        err = tempfile.TemporaryFile("w+")
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        lines = []
        for line in child.stdout:
            line = line.rstrip("\n")
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                got[(row["model"], row["batch"])].append(row)
                print(lines[-1], flush=True)
            elif header and len(lines) == 1:
                print(lines[0] + f"; {args.runs} runs, each a process of its own\n" + line, flush=True)
                header = False
            lines.append(line)
        if child.wait() != 0:
            err.seek(0)
            print(f"run {n + 1}: the child ended with {child.returncode}\n{err.read()[-2000:]}", flush=True)
        err.close()
    first_mode, second = args.modes
    print(f"\n{'model':<10} {'batch':>5} {'runs':>5} {'median ' + first_mode + ' - ' + second:>26} "
          f"{'median ratio':>13} {'ratios':>17}")
    rows = []
    for (kind, b), rs in got.items():
        if not rs:
            print(f"{kind:<10} {b:>5} {0:>5}")
            rows.append((kind, b, 0, None, None, None, None))
            continue
        ratios = sorted(r["ratio"] for r in rs)
        med = statistics.median(r["med"] for r in rs)
        print(f"{kind:<10} {b:>5} {len(rs):>5} {med * 1e6:>23.2f} us {statistics.median(ratios):>13.4f} "
              f"{ratios[0]:>8.4f}-{ratios[-1]:<8.4f}", flush=True)
        rows.append((kind, b, len(rs), round(med * 1e6, 2), round(statistics.median(ratios), 4),
                     round(ratios[0], 4), round(ratios[-1], 4)))
    _results.write("e2e_overhead", [_results.table(
        paired_title(args) + f"; each row's median over its runs (up to {args.runs}, each a process of its own)",
        ["model", "batch", "runs", f"{first_mode} − {second}, µs", "ratio (median)", "lowest ratio",
         "highest ratio"], rows, [None, None, None, "+.1f", ".4f", ".4f", ".4f"])], args=args, device=DEVICE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["mistral", "qwen-moe"])
    ap.add_argument("--timer", choices=["events", "cupti", "cupti-callbacks"], default=None,
                    help="the timer of the observed process (default: understudy's default)")
    ap.add_argument("--config", default=None,
                    help="JSON merged over the observed process's config (e.g. '{\"timer\": {\"budget\": 0.001}}')")
    ap.add_argument("--paired", action="store_true",
                    help="in one process, neighbouring decode steps observed and with every mode off")
    ap.add_argument("--modes", nargs=2, default=["observe", "off"], metavar=("A", "B"),
                    choices=["observe", "off", "plain", "disabled"],
                    help="--paired: the two modes compared (plain: understudy's interceptors passed by; "
                         "disabled: understudy disabled, its interceptors handing every call on; "
                         "observe observe or plain plain: the method's own bias)")
    ap.add_argument("--pass-by", nargs="+", default=None, metavar="OP",
                    help="--paired, mode plain: pass by only these ops' interceptors (\"ns::op\", with or "
                         "without its overloads; default: every one), the others serving both modes")
    ap.add_argument("--generate", action="store_true",
                    help="--paired: the steps model.generate runs (greedy), timed from its logits processor, "
                         "instead of a forward and an argmax by hand")
    ap.add_argument("--steady", action="store_true",
                    help="--paired: first decode observed until every decode key is past its steady_after")
    ap.add_argument("--runs", type=int, default=1,
                    help="--paired: this many runs, each a process of its own measuring every row in turn; "
                         "then each row's median over its runs")
    ap.add_argument("--until", type=float, default=None, metavar="S",
                    help="--runs: start no row once S seconds have passed (the summary counts the rows made)")
    ap.add_argument("--row-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="where the decoders run (default: the GPU when there is one); on the CPU at small "
                         "widths, fp32, one torch thread")
    ap.add_argument("--server", help=argparse.SUPPRESS)
    args = ap.parse_args()
    use_device(args.device, "e2e_overhead.py")
    global GENERATE
    GENERATE = args.generate
    if args.server:
        server(None if args.server == "plain" else args.server)
        return
    if "disabled" in args.modes and (args.steady or "observe" in args.modes):
        sys.exit("e2e_overhead.py: the mode disabled pairs with plain, off or itself, without --steady: "
                 "every enable after it starts a new engine (counts and first calls anew)")
    import subprocess
    timer = {"kind": "cupti", "correlation": "callbacks"} if args.timer == "cupti-callbacks" else \
        {"kind": args.timer} if args.timer else None
    cfg = {"timer": timer} if timer else {}
    for key, val in json.loads(args.config or "{}").items():
        cfg[key] = {**cfg.get(key, {}), **val} if isinstance(val, dict) else val
    config = json.dumps(cfg)
    if args.paired and args.runs > 1:
        runs(args)
        return
    if args.paired:
        print(f"torch {torch.__version__}; {device_name()}; understudy {understudy.__version__}; "
              f"config {config}; {args.rounds} runs of {args.tokens} decode steps after a warm-up run, "
              f"{args.layers} layers; neighbouring steps paired"
              + ("; the steps model.generate runs" if args.generate else "")
              + ("; after decoding observed until every decode key is steady" if args.steady else "")
              + (f"; plain passes by {' '.join(args.pass_by)} alone" if args.pass_by else ""))
        first, second = args.modes
        rows = []
        print(f"{'model':<10} {'batch':>5} {'step, ' + second:>14} {'pairs':>6} {first + ' - ' + second:>18} "
              f"{'95 % interval':>18} {'ratio':>7} {'calls/step':>10} {'warm-up':>8} {'keyed':>6} "
              f"{'keyed/step':>10} {'timed/step':>10}")
        for kind in args.models:
            for b in args.batch:
                if args.deadline is not None and time.time() > args.deadline:
                    break
                base, diffs, per_step, warm, keyed, (keyed_step, timed_step) = paired(
                    kind, b, args.tokens, args.layers, args.rounds, config, args.modes, args.steady, args.pass_by)
                med, lo, hi = median_interval(diffs)
                print(f"{kind:<10} {b:>5} {base * 1e3:>12.3f}ms {len(diffs):>6} {med * 1e6:>15.2f} us "
                      f"{lo * 1e6:>7.2f} .. {hi * 1e6:>6.2f} us {1 + med / base:>7.4f} {per_step:>10.1f} "
                      f"{warm:>8} {keyed:>6.1%} {keyed_step:>10.2f} {timed_step:>10.2f}", flush=True)
                if args.row_json:
                    print("ROW " + json.dumps({"model": kind, "batch": b, "base": base, "med": med,
                                               "ratio": 1 + med / base}), flush=True)
                rows.append((kind, b, round(base * 1e3, 3), len(diffs), round(med * 1e6, 2), round(lo * 1e6, 2),
                             round(hi * 1e6, 2), round(1 + med / base, 4), round(per_step, 1), warm,
                             round(keyed, 4), round(keyed_step, 2), round(timed_step, 2)))
        if not args.row_json:  # a child of --runs: its parent writes the summary
            _results.write("e2e_overhead", [_results.table(
                paired_title(args) + f"; {args.rounds} runs of {args.tokens} steps, {args.layers} layers",
                ["model", "batch", f"step ({second}), ms", "pairs", f"{first} − {second}, µs", "95 % interval from",
                 "to", "ratio", "calls/step", "warm-up steps", "keyed", "keyed/step", "timed/step"], rows,
                [None, None, ".3f", None, "+.1f", ".1f", ".1f", ".4f", ".1f", None, ".1%", ".2f", ".2f"])],
                args=args, device=DEVICE)
        return
    kids = {name: subprocess.Popen([sys.executable, __file__, "--server", arg, "--device", DEVICE], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
            for name, arg in (("plain", "plain"), ("observed", config))}
    print(f"torch {torch.__version__}; {device_name()}; understudy {understudy.__version__}; "
          f"config {config}; median of {args.rounds} interleaved rounds, {args.tokens} new tokens, "
          f"{args.layers} layers")
    print(f"{'model':<10} {'batch':>5} {'plain s':>9} {'observed s':>11} {'ratio':>7} {'rounds':>13} {'windows':>8}")
    rows = []
    for kind in args.models:
        for b in args.batch:
            p, o, w, lo, hi = measure(kids, kind, b, args.tokens, args.layers, args.rounds)
            print(f"{kind:<10} {b:>5} {p:>9.4f} {o:>11.4f} {o / p:>7.4f} {lo:>6.3f}-{hi:<6.3f} {w:>8}", flush=True)
            rows.append((kind, b, round(p, 4), round(o, 4), round(o / p, 4), round(lo, 3), round(hi, 3), w))
    for k in kids.values():
        k.stdin.close()
        k.wait()
    _results.write("e2e_overhead", [_results.table(
        f"generate, plain and observed (config {config}) in two processes taking turns; median of {args.rounds} "
        f"rounds, {args.tokens} new tokens, {args.layers} layers",
        ["model", "batch", "plain s", "observed s", "ratio", "rounds' ratios from", "to", "tracer windows"], rows,
        [None, None, ".4f", ".4f", ".4f", ".3f", ".3f", None])], args=args, device=DEVICE)


if __name__ == "__main__":
    main()
