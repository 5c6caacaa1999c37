"""Prefill and decode read from Hugging Face transformers, with no host change:
generate() (its _prefill, then its decoding loop) and continuous batching
(each batch's query lengths, on the generation thread), on a real tiny
Llama-shaped model with random weights, on the CPU.

Ground truth: a forward pre-hook on the model reads each forward's own
inputs: for generate(), the query length (input_ids' second dimension: a
prompt, or one token); for continuous batching, the batch's query lengths
(the differences of cu_seq_lens_q, a host tensor on the CPU). Every forward
runs the same matrix products, so the calls a phase's keys count must be
that many per forward times the forwards the hook saw in that phase."""
import threading
from collections import Counter

import pytest
import torch

from conftest import need

try:
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
except ImportError:  # pragma: no cover - run.sh test installs transformers
    transformers = None


def tiny_llama():
    need(transformers is not None and int(transformers.__version__.split(".")[0]) >= 5,
         "transformers 5 is not installed: ./run.sh test installs it")
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def forwards_by_phase(model, phase_of):
    """A pre-hook counting the model's forwards by the phase its inputs say
    (phase_of(kwargs)); returns (the Counter, the hook's handle)."""
    seen = Counter()

    def hook(module, args, kwargs):
        seen[phase_of(kwargs)] += 1

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


def mm_calls_by_phase(rep):
    out = Counter()
    for o in rep["operators"]:
        for s in o["shapes"]:
            if s["op"] in ("aten::mm", "aten::addmm"):
                out[s.get("phase", "unknown")] += int(s["calls"])
    return out


def per_forward(calls, forwards):
    """The products one forward runs: the same in every forward."""
    total_f = sum(forwards.values())
    total_c = sum(calls.values())
    assert total_f > 0 and total_c % total_f == 0, (calls, forwards)
    return total_c // total_f


def test_generate_runs_its_prefill_as_prefill_and_its_loop_as_decode(us):
    model = tiny_llama()
    gc = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    seen, handle = forwards_by_phase(model, lambda kw: "prefill" if kw["input_ids"].shape[1] > 1 else "decode")
    us.enable({"operators": {"gemm": {"sample": 1.0}}})
    try:
        with torch.inference_mode():
            model.generate(ids, generation_config=gc)
        assert us.set_phase("unknown") == "unknown"  # the thread's phase put back
        rep = us.report()
    finally:
        handle.remove()
        us.disable()
    assert seen == {"prefill": 1, "decode": 3}
    calls = mm_calls_by_phase(rep)
    k = per_forward(calls, seen)
    assert calls == {p: k * n for p, n in seen.items()}

    # a phase the host set itself is left as it is
    us.enable({"operators": {"gemm": {"sample": 1.0}}})
    try:
        with us.phase("decode"), torch.inference_mode():
            model.generate(ids, generation_config=gc)
        rep = us.report()
    finally:
        us.disable()
    assert mm_calls_by_phase(rep) == {"decode": k * 4}


def test_continuous_batching_phase_follows_the_batch_query_lengths(us):
    """generate_batch runs its batches on a generation thread of its own:
    the two prompts' batch is prefill, the batches of one new token per
    request decode, whatever thread the host calls from."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = tiny_llama()
    gc = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=16, num_blocks=16, max_batch_tokens=64, max_requests_per_batch=4)
    threads = set()

    def phase_of(kw):
        threads.add(threading.get_ident())
        cu = kw["cu_seq_lens_q"]
        lengths = (cu[1:] - cu[:-1]).tolist()
        return "decode" if max(lengths) == 1 else "prefill"

    seen, handle = forwards_by_phase(model, phase_of)
    us.enable({"operators": {"gemm": {"sample": 1.0}}})
    try:
        out = model.generate_batch(inputs=[[1, 2, 3, 4, 5], [6, 7, 8]], generation_config=gc,
                                   continuous_batching_config=cb, warmup=False)
        rep = us.report()
    finally:
        handle.remove()
        us.disable()
    assert sorted(len(r.generated_tokens) for r in out.values()) == [4, 4]
    assert threads and threading.get_ident() not in threads  # the forwards ran on the generation thread
    assert seen["prefill"] >= 1 and seen["decode"] >= 1 and set(seen) == {"prefill", "decode"}
    calls = mm_calls_by_phase(rep)
    assert "unknown" not in calls
    k = per_forward(calls, seen)
    assert calls == {p: k * n for p, n in seen.items()}


def test_a_batch_is_decode_only_when_every_query_is_one_token():
    from understudy.hf_phases import batch_phase

    class R:
        def __init__(self, n):
            self.query_length = n

    assert batch_phase([R(1), R(1)]) == "decode"
    assert batch_phase([R(1), R(17)]) == "prefill"  # a mixed batch runs a prefill's shapes
    assert batch_phase([R(5)]) == "prefill"
    assert batch_phase([]) is None and batch_phase([object()]) is None
