"""A real serving runtime under real client traffic: `transformers serve`
(HF transformers' OpenAI-compatible server, uvicorn and FastAPI) driven by
the `openai` client with concurrent chat completions, run twice on the same
local model: without understudy, and with it.

understudy reaches the server only through its environment; the server's
code is untouched and nothing of this test runs in it:
- the start-up hook pip installs (python-shim/understudy-autoload.pth),
  processed at the server's start-up as site-packages processes it (a
  sitecustomize in a temporary folder on PYTHONPATH runs site.addsitedir on
  python-shim: the clone has no pip install), enables understudy from
  UNDERSTUDY_CONFIG once torch is imported;
- UNDERSTUDY_CANDIDATE_MODULES names tests/python/serve_candidates.py, which
  activation imports before enabling: it registers the torch-op candidate
  (aten::silu as x * sigmoid(x)) that the config shadows.
The server without understudy gets the same environment less
UNDERSTUDY_CONFIG (the hook then imports nothing: libunderstudy.so is not
mapped, no report, no metrics endpoint).

Ground truth, none of it from a TorchDispatchMode: the client's own count of
the tokens it received (a word-level tokenizer: a word per token); the same
requests generated one by one by model.generate() in this process; and the
model's structure (per forward: seven GEMMs, one SiLU and one attention call
per layer, then the LM head's GEMM on one row per token and the rotary
embedding's bmm), checked in serve_harness.check_report.

CPU (every pass): a Llama of two layers (hidden 64, vocabulary 320) with
random weights in float32, its tokenizer built here (serve_model.py);
HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are set, nothing is downloaded.
Continuous batching runs on the CPU (`--continuous-batching`: the paged
cache with attention `paged|sdpa`, the scheduler batching requests step by
step); the plain path (one `model.generate()` per request, in turn) is
tested too (in the plain pass only). The servers run against the library
of the pass (in the sanitized pass the server with understudy keeps the
preload, as the other tests' child processes do).

bfloat16, on the CPU (the tiny Llama) and on a CUDA device (skipped without
one: Llama-3-8B's shape with two layers), continuous batching with paged
attention, CUDA graphs off (a graph replay makes no dispatcher calls, so the
structure could not be counted): requests sent one at a time get identical
answers, requests batched as they arrive may part only at a near-tie.

transformers, fastapi, uvicorn and openai come from ./run.sh's set-up
(`./run.sh serve-deps` installs only those, from build/wheelhouse when it
holds their wheels).
"""
import os

import pytest

import serve_harness as H
import serve_model

SHAPE = serve_model.SHAPES["tiny"]
LAYERS, VOCAB = SHAPE["num_hidden_layers"], SHAPE["vocab_size"]
# A paged cache of 64 blocks of 32 tokens; up to 256 tokens a step. Without
# these the cache is sized from the machine's free memory (gigabytes on a CPU).
CB_ARGS = ["--cb-block-size", "32", "--cb-num-blocks", "64", "--cb-max-batch-tokens", "256"]
REQUESTS, CONCURRENCY = 48, 8
PLAIN_REQUESTS, PLAIN_CONCURRENCY = 8, 4  # the plain path serves one request at a time: fewer
# The smallest gap between the two best logits of any greedy step of the
# reference must stand far above what float32 rounding can move them by in
# another batch (their spacing is about 1e-6 at these logits, near 10): else
# two correct servers could differ and the exact comparison would not hold.
MIN_MARGIN = 1e-4

SERVE_MODULES = ("transformers", "fastapi", "uvicorn", "openai", "tokenizers", "prometheus_client")
HOW = ("./run.sh serve-deps installs transformers' serving extras, from the wheels in build/wheelhouse when it "
       "holds them (./run.sh serve-wheels PYTHON_VERSION puts them there, where a registry is reachable)")


def missing_modules():
    missing = []
    for mod in SERVE_MODULES:
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    return missing


def need_serve_modules():
    """A missing module fails under CI (its set-up installs them all) and
    skips, naming each missing one, elsewhere."""
    missing = missing_modules()
    if not missing:
        return
    why = f"{', '.join(missing)} not installed: {HOW}"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    need_serve_modules()
    d = tmp_path_factory.mktemp("serve") / "model"
    serve_model.build(d, "tiny")
    return d


@pytest.fixture(scope="module")
def reqs():
    return H.requests_for(REQUESTS, seed=1, max_tokens=(8, 40), words=(2, 14), vocab_size=VOCAB)


@pytest.fixture(scope="module")
def reference(model_dir, reqs):
    ref = H.reference_generate(model_dir, reqs)
    assert min(r["min_margin"] for r in ref) > MIN_MARGIN
    return ref


def sanitized():
    return "libasan" in os.environ.get("LD_PRELOAD", "")


