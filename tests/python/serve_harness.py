"""`transformers serve` under real client traffic, with and without
understudy: the pieces of tests/python/test_serve.py (its CPU and CUDA
tests).

The server is the `transformers serve` command itself, started in a process
group of its own. understudy reaches it only through its environment: the
start-up hook (python-shim/understudy-autoload.pth, processed at start-up by
a sitecustomize that runs site.addsitedir on python-shim, as site-packages
processes it once pip installed the package), UNDERSTUDY_CONFIG, and
UNDERSTUDY_CANDIDATE_MODULES naming serve_candidates.py (the torch-op
candidate). The server without understudy gets the same environment less
UNDERSTUDY_CONFIG (the hook then imports nothing) and less a sanitizer's
preload (it loads no library of ours).

Traffic comes from the `openai` client, from threads, each request a chat
completion (some streamed) with temperature 0 (greedy). Prometheus metrics
are scraped from the config's endpoint by a thread while requests run.
Nothing here touches the network beyond loopback: HF_HUB_OFFLINE and
TRANSFORMERS_OFFLINE are set, and the model is a local folder
(serve_model.py).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict

from conftest import free_port

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHIM = ROOT / "python-shim"
CANDIDATES = HERE / "serve_candidates.py"

# Variables of the calling process that would change what the server does.
_CLEARED = ("UNDERSTUDY_CONFIG", "UNDERSTUDY_CANDIDATE_MODULES", "PYTHONHOME", "RANK", "LOCAL_RANK",
            "PROMETHEUS_MULTIPROC_DIR", "VIRTUAL_ENV")
# A sanitizer preload belongs to the test runner's pass, not to the server
# (an external program here, run against a plain build of the library).
_SANITIZER = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC")


def server_env(work, *, config=None, candidate_modules=(CANDIDATES,), keep_sanitizer=False, **extra):
    """The server's environment: the start-up hook on its path, offline, its
    caches under work; UNDERSTUDY_CONFIG only when config is given, and a
    sanitizer's preload (keep_sanitizer) only then."""
    drop = _CLEARED + (() if keep_sanitizer and config is not None else _SANITIZER)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    for k in ("UNDERSTUDY_LIB", "UNDERSTUDY_PROBLEMS", "UNDERSTUDY_QUALIFIER"):
        if env.get(k):
            env[k] = os.path.abspath(env[k])  # the server runs in work, not here
    site_dir = pathlib.Path(work) / "site"
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(SHIM)!r})\n")
    # the caller's PYTHONPATH after the folder (packages installed with pip --target, for one)
    caller = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(site_dir)] + caller)
    env.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=str(pathlib.Path(work) / "hf-home"), TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    if candidate_modules:
        env["UNDERSTUDY_CANDIDATE_MODULES"] = ",".join(str(m) for m in candidate_modules)
    if config is not None:
        env["UNDERSTUDY_CONFIG"] = config if isinstance(config, str) else json.dumps(config)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def serve_command(model_dir, port, *, continuous_batching, device, cb_args=(), extra=()):
    """`transformers serve MODEL ...`: the console script beside this
    Python's executable, else the same entry point through -c."""
    script = pathlib.Path(sys.executable).parent / "transformers"
    if script.exists():
        head = [sys.executable, str(script)]
    else:
        head = [sys.executable, "-c", "import sys; sys.argv[0] = 'transformers'; "
                "from transformers.cli.transformers import main; main()"]
    cmd = head + ["serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", device,
                  "--log-level", "info"]
    if continuous_batching:
        cmd += ["--continuous-batching", *cb_args]
    return cmd + list(extra)


