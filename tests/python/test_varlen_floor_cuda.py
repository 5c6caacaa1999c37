"""A varlen attention call whose lengths are on the GPU, as vLLM's are: its
floor is each sequence's, read from the lengths copied to the host in
stream order before the timed work, not the bound that takes every
sequence as long as the longest. Ground truth: the floor computed here from
the batch's lengths with the definition's W and Q written out by hand, and
the H200 profile's peaks. Skipped only where torch sees no CUDA device."""
import json

import pytest
import torch

from conftest import ROOT
from test_shadow import routes

pytestmark = pytest.mark.gpu  # needs a CUDA device (conftest.py skips it without one)

H200 = json.loads((ROOT / "problems" / "hardware" / "H200.json").read_text())
SCHEMAS = json.loads((ROOT / "tests" / "data" / "serving-schemas.json").read_text())["schemas"]
FA2 = "_vllm_fa2_C::varlen_fwd"
Hq, Hk, D, BS = 32, 8, 128, 16
_libs = []


def _varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
                max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
                window_size_right, softcap, return_softmax, gen):
    out.zero_()  # work on the stream for the pair to time
    return [out]


WRAPPER = "vllm::unified_attention_with_output"
_metadata = {}  # the forward context the wrapper reads, as vLLM's


def fa2(m, query, output):
    """One FA2 call over the paged cache and lengths of metadata m, causal."""
    torch.ops._vllm_fa2_C.varlen_fwd(query, m["cache"], m["cache"], output, m["cu_q"], m["cu_k"], m["used"], None,
                                     m["table"], None, 1, m["max_k"], 0.0, 0.125, False, True, -1, -1, 0.0, False,
                                     None)


def _unified_attention_with_output(query, key, value, output, layer_name, output_scale=None,
                                   output_block_scale=None, kv_cache_dummy_dep=None):
    fa2(_metadata, query, output)


def define(qualname, fn):
    """A serving op with its schema, served here by a stand-in on CUDA."""
    ns, name = qualname.split("::")
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        torch._C._get_schema(qualname, "")
    except RuntimeError:
        lib.define(SCHEMAS[qualname].split("::", 1)[1])
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"):
        lib.impl(name, fn, "CUDA")
    _libs.append(lib)


def define_fa2():
    define(FA2, _varlen_fwd)


