"""The series a process exposes at the defaults, counted: a Llama-shaped
Hugging Face model (random weights, 2 layers, CPU) observed with every
shipped operator, in prefill and decode, stays within the budget
docs/metrics.md gives; every series carries model_name and engine (the
config's, else the host's); keys get series of their own only where asked."""
from collections import Counter

import pytest
import torch

import understudy
from test_metrics import promtool_check, samples

BUDGET = 300  # docs/metrics.md, "Series budget"


def llama_traffic(us, metrics_section):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config.name_or_path = "tiny/llama-2l"  # what from_pretrained would have set
    us.enable({"metrics": metrics_section})  # every shipped operator observed (the defaults)
    ids = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        with understudy.phase("prefill"):
            out = model(ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        with understudy.phase("decode"):
            for _ in range(16):
                out = model(nxt, past_key_values=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return us.report()


def exposition():
    import prometheus_client as prom
    return prom.generate_latest(prom.REGISTRY).decode()


def test_a_llama_model_stays_within_the_series_budget(us, tmp_path, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    rep = llama_traffic(us, {"model_name": "tiny-llama"})
    text = exposition()
    promtool_check(text, tmp_path)
    smp = samples(text)
    ours = {k: v for k, v in smp.items() if k[0].startswith("understudy_")}
    observed = [o for o in rep["operators"] if o["shapes"]]
    phases = {s["phase"] for o in observed for s in o["shapes"]}
    assert len(observed) >= 3 and phases == {"prefill", "decode"}
    routes = sum(len(o["shapes"]) for o in observed)
    assert routes > len(observed) * len(phases)  # more keys than series groups: keys are folded
    assert len(ours) <= BUDGET, Counter(k[0] for k in ours).most_common(12)
    assert all(dict(lb).get("model_name") == "tiny-llama" and dict(lb).get("engine") == "transformers"
               for _, lb in ours)
    assert not any("key" in dict(lb) for _, lb in ours)
    # the folded series still add up to the report
    calls = {(dict(lb)["operator"], dict(lb)["phase"]): v for (n, lb), v in ours.items()
             if n == "understudy_calls_total"}
    want = Counter()
    for o in observed:
        for s in o["shapes"]:
            want[(o["name"], s["phase"])] += s["calls"]
    assert calls == want


def test_keys_get_series_only_where_asked(us, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    rep = llama_traffic(us, {"top_keys": 2, "engine": "my-engine"})
    smp = samples(exposition())
    keyed = {(dict(lb)["operator"], dict(lb)["key"]) for (n, lb), _ in smp.items() if n == "understudy_calls_total"}
    for o in rep["operators"]:
        if o["shapes"]:
            keys = {k for op, k in keyed if op == o["name"]}
            assert len(keys - {"other"}) == min(2, len(o["shapes"]))
            assert ("other" in keys) == (len(o["shapes"]) > 2)
    labels = {(dict(lb)["engine"], dict(lb).get("model_name")) for (n, lb), _ in smp.items()
              if n.startswith("understudy_")}
    assert labels == {("my-engine", "tiny/llama-2l")}  # the model's name, seen at its first forward


def test_the_model_a_vllm_or_sglang_command_line_serves():
    """Their own metrics' model_name: the served name first, else the model."""
    of = understudy.metrics._model_of_argv
    assert of("vllm", ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000"]) == "meta-llama/Llama-3.1-8B"
    assert of("vllm", ["vllm", "serve", "m", "--served-model-name", "prod-llama"]) == "prod-llama"
    assert of("vllm", ["api_server.py", "--model=/models/x"]) == "/models/x"
    assert of("sglang", ["-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2-7B"]) == "Qwen/Qwen2-7B"
    assert of("torch", ["train.py", "--model", "x"]) is None