class Server:
    """One `transformers serve` process group, its log in a file."""

    def __init__(self, cmd, env, log_path, port):
        self.cmd, self.env, self.log_path, self.port = cmd, env, pathlib.Path(log_path), port
        self.proc = None
        self.returncode = None

    def start(self, timeout=300):
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=self.log_path.parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}) before it answered:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server did not answer /health within {timeout} s:\n{self.log()}")

    def log(self, tail=6000):
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def maps_library(self):
        """Whether libunderstudy.so is mapped in the server process."""
        return "libunderstudy" in pathlib.Path(f"/proc/{self.proc.pid}/maps").read_text()

    def stop(self, timeout=90):
        """SIGTERM to the group (uvicorn shuts down gracefully, then the
        signal takes its course); SIGKILL if it outlasts timeout. Returns the
        server's exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group: anything the server left behind
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)
        self._log.close()
        self.returncode = self.proc.returncode
        return self.returncode


def requests_for(n, *, seed=0, max_tokens=(8, 24), words=(3, 12), stream_every=3, vocab_size=320):
    """n chat requests: prompts of a few vocabulary words, max_tokens and
    prompt lengths spread over the given ranges, every stream_every-th
    streamed. Deterministic in seed."""
    import random

    from serve_model import SPECIALS

    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
    out = []
    for i in range(n):
        prompt = " ".join(rng.choice(vocab) for _ in range(rng.randint(*words)))
        out.append({"prompt": prompt, "max_tokens": rng.randint(*max_tokens),
                    "stream": stream_every > 0 and i % stream_every == stream_every - 1})
    return out


def _one(client, model, req):
    messages = [{"role": "user", "content": req["prompt"]}]
    t0 = time.monotonic()
    if req["stream"]:
        parts, finish, usage = [], None, None
        for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=req["max_tokens"],
                                                    temperature=0, stream=True):
            for ch in chunk.choices:
                if ch.delta.content:
                    parts.append(ch.delta.content)
                finish = ch.finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        content = "".join(parts)
    else:
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=req["max_tokens"],
                                           temperature=0)
        content, finish, usage = r.choices[0].message.content or "", r.choices[0].finish_reason, r.usage
    return {"content": content, "finish_reason": finish,
            "completion_tokens": None if usage is None else usage.completion_tokens,
            "prompt_tokens": None if usage is None else usage.prompt_tokens,
            "seconds": time.monotonic() - t0, **req}


def drive(port, model, reqs, *, concurrency, timeout=600):
    """Send reqs from `concurrency` threads through one openai client;
    responses in the order of reqs, with the wall time of the whole."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                           timeout=timeout)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        out = list(pool.map(lambda r: _one(client, model, r), reqs))
    return out, time.monotonic() - t0


class Scraper(threading.Thread):
    """Scrapes a Prometheus endpoint every `every` seconds until stopped;
    keeps (monotonic time, exposition text) of each answer."""

    def __init__(self, port, every=0.25):
        super().__init__(daemon=True)
        self.url, self.every = f"http://127.0.0.1:{port}/metrics", every
        self.scrapes, self.errors = [], Counter()
        self._stop_event = threading.Event()

    def scrape(self):
        try:
            with urllib.request.urlopen(self.url, timeout=5) as r:
                text = r.read().decode()
            self.scrapes.append((time.monotonic(), text))
            return text
        except (urllib.error.URLError, OSError) as e:
            self.errors[type(e).__name__] += 1
            return None

    def run(self):
        while not self._stop_event.is_set():
            self.scrape()
            self._stop_event.wait(self.every)

    def stop(self):
        self._stop_event.set()
        self.join(timeout=30)


def metric_sums(text, name, by=("operator",)):
    """{label values -> summed value} of the samples of one metric name."""
    from prometheus_client.parser import text_string_to_metric_families

    out = defaultdict(float)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(s.labels.get(k, "") for k in by)] += s.value
    return dict(out)


def report_ops(rep):
    """{binding op -> {"calls", "shadow": Counter}} over a report's shape keys."""
    out = defaultdict(lambda: {"calls": 0, "shadow": Counter()})
    for op in rep["operators"]:
        for s in op["shapes"]:
            row = out[s["op"]]
            row["calls"] += int(s["calls"])
            sh = s.get("shadow") or {}
            for k in ("calls", "passed", "failed", "skipped", "unverifiable"):
                row["shadow"][k] += int(sh.get(k, 0) or 0)
            for k, v in (sh.get("skipped_by") or {}).items():
                row["shadow"]["skipped_by_" + k] += int(v or 0)
    return dict(out)


# ---- one served run, and what it must show ----------------------------------------------

