"""One rank of tests/python/test_ranks.py, started by torchrun.

It loads a tiny Llama saved with save_pretrained, tensor-parallel over the
ranks (tp_plan="auto": transformers starts the process group, gloo on the
CPU, NCCL on GPUs with the device from LOCAL_RANK), generates a few tokens
greedily and counts, with a TorchDispatchMode active from just after torch's
import to the end, every call that reaches the dispatcher below Python on
CPU or CUDA tensors: the ground truth the rank's report is held to.

Nothing here imports or calls understudy: where UNDERSTUDY_CONFIG is set, the
start-up hook enabled it when torch was imported. The worker only reads, if
the package is loaded, which metrics endpoint it serves (to tell ranks' ports
apart).

    ranks_worker.py MODEL_DIR OUT_DIR DEVICE NEW_TOKENS

writes OUT_DIR/rank{RANK}.json, then OUT_DIR/ready{RANK}, waits (up to 120 s)
for OUT_DIR/go (the test scrapes the metrics meanwhile) and exits, which
writes the final report.
"""
import json
import os
import pathlib
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64",
           torch.int64: "i64", torch.int32: "i32"}


def _pow2(n):
    return n if n <= 1 else 1 << (n - 1).bit_length()


def _first_tensor(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return a[0]
    return None


# Key dimensions of the collectives a TP forward runs, read here from the
# call's own arguments (problems/collectives.json says the same in its
# grammar): N the elements of the (first) input tensor, a power of two up;
# L the tensors of a list; W the group size.
def _collective_key(name, args):
    if name == "c10d::allreduce_":
        return f"N={_pow2(args[0][0].numel())},L={len(args[0])}"
    if name == "_c10d_functional::all_gather_into_tensor":
        return f"N={_pow2(args[0].numel())},W={args[1]}"
    if name in ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"):
        return f"N={_pow2(args[0].numel())}"
    return None


class CallCounter(TorchDispatchMode):
    """Counts ops called on plain CPU or CUDA tensors, as the dispatcher sends
    them below the Python key (where understudy's interceptors sit, at
    BackendSelect). Calls on tensor subclasses (DTensor, the fake tensors of
    DTensor's sharding propagation) run as they would and are not counted;
    neither are meta tensors. A composite op that reaches the mode is
    decomposed under it, so the leaves it calls are counted as the
    dispatcher would send them down."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()
        self.keys = Counter()  # the collectives' full shape keys

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types):
            return func(*args, **kwargs)
        with self:
            r = func.decompose(*args, **kwargs)
        if r is not NotImplemented:
            return r
        first = _first_tensor(list(args) + list(kwargs.values()))
        if first is not None and first.device.type in ("cpu", "cuda"):
            name = func._schema.name + ("" if func._overloadname == "default" else "." + func._overloadname)
            self.counts[name] += 1
            dims = _collective_key(name, args)
            if dims is not None:
                dtypes = ",".join(_DTYPES.get(t.dtype, str(t.dtype)) for t in tree_leaves(list(args))
                                  if isinstance(t, torch.Tensor))
                self.keys[f"{name}|{first.device.type}|{dtypes}|{dims}"] += 1
        return func(*args, **kwargs)


def main():
    model_dir, out_dir, device, new_tokens = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    counter = CallCounter()
    with counter:
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, tp_plan="auto", dtype=dtype)
        model.eval()
        dev = torch.device("cuda", local_rank) if device == "cuda" else torch.device("cpu")
        assert model.device == dev, (model.device, dev)
        ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]], device=dev)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize(dev)
        world = torch.distributed.get_world_size()
        torch.distributed.destroy_process_group()
    us = sys.modules.get("understudy")
    status = us.metrics.status() if us is not None and us.is_enabled() else None
    result = {"rank": rank, "local_rank": local_rank, "world": world, "pid": os.getpid(),
              "tokens": out[0].tolist(), "counts": dict(counter.counts), "keys": dict(counter.keys),
              "understudy": us is not None and us.is_enabled(), "metrics": status}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    (out_dir / f"ready{rank}").write_text("")
    deadline = time.monotonic() + 120
    while not (out_dir / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
