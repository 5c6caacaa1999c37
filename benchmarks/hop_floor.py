"""What a dispatcher hop costs a decode step before the hop does anything.

understudy's interceptor is a kernel at the BackendSelect key that hands each
call on below it (DESIGN.md, "The dispatcher seam"). This program measures
the floor of that design in the decode steps of e2e_overhead.py --paired:
a kernel of its own, compiled here (torch.utils.cpp_extension), serves
aten::mm and does nothing else, and steps with it registered are paired
with steps without it (plain torch), ABBA as e2e_overhead.py pairs them, one
untimed step after each switch. Variants of that kernel:

  redispatch   at BackendSelect, redispatching below it (understudy's seam,
               with none of understudy's code)
  backend      at the backend's key (CPU or CUDA) in place of torch's
               kernel, calling torch's backend function for mm directly (no
               second dispatch)
  chase:N      redispatch, after N dependent loads of distinct cache lines
               scattered over 1 MiB (what cold data lines cost a call)
  locked:N     redispatch, after N atomic read-modify-writes (seq_cst) and
               one more after it (what locked instructions cost a call)

Each row: the median step without the kernel, the median difference of
paired steps (with − without) and a 95 % interval of it (order statistics),
the ratio, the mm calls the kernel served per step, and the difference per
call. The extension compiles once (a minute) into torch's extensions cache.

    PYTHONPATH=python-shim python3 benchmarks/hop_floor.py [--device cpu|cuda] [--batch 1]
        [--rounds 21] [--variants redispatch backend chase:16 locked:4]

Without a GPU (or with --device cpu) the decoder runs on the CPU at small
widths, as e2e_overhead.py runs it there.
"""
import argparse
import statistics
import sys
import warnings

import torch

import _results
import e2e_overhead as e2e

SOURCE = r"""
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#ifdef HOP_CUDA
#include <ATen/ops/mm_cuda_dispatch.h>
#endif
#include <atomic>
#include <memory>

using MmSig = at::Tensor(const at::Tensor &, const at::Tensor &);
static std::unique_ptr<torch::Library> lib;
static c10::TypedOperatorHandle<MmSig> *mm_op;
static int64_t served, chain_len;
static void *chain[1 << 17]; // 1 MiB of pointers
static void **chain_head;
static std::atomic<int64_t> locked_word;

static c10::DispatchKeySet below(c10::DispatchKeySet ks) {
  return ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
}
static at::Tensor mm_redispatch(c10::DispatchKeySet ks, const at::Tensor &a, const at::Tensor &b) {
  served++;
  return mm_op->redispatch(below(ks), a, b);
}
static at::Tensor mm_chase(c10::DispatchKeySet ks, const at::Tensor &a, const at::Tensor &b) {
  served++;
  void **p = chain_head;
  for (int64_t i = 0; i < chain_len; i++)
    p = static_cast<void **>(*p);
  if (p == nullptr) // never (the N-th load finds a slot): keeps the loads
    served--;
  return mm_op->redispatch(below(ks), a, b);
}
static at::Tensor mm_locked(c10::DispatchKeySet ks, const at::Tensor &a, const at::Tensor &b) {
  served++;
  for (int64_t i = 0; i < chain_len; i++)
    locked_word.fetch_add(1, std::memory_order_seq_cst);
  at::Tensor r = mm_op->redispatch(below(ks), a, b);
  locked_word.fetch_sub(1, std::memory_order_seq_cst);
  return r;
}
#ifdef HOP_CUDA
#define BACKEND_KEY CUDA
static at::Tensor mm_backend(const at::Tensor &a, const at::Tensor &b) { served++; return at::cuda::mm(a, b); }
#else
#define BACKEND_KEY CPU
static at::Tensor mm_backend(const at::Tensor &a, const at::Tensor &b) { served++; return at::cpu::mm(a, b); }
#endif

// kind: 1 redispatch, 2 backend, 3 chase, 4 locked; n: the chain's loads or the locked ops
void hop_on(int64_t kind, int64_t n) {
  if (mm_op == nullptr)
    mm_op = new c10::TypedOperatorHandle<MmSig>(
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "").typed<MmSig>());
  chain_len = n;
  void **prev = nullptr; // line (k * 4099) mod 16384 of the 16384 lines: distinct, scattered
  for (int64_t k = n; k >= 0; k--) {
    void **slot = &chain[((k * 4099) % 16384) * 8];
    *slot = prev;
    prev = slot;
  }
  chain_head = prev;
  const bool backend = kind == 2;
  lib.reset(new torch::Library(torch::Library::IMPL, "aten",
                               backend ? c10::DispatchKey::BACKEND_KEY : c10::DispatchKey::BackendSelect,
                               __FILE__, __LINE__));
  if (backend)
    lib->impl("mm", TORCH_FN(mm_backend));
  else if (kind == 3)
    lib->impl("mm", TORCH_FN(mm_chase));
  else if (kind == 4)
    lib->impl("mm", TORCH_FN(mm_locked));
  else
    lib->impl("mm", TORCH_FN(mm_redispatch));
}
void hop_off() { lib.reset(); }
int64_t hop_served() { return served; }
"""