def understudy_config(work, metrics_port, *, silu_sample=1.0, more_operators=None):
    """Observe the GEMMs and attention; shadow aten::silu with the torch-op
    candidate of serve_candidates.py (on every call by default); the final
    report in work; metrics from an endpoint of its own. The candidate is
    Python: on a small shape under a sanitizer its median can pass the
    default shadow budget (25x production's), which would stop shadowing
    that key, so the budget is lifted (the budget has tests of its own)."""
    ops = {"gemm": "observe", "sdpa": "observe",
           "silu": {"mode": "shadow", "sample": silu_sample, "guard": {"max_slowdown": 1e9},
                    "candidate": {"torch_op": "understudy_serve::silu_sigmoid", "target": "aten::silu"}}}
    ops.update(more_operators or {})
    # top_keys above the keys a run makes: every key keeps a series of its own, so the sums over series stay
    # the report's totals (with fewer, a key that leaves the busiest stops being exposed: README, metrics)
    # every call keyed (key_every 1): the checks hold the ops' counts against one another exactly, where past a
    # thread's warm-up the defaults would estimate the counts of the GEMMs' keys
    return {"operators": ops, "defaults": {"key_every": 1},
            "report": {"path": str(pathlib.Path(work) / "report-{pid}.json"), "interval_s": 0},
            "metrics": {"port": metrics_port, "top_keys": 4096}}


def serve_and_drive(work, model_dir, traffic, *, config_for=None, continuous_batching=True, device="cpu",
                    cb_args=(), extra_args=(), keep_sanitizer=False, start_timeout=300, scrape_every=0.05, name="run",
                    launch=None):
    """Start `transformers serve` on model_dir (with understudy when
    config_for is given: a function of the metrics port returning the
    config), send the traffic, phase after phase (each a list of requests
    and the number of client threads that send them), scrape the metrics
    while it runs, then stop the server with SIGTERM. Returns a dict:
    responses (all phases, in order) and phases (one list a phase), wall_s
    (the traffic), start_s, scrapes [(t, text)], the traffic's start and end
    (monotonic), the final scrape's text, whether libunderstudy.so was
    mapped, the exit status, the report (or None) and the log's tail.
    launch, when given, turns (command, environment, config) into the ones
    started (the config then reaches the server its own way, not through
    UNDERSTUDY_CONFIG)."""
    work = pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    port, mport = free_port(), free_port()
    config = config_for(mport) if config_for else None
    env = server_env(work, config=None if launch else config, keep_sanitizer=keep_sanitizer)
    cmd = serve_command(model_dir, port, continuous_batching=continuous_batching, device=device, cb_args=cb_args,
                        extra=extra_args)
    if launch:
        cmd, env = launch(cmd, env, config)
    server = Server(cmd, env, work / f"server-{name}.log", port)
    scraper = Scraper(mport, every=scrape_every) if config else None
    out = {"name": name, "config": config, "scrapes": [], "final_scrape": None, "phases": []}
    t0 = time.monotonic()
    try:
        server.start(timeout=start_timeout)
        out["start_s"] = time.monotonic() - t0
        out["maps_library"] = server.maps_library()
        if scraper:
            scraper.start()
        out["traffic_start"] = time.monotonic()
        for reqs, concurrency in traffic:
            out["phases"].append(drive(port, str(model_dir), reqs, concurrency=concurrency)[0])
        out["traffic_end"] = time.monotonic()
        out["wall_s"] = out["traffic_end"] - out["traffic_start"]
        out["responses"] = [r for phase in out["phases"] for r in phase]
        if scraper:
            scraper.stop()
            out["final_scrape"] = scraper.scrape()
            out["scrapes"] = scraper.scrapes
            out["scrape_errors"] = dict(scraper.errors)
    finally:
        if scraper and scraper.is_alive():
            scraper.stop()
        out["returncode"] = server.stop()
        out["log"] = server.log()
    reports = sorted(work.glob("report-*.json"))
    out["report"] = json.loads(reports[-1].read_text()) if reports else None
    out["report_files"] = [p.name for p in reports]
    return out


