"""A candidate that falls back to torch for part of its work is labelled:
the ops it calls inside its own runs are counted (a thread-local
RecordFunction callback around each sampled run) and the bound ops among
them give the share of its work done outside it. Ground truth: the same
candidate run under a TorchDispatchMode that records the ops its code
dispatches, and the share of rows it hands to torch.mm."""
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import understudy
from conftest import candidate_dir, series_labels


class TopLevelOps(TorchDispatchMode):
    """The ops the code inside it dispatches, by name without overload
    (an op's own callees run with the mode off: not counted)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def half_in_torch(a, b):
    """a @ b: the first half of the rows in numpy (its own work), the rest
    handed to torch.mm (a fallback)."""
    h = a.shape[0] // 2
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    o = np.from_dlpack(out)
    o[:h] = np.from_dlpack(a)[:h] @ np.from_dlpack(b)
    torch.mm(a[h:], b, out=out[h:])
    return out


_name = understudy.register_candidate("ust_fallback_test::mm_half", half_in_torch, like="aten::mm")


def gemm_route(rep):
    (op,) = [o for o in rep["operators"] if o["name"] == "gemm"]
    (s,) = [s for s in op["shapes"] if s["op"] == "aten::mm"]
    return s


def test_a_candidate_that_hands_half_its_rows_to_torch_is_labelled_with_its_share(us):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with TopLevelOps() as mode:
        want = half_in_torch(a, b)
    per_run = dict(mode.counts)
    assert per_run["aten::mm"] == 1  # the fallback itself
    assert torch.allclose(want, a @ b, atol=1e-5)
    us.enable({"operators": {"gemm": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": _name, "target": "aten::mm"}}},
               "report": {"interval_s": 0}})
    for _ in range(3):
        torch.mm(a, b)
    s = gemm_route(us.report())
    fb = s["fallback"]
    assert s["calls"] == 3 and s["shadow"]["passed"] == 3  # the nested torch.mm is not a call of its own
    assert fb["runs"] == fb["runs_calling_ops"] == 3
    assert fb["ops"] == {k: 3 * v for k, v in per_run.items()}
    assert fb["aten_calls"] == 3 * sum(per_run.values()) and fb["other_calls"] == 0
    assert fb["bound_calls"] == 3
    assert fb["work_share"] == pytest.approx(0.5)  # 2·(M/2)·K·N of its 2·M·K·N FLOPs were torch's
    label = s["served_by"]["fallback"]
    assert label == f"calls torch: {sum(per_run.values()):.3g} aten calls per run, 50% of its work in bound ops"


def test_a_native_candidate_that_calls_nothing_carries_no_label(us):
    us.enable({"operators": {"silu": {"mode": "shadow", "sample": 1.0,
                                      "candidate": understudy.native(candidate_dir() / "libsilu_cpu.so")}},
               "report": {"interval_s": 0}})
    x = torch.randn(4, 8)
    for _ in range(2):
        torch.nn.functional.silu(x)
    (op,) = [o for o in us.report()["operators"] if o["name"] == "silu"]
    (s,) = [s for s in op["shapes"] if s["op"] == "aten::silu"]
    assert s["fallback"]["runs"] == 2 and s["fallback"]["aten_calls"] == 0 and s["fallback"]["ops"] == {}
    assert "fallback" not in s["served_by"]


def test_the_metrics_say_which_implementation_serves(us):
    pytest.importorskip("prometheus_client")
    us.enable({"operators": {"gemm": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": _name, "target": "aten::mm"}}},
               "report": {"interval_s": 0}})
    torch.mm(torch.randn(8, 16), torch.randn(16, 4))
    text = understudy.metrics_text(understudy.report())
    info = series_labels(candidate="ust_fallback_test::mm_half", kind="torch_op", operator="gemm", source="")
    assert f"understudy_candidate_info{info} 1.0" in text
    serving = series_labels(implementation="production", operator="gemm")
    assert f"understudy_routes_serving{serving} 1.0" in text


class MatmulByAnAutogradFunction(torch.autograd.Function):
    """Named longer than a std::string holds inline: its apply's record owns
    the name on the heap, and frees it when the record ends."""

    @staticmethod
    def forward(ctx, a, b):
        return a @ b


# a name past the bytes a route keeps of one, cut there in the middle of an "Ä"
Unicode = type(torch.autograd.Function)("Ä" * 60, (torch.autograd.Function,),
                                        {"forward": staticmethod(lambda ctx, x: x * 1)})


def mm_by_functions(a, b):
    return Unicode.apply(MatmulByAnAutogradFunction.apply(a, b))


_by_functions = understudy.register_candidate("ust_fallback_test::mm_by_functions", mm_by_functions, like="aten::mm")


def test_the_functions_a_candidate_applies_are_named_as_torch_records_them(us):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autograd.profiler.profile() as prof:
        mm_by_functions(a, b)
    recorded = {e.name for e in prof.function_events}
    assert {MatmulByAnAutogradFunction.__name__, Unicode.__name__} <= recorded
    us.enable({"operators": {"gemm": {"mode": "shadow", "sample": 1.0,
                                      "candidate": {"torch_op": _by_functions, "target": "aten::mm"}}},
               "report": {"interval_s": 0}})
    for _ in range(3):
        torch.mm(a, b)
    s = gemm_route(us.report())  # the report's text is UTF-8 throughout: it decodes
    fb = s["fallback"]
    assert s["shadow"]["passed"] == 3 and fb["runs"] == 3
    # each name as the record had it while it ran, not memory freed since; the
    # long one cut at the start of a character (95 bytes: 47 of them and half of one)
    cut = Unicode.__name__.encode()[:95].decode(errors="ignore")
    assert cut == "Ä" * 47
    assert fb["ops"] == {MatmulByAnAutogradFunction.__name__: 3, cut: 3}
    assert fb["other_calls"] == 6 and fb["aten_calls"] == 0  # the functions' own ops are theirs