def run_pair(tmp_path, model_dir, reqs, *, concurrency, continuous_batching, device="cpu", cb_args=CB_ARGS,
             start_timeout=300):
    """The server without understudy, then with it, on the same traffic
    (reqs: one phase, or a list of (requests, client threads) phases)."""
    traffic = reqs if isinstance(reqs[0], tuple) else [(reqs, concurrency)]
    common = dict(continuous_batching=continuous_batching, device=device, cb_args=cb_args,
                  keep_sanitizer=sanitized(), start_timeout=start_timeout)
    base = H.serve_and_drive(tmp_path / "without", model_dir, traffic, name="without", **common)
    us = H.serve_and_drive(tmp_path / "with", model_dir, traffic, name="with",
                           config_for=lambda port: H.understudy_config(tmp_path / "with", port), **common)
    return base, us


def assert_servers_alike(base, us):
    """understudy came up in the one server and not in the other, said
    nothing, wrote one final report, and both servers ended alike."""
    assert not base["maps_library"] and base["report"] is None and base["config"] is None, base["log"]
    assert us["maps_library"], us["log"]
    assert us["report"] is not None, f"no final report from the server with understudy: {us['log']}"
    assert us["report_files"] == [f"report-{us['report']['pid']}.json"]
    assert "understudy:" not in us["log"], us["log"]  # no warning, no error from understudy
    assert H.check_responses(base["responses"]) == []
    assert H.check_responses(us["responses"]) == []
    # uvicorn shuts down on SIGTERM and raises it again (status -15); understudy wrote its final report on
    # the way without changing that.
    assert us["returncode"] == base["returncode"] == -15, (base["returncode"], us["returncode"], us["log"])


def answer(r):
    return r["content"], r["finish_reason"], r["completion_tokens"]


def assert_served_alike(base, us, reference):
    """Greedy answers: the server with understudy gives every request the
    answer the server without it gave, and both are what model.generate()
    gives each request alone."""
    assert_servers_alike(base, us)
    for i, (a, b, ref) in enumerate(zip(base["responses"], us["responses"], reference)):
        assert answer(b) == answer(a), f"request {i}"
        assert (a["content"], a["completion_tokens"]) == (ref["content"], ref["tokens"]), \
            f"request {i}: the server's answer is not model.generate()'s"


def summary(run, figures):
    rep = run["report"]
    return (f"{run['name']}: {figures['requests']} requests, {figures['tokens']} tokens, "
            f"{figures['forwards']} forwards in {run['wall_s']:.2f} s; calls {figures['calls']}; "
            f"silu shadow {figures['shadow']}; weights "
            + ", ".join(f"{k} {v:.3f}" for k, v in figures["weights"].items())
            + f"; {len(run['scrapes'])} scrapes; est. device time {rep['totals']['est_device_time_ns'] / 1e6:.1f} ms")


def checked(run, layers, vocab, continuous_batching=True):
    """A run's report against the model's structure and its metrics against
    the report: (the report's figures, the mid-traffic scrapes)."""
    figures, problems = H.check_report(run["report"], run["responses"], layers=layers, vocab_size=vocab,
                                       continuous_batching=continuous_batching)
    assert problems == [], problems
    mproblems, during = H.check_metrics(run)
    assert mproblems == [], mproblems
    return figures, during


def test_continuous_batching_under_understudy(tmp_path, model_dir, reqs, reference):
    """`transformers serve --continuous-batching` on the CPU, 48 chat
    completions (a third streamed) from 8 client threads, without and with
    understudy (observe GEMMs and attention, shadow SiLU with a torch-op
    candidate on every call, metrics on an endpoint of its own):
    - the same answers, request by request, and model.generate()'s;
    - the report counts the calls the model's structure makes for the steps
      the scheduler ran, and those steps hold the client's tokens (fewer
      steps than tokens: requests were batched);
    - every SiLU call was shadowed, and none failed; the operators' weights
      sum to 1 and each is the sum of its keys';
    - scrapes of the metrics while requests ran saw calls counted before
      the traffic ended, counters only grew, and the last scrape equals the
      final report."""
    base, us = run_pair(tmp_path, model_dir, reqs, concurrency=CONCURRENCY, continuous_batching=True)
    assert_served_alike(base, us, reference)
    assert "CB: True" in us["log"] and "CB: True" in base["log"]  # the server ran continuous batching
    figures, during = checked(us, LAYERS, VOCAB)
    print(summary(us, figures), f"; start {us['start_s']:.1f} s; without understudy {base['wall_s']:.2f} s; "
          f"mid-traffic scrapes saw {during}; smallest greedy gap {min(r['min_margin'] for r in reference):.3g}")