def reference_generate(model_dir, reqs, *, device="cpu"):
    """Each request generated alone by model.generate() in this process
    (greedy, the model's own generation config, the chat template applied
    as the server applies it): [{"content", "tokens", "min_margin"}], the
    margin being the smallest gap between the two best logits of any step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device)
    out = []
    with torch.inference_mode():
        for r in reqs:
            inputs = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True, return_tensors="pt").to(device)
            g = model.generate(**inputs, max_new_tokens=r["max_tokens"], do_sample=False, output_scores=True,
                               return_dict_in_generate=True)
            gen = g.sequences[0, inputs["input_ids"].shape[-1]:]
            margin = min(float(v[0] - v[1]) for v in (s[0].float().topk(2).values for s in g.scores))
            out.append({"content": tok.decode(gen, skip_special_tokens=True), "tokens": int(gen.numel()),
                        "min_margin": margin})
    return out


def response_ids(tok, resp):
    """The token ids of a response: one per word (the tokenizer is
    word-level), then the end-of-sequence token when it stopped on it."""
    ids = tok.convert_tokens_to_ids(resp["content"].split())
    return ids + ([tok.eos_token_id] if resp["finish_reason"] == "stop" else [])


def bf16_step(x):
    """The spacing of bfloat16 numbers at x (8 significant bits)."""
    import math

    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def partings(model_dir, pairs, *, device="cpu", steps=8):
    """Where two greedy answers to the same request part, and whether they
    part at a near-tie. pairs: [(request, response a, response b)] whose
    tokens differ. For each, one forward of the model in this process on
    the prompt and the tokens the two share gives the logits of the next
    token: the answers part at a near-tie when both their tokens there lie
    within `steps` bfloat16 steps of the top logit (a few steps: the noise
    of a bfloat16 forward computed in another batch). Returns
    [{"at", "tokens", "logits", "top", "steps", "near_tie"}], steps being
    how far below the top the lower of the two lies, in bfloat16 steps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device, dtype="auto")
    out = []
    with torch.inference_mode():
        for req, a, b in pairs:
            prompt = tok.apply_chat_template([{"role": "user", "content": req["prompt"]}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
            ia, ib = response_ids(tok, a), response_ids(tok, b)
            k = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), None)
            if k is None:  # one is a prefix of the other: they part in length, not in a token
                out.append({"at": min(len(ia), len(ib)), "tokens": None, "logits": None, "top": None, "steps": None,
                            "near_tie": False})
                continue
            ids = torch.tensor([prompt + ia[:k]], device=device)
            logits = model(input_ids=ids).logits[0, -1].float()
            top = float(logits.max())
            la, lb = float(logits[ia[k]]), float(logits[ib[k]])
            below = (top - min(la, lb)) / bf16_step(top)
            out.append({"at": k, "tokens": (ia[k], ib[k]), "logits": (la, lb), "top": top, "steps": below,
                        "near_tie": below <= steps})
    return out


def _lower(m):
    """The smallest row count a pow2-bucketed key value M stands for."""
    return 1 if m <= 1 else m // 2 + 1


def check_responses(responses):
    """What the client sees of each response against its own count (a word
    per token; the end-of-sequence token, which decoding skips, ends a
    response that stopped, and may end one that reached max_tokens)."""
    problems = []
    for i, r in enumerate(responses):
        words, tokens = len(r["content"].split()), r["completion_tokens"]
        if tokens is None:
            problems.append(f"response {i}: no usage")
            continue
        if not words <= tokens <= words + 1:
            problems.append(f"response {i}: {tokens} tokens in its usage, {words} words")
        if r["finish_reason"] == "stop" and tokens != words + 1:
            problems.append(f"response {i}: stopped, but {tokens} tokens for {words} words")
        if r["finish_reason"] == "length" and tokens != r["max_tokens"]:
            problems.append(f"response {i}: finish 'length' after {tokens} of {r['max_tokens']} tokens")
        if tokens > r["max_tokens"] or r["finish_reason"] not in ("stop", "length"):
            problems.append(f"response {i}: {tokens} tokens, finish {r['finish_reason']!r}")
    return problems