KINDS = {"redispatch": 1, "backend": 2, "chase": 3, "locked": 4}


def compile_extension(device):
    from torch.utils.cpp_extension import load_inline
    cuda = device == "cuda"
    return load_inline(f"understudy_hop_floor_{device}", cpp_sources=SOURCE,
                       functions=["hop_on", "hop_off", "hop_served"],
                       extra_cflags=["-O2"] + (["-DHOP_CUDA"] if cuda else []),
                       extra_ldflags=["-ltorch_cuda"] if cuda else [], verbose=False)


def paired(ext, model, ids, kind, n, rounds, tokens):
    """Neighbouring steps with the kernel and without it (e2e_overhead's
    pairing): the median step without it, the differences, and the mm
    calls the kernel served per step with it."""
    on = [False]

    def switch(mode):
        if on[0]:
            ext.hop_off()
            on[0] = False
        if mode == "hop":
            ext.hop_on(kind, n)
            on[0] = True
        return True

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that a kernel is overridden
        base, diffs, served = e2e.paired_rounds(model, ids, ("hop", "plain"), rounds, tokens, switch,
                                                ext.hop_served, lambda m: m == "hop")
    switch("plain")
    return statistics.median(base), diffs, statistics.median(served)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--model", choices=["mistral", "qwen-moe"], default="mistral")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["redispatch", "backend", "chase:16", "locked:4"])
    args = ap.parse_args()
    variants = []
    for v in args.variants:
        name, _, n = v.partition(":")
        if name not in KINDS or (n and not n.isdigit()) or (name in ("chase", "locked")) != bool(n):
            sys.exit(f"hop_floor.py: variant {v!r}: one of redispatch, backend, chase:N, locked:N")
        variants.append((v, KINDS[name], int(n or 0)))
    e2e.use_device(args.device, "hop_floor.py")
    ext = compile_extension(e2e.DEVICE)
    model = e2e.build(args.model, args.layers)
    ids = e2e.prompt(args.batch)
    print(f"torch {torch.__version__}; {e2e.device_name()}; {args.model}, batch {args.batch}, {args.layers} layers; "
          f"{args.rounds} runs of {args.tokens} decode steps after a warm-up run; neighbouring steps paired, "
          f"with a kernel serving aten::mm and without")
    print(f"{'variant':<12} {'step, plain':>12} {'pairs':>6} {'with - without':>15} {'95 % interval':>20} "
          f"{'ratio':>7} {'mm/step':>8} {'per call':>10}")
    rows = []
    for label, kind, n in variants:
        base, diffs, served = paired(ext, model, ids, kind, n, args.rounds, args.tokens)
        med, lo, hi = e2e.median_interval(diffs)
        per_call = med / served if served else float("nan")
        print(f"{label:<12} {base * 1e3:>10.3f}ms {len(diffs):>6} {med * 1e6:>12.2f} us "
              f"{lo * 1e6:>8.2f} .. {hi * 1e6:>6.2f} us {1 + med / base:>7.4f} {served:>8.1f} "
              f"{per_call * 1e6:>7.2f} us", flush=True)
        rows.append((label, round(base * 1e3, 3), len(diffs), round(med * 1e6, 2), round(lo * 1e6, 2),
                     round(hi * 1e6, 2), round(1 + med / base, 4), round(served, 1), round(per_call * 1e6, 2)))
    _results.write("hop_floor", [_results.table(
        f"a kernel of its own serving aten::mm − plain torch, {args.model} batch {args.batch}, {args.layers} layers; "
        f"{args.rounds} runs of {args.tokens} decode steps, neighbouring steps paired",
        ["variant", "step (plain), ms", "pairs", "with − without, µs", "95 % interval from", "to", "ratio",
         "mm/step", "per call, µs"], rows,
        [None, ".3f", None, "+.2f", ".2f", ".2f", ".4f", ".1f", "+.2f"])], args=args, device=e2e.DEVICE)


if __name__ == "__main__":
    main()