@pytest.mark.skipif(sanitized(), reason="run in the plain pass (the sanitized pass keeps to the servers with "
                    "continuous batching, for time)")
def test_plain_generate_under_understudy(tmp_path, model_dir, reqs, reference):
    """`transformers serve` without continuous batching (one
    model.generate() per request, in turn, on the server's inference
    thread), 8 chat completions from 4 client threads: the same answers
    with and without understudy, and the LM head called exactly once per
    token the client received."""
    reqs, reference = reqs[:PLAIN_REQUESTS], reference[:PLAIN_REQUESTS]
    base, us = run_pair(tmp_path, model_dir, reqs, concurrency=PLAIN_CONCURRENCY, continuous_batching=False)
    assert_served_alike(base, us, reference)
    assert "CB: False" in us["log"]
    figures, _ = checked(us, LAYERS, VOCAB, continuous_batching=False)
    assert figures["forwards"] == sum(r["completion_tokens"] for r in us["responses"])
    print(summary(us, figures), f"; without understudy {base['wall_s']:.2f} s")


# ---- `understudy run -- transformers serve` from a venv -------------------------------------

RUN_REQUESTS, RUN_CONCURRENCY = 12, 4


def venv_with_understudy(root):
    """A venv made with --system-site-packages (torch and transformers are the
    base interpreter's) that holds understudy, as a pip install into it
    would: the package on its path and the start-up hook in its
    site-packages. Its bin/ has no `transformers`: that console script stays
    the base interpreter's, whose site-packages hold no hook."""
    import subprocess
    import sys
    import sysconfig

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    site = H.pathlib.Path(site)
    assert site.is_relative_to(venv) and site != H.pathlib.Path(sysconfig.get_paths()["purelib"])
    (site / "00-understudy-package.pth").write_text(f"{H.SHIM}\n")  # before the hook's .pth is processed
    (site / "understudy-autoload.pth").write_text((H.SHIM / "understudy-autoload.pth").read_text())
    return venv


@pytest.mark.skipif(sanitized(), reason="run in the plain pass (the server's interpreter is started by a console "
                    "script, without the sanitizer's preload)")
def test_understudy_run_observes_transformers_serve_from_a_venv(tmp_path, model_dir, reqs, reference):
    """The README's set-up: understudy in a venv with the system's site
    packages, the server started as `understudy run --config CFG --
    transformers serve ...` from that venv, where `transformers` on PATH is
    the base interpreter's console script (its first line names the base
    interpreter, whose site-packages hold no start-up hook) and nothing on
    PYTHONPATH enables understudy. The server is observed all the same:
    the same answers as model.generate(), a final report that counts the
    calls the model's structure makes (SiLU shadowed by the torch-op
    candidate), metrics scraped while requests ran that end equal to the
    report, and run's one line at the end naming the report."""
    import shutil
    import sys

    script = H.pathlib.Path(sys.executable).parent / "transformers"
    if not script.exists():
        why = f"no `transformers` console script beside {sys.executable}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    venv = venv_with_understudy(tmp_path)
    assert not (venv / "bin" / "transformers").exists()

    def launch(cmd, env, config):
        assert cmd[:2] == [sys.executable, str(script)], cmd
        env = dict(env)
        # no folder of the harness's hook: the caller's own entries only
        env["PYTHONPATH"] = os.pathsep.join(env["PYTHONPATH"].split(os.pathsep)[1:])
        env["PATH"] = os.pathsep.join([str(venv / "bin"), str(script.parent), env["PATH"]])
        env["VIRTUAL_ENV"] = str(venv)
        assert shutil.which("transformers", path=env["PATH"]) == str(script)
        return [str(venv / "bin" / "python"), "-m", "understudy", "run", "--config", H.json.dumps(config), "--",
                "transformers", *cmd[2:]], env

    work = tmp_path / "with"
    us = H.serve_and_drive(work, model_dir, [(reqs[:RUN_REQUESTS], RUN_CONCURRENCY)], name="run",
                           config_for=lambda port: H.understudy_config(work, port), continuous_batching=True,
                           cb_args=CB_ARGS, launch=launch)
    assert us["report"] is not None, f"no report from the server under `understudy run`: {us['log']}"
    assert us["report_files"] == [f"report-{us['report']['pid']}.json"], us["report_files"]
    assert H.check_responses(us["responses"]) == []
    for i, (r, ref) in enumerate(zip(us["responses"], reference)):
        assert (r["content"], r["completion_tokens"]) == (ref["content"], ref["tokens"]), f"request {i}"
    figures, during = checked(us, LAYERS, VOCAB)
    name, calls = us["report_files"][0], us["report"]["totals"]["calls"]
    assert calls == sum(figures["calls"].values()), (calls, figures["calls"])
    said = [ln for ln in us["log"].splitlines() if ln.startswith("understudy:")]
    assert said == [f"understudy: run: report written to {name} ({calls} calls); read it with: "
                    f"understudy report {name}"], us["log"]
    assert us["returncode"] == -15, (us["returncode"], us["log"])
    print(summary(us, figures), f"; start {us['start_s']:.1f} s; mid-traffic scrapes saw {during}")