def floor_ns(seqs):
    """The exact floor of one FA2 call over a paged cache, causal, bf16:
    each sequence's query-key pairs (bottom-right), keys and values, the
    block-table entries it uses, the offsets and lengths read."""
    n = len(seqs)
    T = sum(q for q, _ in seqs)
    pairs = sum(q * k - q * (q - 1) // 2 for q, k in seqs)
    w = 2 * Hq * (D + D) * pairs
    read = (T * Hq * D * 2 + sum(k for _, k in seqs) * Hk * (D + D) * 2 + 4 * (n + 1) + 4 * n
            + 4 * sum(-(-k // BS) for _, k in seqs))
    written = T * Hq * D * 2
    return max(w / H200["p_peak"]["bf16"], (read + written) / H200["b_peak"]) * 1e9


def bound_ns(seqs):
    """What the floor was with the lengths unread: every query sees the
    longest sequence's keys, and each sequence holds that many."""
    n, T, mk = len(seqs), sum(q for q, _ in seqs), max(k for _, k in seqs)
    return floor_ns([(T / n, mk)] * n)


# two decode batches of one key (8 sequences, 1 new token each, the longest
# 4096 keys), their lengths swapped in place on the GPU between calls, as a
# serving engine's metadata is
BATCH_A = [(1, k) for k in (37, 4096, 900, 300, 17, 1, 2048, 64)]
BATCH_B = [(1, k) for k in (4096, 5, 5, 5, 5, 5, 5, 5)]
MAX_K = 4096


def metadata():
    n, T = len(BATCH_A), len(BATCH_A)
    width = -(-MAX_K // BS)
    dev, bf = "cuda", torch.bfloat16
    m = {"q": torch.randn(T, Hq, D, dtype=bf, device=dev),
         "cache": torch.empty(n * width, BS, Hk, D, dtype=bf, device=dev),
         "table": torch.arange(n * width, dtype=torch.int32, device=dev).reshape(n, width),
         "cu_q": torch.arange(n + 1, dtype=torch.int32, device=dev),
         "used": torch.empty(n, dtype=torch.int32, device=dev),
         "cu_k": torch.zeros(n + 1, dtype=torch.int32, device=dev),
         "max_k": MAX_K}
    m["out"] = torch.empty_like(m["q"])
    lens = [torch.tensor([k for _, k in s], dtype=torch.int32, device=dev) for s in (BATCH_A, BATCH_B)]

    def batch(i):
        """The i-th call's lengths, written on the stream before it."""
        m["used"].copy_(lens[i % 2])
        m["cu_k"][1:] = torch.cumsum(m["used"], 0, dtype=torch.int32)
    return m, batch


def observed(us, calls, call):
    us.enable({"operators": {"unified_attention": {"mode": "observe", "sample": 1.0}},
               "hardware": {"profile": "H200"}})
    call(calls)
    torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    return rep


def test_a_varlen_call_with_its_lengths_on_the_gpu_is_floored_by_each_sequence(us):
    define_fa2()
    m, batch = metadata()

    def call(calls):
        for i in range(calls):
            batch(i)
            fa2(m, m["q"], m["out"])
    rep = observed(us, 20, call)
    (r,) = routes(rep, FA2)
    assert r["calls"] == 20 and r["roofline"]["calls"] == 20, r
    want = (floor_ns(BATCH_A) + floor_ns(BATCH_B)) / 2
    print(f"FA2 on {torch.cuda.get_device_name()}: floor {r['roofline']['tsol_ns_mean']:.1f} ns a call, by hand "
          f"{want:.1f}, the bound {(bound_ns(BATCH_A) + bound_ns(BATCH_B)) / 2:.1f}")
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, rel=1e-6), (r["roofline"], want)
    # the bound would have read several times higher: the case tells them apart
    assert (bound_ns(BATCH_A) + bound_ns(BATCH_B)) / 2 > 3 * want


def test_vllms_attention_wrapper_is_floored_by_each_sequence_of_the_kernel_it_calls(us):
    """unified_attention_with_output carries only the new tokens; the FA2
    call inside it floors it, its lengths copied after the wrapper's timed
    span."""
    define_fa2()
    define(WRAPPER, _unified_attention_with_output)
    m, batch = metadata()
    _metadata.update(m)

    def call(calls):
        for i in range(calls):
            batch(i)
            torch.ops.vllm.unified_attention_with_output(m["q"], m["q"], m["q"], m["out"], "layers.0.attn")
    rep = observed(us, 20, call)
    (r,) = routes(rep, WRAPPER)
    assert routes(rep, FA2) == []  # inside the wrapper: part of its call
    assert r["calls"] == 20 and r["roofline"]["calls"] == 20 and r["roofline"]["scored_by_callees"] == 20, r
    want = (floor_ns(BATCH_A) + floor_ns(BATCH_B)) / 2
    print(f"attention wrapper on {torch.cuda.get_device_name()}: floor {r['roofline']['tsol_ns_mean']:.1f} ns a call, "
          f"by hand {want:.1f}")
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, rel=1e-6), (r["roofline"], want)


def test_a_shadowed_varlen_call_is_floored_by_each_sequence_on_both_arms(us):
    """The same batches with a candidate shadowing FA2 (the same stand-in, a
    torch op): production's and the candidate's times of each shadowed call
    are floored by the lengths copied before its comparison."""
    import understudy
    define_fa2()
    m, batch = metadata()
    name = understudy.register_candidate("ust_varlen_test::fa2_stand_in", _varlen_fwd, like=FA2)
    us.enable({"operators": {"unified_attention": {"mode": "shadow", "sample": 1.0,
                                                   "candidate": {"torch_op": name, "target": FA2}}},
               "hardware": {"profile": "H200"}})
    calls = 20
    for i in range(calls):
        batch(i)
        fa2(m, m["q"], m["out"])
    torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    (r,) = routes(rep, FA2)
    assert r["shadow"]["passed"] == calls and r["roofline"]["calls"] == calls, (r["shadow"], r["roofline"])
    want = (floor_ns(BATCH_A) + floor_ns(BATCH_B)) / 2
    print(f"FA2 shadowed on {torch.cuda.get_device_name()}: floor {r['roofline']['tsol_ns_mean']:.1f} ns a call, "
          f"by hand {want:.1f}")
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, rel=1e-6), (r["roofline"], want)


@pytest.mark.parametrize("through", ["direct", "wrapper"])
def test_a_varlen_call_timed_by_its_kernels_is_floored_by_each_sequence(us, through):
    """With the kernel tracer as the timer, calls in its window are timed by
    their kernels: their lengths are copied behind the call's last kernel and
    read at the window's conclusion; the key's first calls, before the
    window, by events. Every call takes the exact floor either way, called
    directly or inside vLLM's attention wrapper."""
    import time
    define_fa2()
    m, batch = metadata()
    if through == "wrapper":
        define(WRAPPER, _unified_attention_with_output)
        _metadata.update(m)

    def call(i):
        batch(i)
        if through == "wrapper":
            torch.ops.vllm.unified_attention_with_output(m["q"], m["q"], m["q"], m["out"], "layers.0.attn")
            return
        fa2(m, m["q"], m["out"])
    us.enable({"operators": {"unified_attention": {"mode": "observe", "sample": 1.0}},
               "hardware": {"profile": "H200"}, "report": {"interval_s": 0},
               "timer": {"kind": "cupti", "budget": 0, "window_ms": 5000}})
    calls = 40
    for i in range(4):
        call(i)
    torch.cuda.synchronize()
    time.sleep(0.3)  # the window opens within the worker's poll once a GPU call was seen
    for i in range(4, calls):
        call(i)
    torch.cuda.synchronize()
    rep = us.report()
    us.disable()
    (r,) = routes(rep, WRAPPER if through == "wrapper" else FA2)
    # the calls before the window opens are timed by events, the key's first
    # ones at least; each timed call is floored, and most by their kernels
    assert rep["timer"]["kind"] == "cupti" and r["kernel_timed"] >= 30, (rep["timer"], r)
    n = r["roofline"]["calls"]
    assert r["calls"] == calls and n == r["timed"] >= 34, r
    # the calls alternate the batches: of n timed, n_a of batch A, as near n / 2 as one untimed call leaves it
    fa, fb = floor_ns(BATCH_A), floor_ns(BATCH_B)
    total = r["roofline"]["tsol_ns_mean"] * n
    n_a = round((total - n * fb) / (fa - fb))
    want = (n_a * fa + (n - n_a) * fb) / n
    print(f"FA2 ({through}) timed by its kernels on {torch.cuda.get_device_name()}: {r['kernel_timed']} of {calls} "
          f"in a window, {n} floored ({n_a} of batch A), floor {r['roofline']['tsol_ns_mean']:.3f} ns a call, "
          f"by hand {want:.3f}")
    assert abs(n_a - n / 2) <= 1, (n_a, n)
    assert r["roofline"]["tsol_ns_mean"] == pytest.approx(want, rel=1e-6), (r["roofline"], want)
