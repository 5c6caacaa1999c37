"""Tensor-parallel ranks under understudy, activated through the environment
alone: torchrun starts 2 ranks of tests/python/ranks_worker.py, each loading
a tiny random-weight Llama with tp_plan="auto" and generating greedily.
UNDERSTUDY_CONFIG (inline JSON, with {rank} in the report path and a metrics
port) reaches the ranks through the start-up hook (python-shim's
understudy-autoload.pth, processed by a sitecustomize as site-packages
processes it after a pip install); the worker never calls understudy.

Ground truth, per rank: the calls a TorchDispatchMode in the worker counted
(every op on plain CPU/CUDA tensors below Python, the model's load
included), the collectives' shape keys it read from their arguments, the
tokens generated, and the same script run without UNDERSTUDY_CONFIG.

CPU with gloo runs everywhere; CUDA with NCCL needs 2 GPUs (one rank each,
the device from LOCAL_RANK) and skips otherwise."""
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch

from conftest import ROOT, bound_ops, free_port, load_report, need

WORKER = pathlib.Path(__file__).with_name("ranks_worker.py")
SHIM = ROOT / "python-shim"
LAYERS, NEW_TOKENS, RANKS = 2, 4, 2

# Variables of this test process that would change what torchrun and its ranks do.
_CLEARED = ("UNDERSTUDY_CONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_LOCALID",
            "PYTHONPATH")


def definitions():
    """{operator: set of the ops it binds, overloads spelled as the report spells them}."""
    out = {}
    for f in sorted((ROOT / "problems").glob("*.json")):
        d = json.loads(f.read_text())
        out[d["operator"]] = {b["op"] + ("." + ov if ov else "") for b in d["bindings"]
                              for ov in b.get("overloads", [""])}
    return out


DEFS = definitions()
BOUND = {op: name for name, ops in DEFS.items() for op in ops}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    need(importlib.util.find_spec("transformers") is not None,
         "transformers is not installed (./run.sh test's set-up installs it)")
    from transformers import LlamaConfig, LlamaForCausalLM

    # heads, key-value heads, MLP width and vocabulary divide by the 2 ranks
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def rank_env(work, config=None):
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    for k in ("UNDERSTUDY_LIB", "UNDERSTUDY_PROBLEMS", "UNDERSTUDY_CANDIDATES"):
        if k in env:
            env[k] = os.path.abspath(env[k])  # the ranks run in work, not here
    site_dir = work / "site"
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(SHIM)!r})\n")
    env.update(PYTHONPATH=str(site_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=str(work / "hf-home"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if config is not None:
        env["UNDERSTUDY_CONFIG"] = json.dumps(config)
    return env


class Ranks:
    """torchrun --standalone with RANKS ranks of the worker, writing into out."""

    def __init__(self, model, out, device, env):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "torchrun.log", "w")
        if device == "cpu":
            # gloo ranks on the CPU: transformers' tensor parallelism takes the
            # accelerator when it sees one (rank 1 asked for cuda:1 on a one-GPU host)
            env = dict(env, CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
             str(WORKER), str(model), str(out), device, str(NEW_TOKENS)],
            env=env, cwd=out, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        if not self.log.closed:
            self.log.flush()
        return (self.out / "torchrun.log").read_text()[-6000:]

    def wait_ready(self, timeout=300):
        deadline = time.monotonic() + timeout
        while not all((self.out / f"ready{r}").exists() for r in range(RANKS)):
            assert self.proc.poll() is None, f"torchrun ended ({self.proc.returncode}):\n{self.output()}"
            assert time.monotonic() < deadline, f"ranks not ready after {timeout} s:\n{self.output()}"
            time.sleep(0.1)

    def finish(self, timeout=120):
        (self.out / "go").write_text("")
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.log.close()
        assert rc == 0, f"torchrun exited {rc}:\n{self.output()}"
        return [json.loads((self.out / f"rank{r}.json").read_text()) for r in range(RANKS)]


def per_operator(counts):
    out = Counter()
    for op, n in counts.items():
        if op in BOUND:
            out[BOUND[op]] += n
    return out


def shape_calls(rep, operator=None, by_phase=True):
    """Calls per shape key; by_phase False: each key's phases (generate's
    prefill and decode, a route each) added together under the key alone."""
    out = Counter()
    for o in rep["operators"]:
        if operator in (None, o["name"]):
            for s in o["shapes"]:
                key, phase = s["key"], s.get("phase")
                if not by_phase and phase and key.endswith("|" + phase):
                    key = key[:-len(phase) - 1]
                out[key] += s["calls"]
    return out


def scrape(url):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        text = r.read().decode()
    out = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("operator"))] += s.value
    return out