# ---- bfloat16, two phases of traffic: the CPU (tiny) and CUDA (Llama-3-8B's shape) -----------

# cpu: the tiny Llama in bfloat16, a cache of 512 blocks of 32 tokens, up to 512 tokens a step.
# cuda: Llama-3-8B's shape with two layers (random weights, the full 128256-word vocabulary), 2048 blocks
# of 32 tokens (256 MiB of cache for two layers), up to 2048 tokens a step, no CUDA graphs.
BF16 = {
    "cpu": dict(shape="tiny", batched=48, words=(4, 60), max_tokens=(16, 48), start_timeout=300,
                cb_args=["--cb-block-size", "32", "--cb-num-blocks", "512", "--cb-max-batch-tokens", "512"]),
    "cuda": dict(shape="llama-8b-2l", batched=64, words=(4, 200), max_tokens=(16, 64), start_timeout=900,
                 cb_args=["--cb-block-size", "32", "--cb-num-blocks", "2048", "--cb-max-batch-tokens", "2048",
                          "--no-cb-use-cuda-graph"]),
}
SEQUENTIAL, BATCHED_CONCURRENCY = 8, 16


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.skipif(sanitized(), reason="run in the plain pass (the sanitized pass keeps "
                                                 "to the float32 server with continuous batching, for time)")),
    pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bfloat16_batched_under_understudy(tmp_path, device):
    """`transformers serve --continuous-batching` with a bfloat16 model,
    without and with understudy, on two phases of traffic: 8 requests one
    after another, then 48 (CPU) or 64 (CUDA) from 16 client threads. On
    the CPU the tiny Llama; on a CUDA device (skipped without one)
    Llama-3-8B's shape with two layers, paged attention, CUDA graphs off.

    One request at a time, each step's batch is the same in both servers:
    the answers must be identical. Concurrent requests are batched as they
    arrive, differently in each run, and in bfloat16 a row's result depends
    on the batch it was computed in (the GEMM kernel picked for M, the
    attention over the packed batch): two answers may then part, but only
    at a near-tie, which one forward in this process on the tokens they
    share shows (serve_harness.partings: both tokens within 8 bfloat16
    steps of the top logit; partings measured on the CPU were 0 to 3 steps
    below). The report and the metrics are held to what the float32 test
    holds them to."""
    import torch

    if device == "cpu":
        need_serve_modules()
    elif missing_modules():
        pytest.skip(f"{', '.join(missing_modules())} not installed: {HOW}")
    cfg = BF16[device]
    model_dir = tmp_path / "model"
    serve_model.build(model_dir, cfg["shape"], "bfloat16", device=device)
    shape = serve_model.SHAPES[cfg["shape"]]
    vocab, layers = shape["vocab_size"], shape["num_hidden_layers"]
    seq = H.requests_for(SEQUENTIAL, seed=2, max_tokens=(16, 48), words=(4, 40), vocab_size=vocab)
    batched = H.requests_for(cfg["batched"], seed=3, max_tokens=cfg["max_tokens"], words=cfg["words"],
                             vocab_size=vocab)
    base, us = run_pair(tmp_path, model_dir, [(seq, 1), (batched, BATCHED_CONCURRENCY)], concurrency=None,
                        continuous_batching=True, device=device, cb_args=cfg["cb_args"],
                        start_timeout=cfg["start_timeout"])
    assert_servers_alike(base, us)
    assert "CB: True" in us["log"] and "CB: True" in base["log"]
    for i, (a, b) in enumerate(zip(base["phases"][0], us["phases"][0])):
        assert answer(b) == answer(a), f"request {i}, sent alone"
    apart = [(req, a, b) for req, a, b in zip(batched, base["phases"][1], us["phases"][1])
             if (a["content"], a["finish_reason"]) != (b["content"], b["finish_reason"])]
    if device == "cuda":
        torch.cuda.empty_cache()
    parts = H.partings(model_dir, apart, device=device)
    assert all(p["near_tie"] for p in parts), [p for p in parts if not p["near_tie"]]
    figures, during = checked(us, layers, vocab)
    print(summary(us, figures), f"; start {us['start_s']:.1f} s; without understudy {base['wall_s']:.2f} s; "
          f"{len(apart)} of {len(batched)} batched answers parted, at a near-tie "
          f"({[round(p['steps'], 1) for p in parts]} bfloat16 steps below the top); "
          f"{len(during)} mid-traffic scrapes")