def check_report(rep, responses, *, layers, vocab_size, continuous_batching, silu_sample=1.0):
    """The report of one served run against the traffic the client saw and
    the model's structure. Returns (figures, problems).

    Ground truth: one forward of the model runs, per layer, seven GEMMs
    (q, k, v, o, gate, up, down), one SiLU and one attention call; then the
    LM head's GEMM (N = vocab_size, told apart by its key) on one row per
    token generated in that forward, and the rotary embedding's one bmm.
    Plain generate: one forward per token of each request (the LM head on
    its last row only), so the LM head's calls are the tokens the client
    counted. Continuous batching: one forward per step of the batch, each
    step giving one token to each request in it, so the steps lie between
    the longest response and the sum of all, the LM head's rows (its M,
    bucketed to a power of two in the key) add up to the tokens, and with
    concurrent requests steps are fewer than tokens."""
    problems, figures = [], {}
    tokens = [r["completion_tokens"] or 0 for r in responses]
    total = sum(tokens)
    by_op = report_ops(rep)
    lm_calls = lm_lo = lm_hi = 0
    lm_phases = Counter()  # the LM head's calls (one a forward) by the phase understudy read from transformers
    for o in rep["operators"]:
        for s in o["shapes"]:
            if s["op"] == "aten::mm" and int(s["dims"].get("N", -1)) == vocab_size:
                m, c = int(s["dims"]["M"]), int(s["calls"])
                lm_calls, lm_lo, lm_hi = lm_calls + c, lm_lo + c * _lower(m), lm_hi + c * m
                lm_phases[s.get("phase", "unknown")] += c
    steps = lm_calls
    mm = by_op.get("aten::mm", {"calls": 0})["calls"]
    silu = by_op.get("aten::silu", {"calls": 0, "shadow": Counter()})
    sdpa = sum(v["calls"] for k, v in by_op.items() if "scaled_dot_product" in k)
    bmm = by_op.get("aten::bmm", {"calls": 0})["calls"]
    figures.update(requests=len(responses), tokens=total, forwards=steps, lm_head_rows=[lm_lo, lm_hi],
                   calls={k: v["calls"] for k, v in sorted(by_op.items())})

    def want(ok, what):
        if not ok:
            problems.append(what)

    figures["phases"] = dict(lm_phases)
    unknown = sorted({s["key"] for o in rep["operators"] for s in o["shapes"] if s.get("phase", "unknown") == "unknown"})
    want(not unknown, f"keys without a phase (transformers' prefill and decode not read): {unknown[:4]}")
    if continuous_batching:
        want(max(tokens) <= steps <= total, f"steps (LM-head calls) {steps} outside [{max(tokens)}, {total}]")
        want(lm_lo <= total <= lm_hi, f"LM-head rows in [{lm_lo}, {lm_hi}] do not hold the {total} tokens")
        want(steps < total, f"{steps} steps for {total} tokens: no two requests were batched")
        # a step holding a prompt is prefill: at least one, at most one per request (short prompts, one
        # step each); the steps of one new token per request are decode
        want(1 <= lm_phases["prefill"] <= len(responses) and lm_phases["decode"] >= 1,
             f"steps by phase {dict(lm_phases)} for {len(responses)} requests")
    else:
        want(steps == total and lm_hi == total, f"LM-head calls {steps} (rows up to {lm_hi}) != {total} tokens")
        # one generate() per request: its first token from the prefill, every other from a decode step
        answered = sum(1 for t in tokens if t)
        want(dict(lm_phases) == {"prefill": answered, "decode": total - answered},
             f"forwards by phase {dict(lm_phases)} != prefill {answered}, decode {total - answered}")
    want(silu["calls"] == layers * steps, f"aten::silu calls {silu['calls']} != {layers} layers x {steps} forwards")
    want(sdpa == layers * steps, f"attention calls {sdpa} != {layers} layers x {steps} forwards")
    want(mm - lm_calls == 7 * layers * steps, f"layer GEMMs {mm - lm_calls} != 7 x {layers} layers x {steps} forwards")
    want(bmm == steps, f"aten::bmm (rotary) calls {bmm} != {steps} forwards")

    sh = silu["shadow"]
    figures["shadow"] = dict(sh)
    want(sh["passed"] > 0, "no shadow call of the candidate passed")
    want(sh["failed"] == 0, f"{sh['failed']} shadow calls failed")
    # a call that took a slot ends verified, unverifiable or skipped for an error; the other skips took none
    want(sh["passed"] + sh["failed"] + sh["unverifiable"] + sh["skipped_by_error"] == sh["calls"],
         f"shadow outcomes do not add up: {dict(sh)}")
    if silu_sample >= 1.0:
        want(sh["calls"] == silu["calls"], f"sample 1.0 shadowed {sh['calls']} of {silu['calls']} silu calls: {dict(sh)}")
    t = rep["totals"]
    want(t["rollbacks"] == 0 and t["failed"] == 0, f"rollbacks {t['rollbacks']}, failed {t['failed']}")
    want(t["internal_errors"] == 0, f"{t['internal_errors']} internal errors")
    want(t["calls"] == sum(v["calls"] for v in by_op.values()), "totals.calls is not the sum of the shape keys")
    rollbacks = [s["key"] for o in rep["operators"] for s in o["shapes"] if (s.get("shadow") or {}).get("rollback")]
    want(not rollbacks, f"rolled back: {rollbacks}")

    weights = {o["name"]: o["weight"] for o in rep["operators"]}
    figures["weights"] = weights
    want(abs(sum(weights.values()) - 1) < 1e-9, f"operator weights sum to {sum(weights.values())}")
    want(all(w > 0 for w in weights.values()), f"an observed operator has no weight: {weights}")
    shape_w = sum(s["weight"] for o in rep["operators"] for s in o["shapes"])
    want(abs(shape_w - 1) < 1e-9, f"shape-key weights sum to {shape_w}")
    for o in rep["operators"]:
        ws = sum(s["weight"] for s in o["shapes"])
        want(abs(ws - o["weight"]) < 1e-9, f"{o['name']}: its keys' weights sum to {ws}, not {o['weight']}")
    return figures, problems