DEVICES = [
    pytest.param("cpu", id="cpu-gloo"),
    pytest.param("cuda", id="cuda-nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(
        torch.cuda.device_count() < RANKS, reason=f"needs {RANKS} CUDA GPUs (one a rank, NCCL)")]),
]


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_parallel_ranks(tmp_path, tiny_llama, device):
    """Each rank's report counts exactly the calls its own TorchDispatchMode
    counted, op by op (the collectives the rank ran among them, as an
    operator with calls and device time: a weight, and S null since no
    profile gives the interconnect's floor), and the collectives' shape keys
    read from their arguments (c10d::allreduce_'s only tensor argument is a
    Tensor[]); `understudy merge` of the two reports adds their calls exactly,
    per op and per shape key; each rank served its metrics on the config's
    port plus its local rank, with its own counts, while it ran; and the
    tokens are the same on both ranks and without understudy."""
    need(importlib.util.find_spec("prometheus_client") is not None,
         "prometheus_client is not installed (./run.sh test's set-up installs it)")
    t0 = time.monotonic()
    plain = Ranks(tiny_llama, tmp_path / "plain", device, rank_env(tmp_path / "plain"))
    (plain.out / "go").write_text("")
    baseline = plain.finish(timeout=300)
    t_plain = time.monotonic() - t0

    port = free_port(pair=True)
    config = {"defaults": {"sample": 1.0}, "metrics": {"port": port},
              "report": {"path": str(tmp_path / "us" / "report-{rank}.json"), "interval_s": 0}}
    t0 = time.monotonic()
    ranks = Ranks(tiny_llama, tmp_path / "us", device, rank_env(tmp_path / "us", config))
    try:
        ranks.wait_ready()
        for r in range(RANKS):
            enabled = json.loads((ranks.out / f"rank{r}.json").read_text())["understudy"]
            assert enabled, f"understudy is not enabled in rank {r}:\n{ranks.output()}"
        scraped = {r: scrape(f"http://127.0.0.1:{port + r}/metrics") for r in range(RANKS)}
    finally:
        results = ranks.finish()
    t_us = time.monotonic() - t0

    # the same generation everywhere
    tokens = baseline[0]["tokens"]
    assert len(tokens) == 8 + NEW_TOKENS
    assert [b["tokens"] for b in baseline] == [tokens] * RANKS
    assert [r["tokens"] for r in results] == [tokens] * RANKS
    assert not any(b["understudy"] for b in baseline) and all(r["understudy"] for r in results)
    assert all(r["world"] == RANKS for r in results)

    # one report per rank, named by its rank (torchrun's own agent process,
    # which has no rank, is not enabled and writes none)
    written = sorted(p.name for p in (tmp_path / "us").glob("report-*.json"))
    assert written == [f"report-{r}.json" for r in range(RANKS)]
    reports = [load_report(tmp_path / "us" / f"report-{r}.json") for r in range(RANKS)]

    for res, rep in zip(results, reports):
        r = res["rank"]
        truth = Counter({op: n for op, n in res["counts"].items() if op in BOUND})
        # the ground truth saw the TP forward's collectives: an all-reduce
        # after each row-parallel layer (o_proj, down_proj), the LM head's
        # gather, each forward (one a token)
        assert truth["c10d::allreduce_"] == 2 * LAYERS * NEW_TOKENS, res["counts"]
        assert truth["_c10d_functional::all_gather_into_tensor"] == NEW_TOKENS, res["counts"]
        assert truth["_c10d_functional::wait_tensor"] == NEW_TOKENS, res["counts"]
        assert bound_ops(rep) == truth, f"rank {r}"
        assert shape_calls(rep, "collectives", by_phase=False) == Counter(res["keys"]), f"rank {r}"
        # generate's phases, read from HF: the first forward prefill, each later one decode
        phases = Counter()
        for s in {o["name"]: o for o in rep["operators"]}["collectives"]["shapes"]:
            phases[s["phase"]] += s["calls"]
        assert phases["prefill"] * (NEW_TOKENS - 1) == phases["decode"] and set(phases) == {"prefill", "decode"}, phases
        coll = {o["name"]: o for o in rep["operators"]}["collectives"]
        assert sum(s["calls"] for s in coll["shapes"]) == per_operator(truth)["collectives"] > 0
        assert coll["weight"] > 0 and coll["roofline"]["S"] is None, coll
        assert set(coll["unscorable"]) == DEFS["collectives"]
        # sample 1.0: every call timed, or counted as dropped when no timer was free
        assert all(s["timed"] + s["timing_dropped"] == s["calls"] for s in coll["shapes"]), coll["shapes"]
        assert sum(s["timed"] for s in coll["shapes"]) > 0

        # metrics on the config's port plus the local rank, counting what this rank ran
        assert res["metrics"]["url"] == f"http://127.0.0.1:{port + res['local_rank']}/metrics", res["metrics"]
        got = scraped[res["local_rank"]]
        for name, n in per_operator(truth).items():
            assert got[("understudy_calls_total", name)] == n, (r, name)
        assert 0 < got[("understudy_operator_device_time_ratio", "collectives")] <= 1

    # merge: calls add exactly, per op and per shape key
    merged_path = tmp_path / "merged.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(SHIM)
    p = subprocess.run([sys.executable, "-m", "understudy", "merge", str(merged_path),
                        *(str(tmp_path / "us" / f"report-{r}.json") for r in range(RANKS))],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    merged = load_report(merged_path)
    assert merged["merged_from"] == RANKS
    assert bound_ops(merged) == sum((Counter({op: n for op, n in res["counts"].items() if op in BOUND})
                                     for res in results), Counter())
    assert shape_calls(merged) == sum((shape_calls(rep) for rep in reports), Counter())
    assert merged["totals"]["calls"] == sum(rep["totals"]["calls"] for rep in reports)
    mcoll = {o["name"]: o for o in merged["operators"]}["collectives"]
    assert mcoll["weight"] > 0 and mcoll["roofline"]["S"] is None

    ops = [{o["name"]: o for o in rep["operators"]} for rep in reports]
    print(f"\n{device}: calls per rank {[rep['totals']['calls'] for rep in reports]}, collectives "
          f"{[sum(s['calls'] for s in o['collectives']['shapes']) for o in ops]}, their share of device time "
          f"{[round(o['collectives']['weight'], 3) for o in ops]} (merged {mcoll['weight']:.3f}); "
          f"torchrun {t_plain:.1f} s plain, {t_us:.1f} s under understudy")