def check_metrics(run):
    """The scrapes of one run: counters that only grow, at least one scrape
    taken while requests were in flight that saw calls but not yet all of
    them, and the last scrape (after the traffic) equal to the final
    report, per operator: calls and the candidate's passing shadow calls."""
    problems = []
    rep, final = run["report"], run["final_scrape"]
    if final is None:
        return ["no scrape after the traffic"], []
    last = metric_sums(final, "understudy_calls_total")
    want = {o["name"]: sum(int(s["calls"]) for s in o["shapes"]) for o in rep["operators"]}
    got = {k[0]: int(v) for k, v in last.items()}
    if got != want:
        problems.append(f"understudy_calls_total after the traffic {got} != the report's {want}")
    passed = metric_sums(final, "understudy_shadow_calls_total", by=("operator", "outcome"))
    rep_passed = sum(int((s.get("shadow") or {}).get("passed", 0)) for o in rep["operators"] for s in o["shapes"])
    if int(sum(v for k, v in passed.items() if k[1] == "passed")) != rep_passed:
        problems.append(f"shadow passed in the metrics {passed} != the report's {rep_passed}")
    total = sum(want.values())
    during, prev, prev_series = [], 0, {}
    for i, (t, text) in enumerate(run["scrapes"]):
        series = metric_sums(text, "understudy_calls_total", by=("operator", "key", "phase"))
        n = int(sum(series.values()))
        if n < prev:
            gone = {k: v for k, v in prev_series.items() if k not in series}
            fell = {k: (v, series[k]) for k, v in prev_series.items() if k in series and series[k] < v}
            problems.append(f"understudy_calls_total went down at scrape {i} of {len(run['scrapes'])}: "
                            f"{prev} -> {n}; series gone {gone}, series that fell {fell}")
        prev, prev_series = n, series
        if run["traffic_start"] <= t <= run["traffic_end"] and 0 < n < total:
            during.append(n)
    if not during:
        problems.append(f"no scrape while requests ran saw calls short of the final {total} "
                        f"({len(run['scrapes'])} scrapes, errors {run.get('scrape_errors')})")
    return problems, during
