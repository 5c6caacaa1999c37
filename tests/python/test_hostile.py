"""Hostile candidates: what generated kernels get wrong, tried as an attacker
would. The promise under test: shadow cannot hurt the caller, a candidate
that misbehaves is caught before (or when) it serves, production keeps
serving. Ground truth: the same calls without understudy."""
import pytest
import torch
import torch.nn.functional as F

import understudy
from conftest import candidate_dir
from test_shadow import candidate_op


def native(name):
    return understudy.native(candidate_dir() / f"lib{name}.so")


def silu_config(mode, candidate, sample=1.0, **extra):
    op = {"mode": mode, "sample": sample, "candidate": candidate, **extra}
    return {"operators": {"silu": op}, "report": {"interval_s": 0}}


def silu_route(rep):
    (r,) = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "aten::silu"]
    return r


def _writes_input_after(x):
    y = F.silu(x)
    x.add_(1)  # computed from the original values, then writes its input
    return y


def writes_input_op():
    return {"torch_op": candidate_op("ust_hostile::silu_writes_input", _writes_input_after, "aten::silu"),
            "target": "aten::silu"}


@pytest.mark.parametrize("kind", ["native", "torch_op"])
def test_shadow_candidate_writing_its_input_never_touches_the_callers(us, kind):
    """A candidate that writes its input (x[0] = 1234 natively, x.add_(1) as a
    torch op, both after a correct result): in shadow it runs on private
    copies, so the caller's tensors stay bit-equal to a run without
    understudy, every served output is production's, and the route is rolled
    back with "wrote input"."""
    cand = native("silu_cpu_writes_input") if kind == "native" else writes_input_op()
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(4, 8, generator=g) for _ in range(4)]
    plain_in = [x.clone() for x in xs]
    plain_out = [F.silu(x) for x in plain_in]
    us.enable(silu_config("shadow", cand))
    outs = [F.silu(x) for x in xs]
    r = silu_route(us.report())
    for x, p in zip(xs, plain_in):
        assert torch.equal(x, p)
    for y, p in zip(outs, plain_out):
        assert torch.equal(y, p)
    assert r["mode"] == "rolled_back"
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "wrote input" and ev["output"] == "self", ev
    assert "wrote input 'self'" in ev["message"]
    assert r["shadow"]["bytes_copied"] >= 4 * 8 * 4  # the candidate's copy of its input


@pytest.mark.parametrize("mode", ["canary", "live"])
@pytest.mark.parametrize("kind", ["native", "torch_op"])
def test_serving_candidate_writing_its_input_is_rolled_back_before_it_serves(us, mode, kind):
    """Canary and live: before its first served call the candidate qualifies
    on copies; one that writes an input is rolled back there and never runs
    on the caller's tensors."""
    cand = native("silu_cpu_writes_input") if kind == "native" else writes_input_op()
    extra = {"canary": 0.5} if mode == "canary" else {}
    us.enable(silu_config(mode, cand, sample=0.0, **extra))
    g = torch.Generator().manual_seed(8)
    for _ in range(6):
        x = torch.randn(4, 8, generator=g)
        before = x.clone()
        y = F.silu(x)
        assert torch.equal(x, before) and torch.equal(y, F.silu(before))
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["rollback"]["reason"] == "wrote input"
    assert r["rollout"]["served"]["candidate"] == 0 and r["rollout"]["qualified"] is False


_STATE = {"calls": 0}


def _goes_bad(x):
    """Correct while it qualifies, then writes its input on every call."""
    _STATE["calls"] += 1
    y = F.silu(x)
    if _STATE["calls"] > 2:
        x.mul_(0)
    return y


def test_verified_serving_call_that_writes_an_input_is_undone(us):
    """Live, every call verified: a candidate that starts writing its input
    after it qualified is caught on the call; the caller's input is restored
    and production's result is served (host comparisons conclude before the
    call returns)."""
    _STATE["calls"] = 0
    name = candidate_op("ust_hostile::silu_goes_bad", _goes_bad, "aten::silu")
    us.enable(silu_config("live", {"torch_op": name, "target": "aten::silu"}, sample=1.0))
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        x = torch.randn(4, 8, generator=g)
        before = x.clone()
        y = F.silu(x)
        assert torch.equal(x, before) and torch.allclose(y, F.silu(before))
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["rollback"]["reason"] == "wrote input"
    assert r["shadow"]["rollback"]["while_serving"] is True
    assert r["rollout"]["served"]["candidate"] == 1  # call 2; call 3 was caught and undone


def _wrong_structure(kind):
    calls = {"n": 0}

    def cand(x):
        calls["n"] += 1
        y = F.silu(x)
        if calls["n"] <= 2:  # right while it qualifies and on its first served call
            return y
        if kind == "shape":
            return y.reshape(-1)
        if kind == "dtype":
            return y.double()
        if kind == "strides":
            return y.t().contiguous().t()
        return x  # its input itself
    return cand


@pytest.mark.parametrize("kind", ["shape", "dtype", "strides", "input"])
def test_unverified_results_are_checked_for_structure(us, kind):
    """Live with sample 0: unverified results of the wrong shape ([32] for
    [4, 8]), dtype (float64), strides, or the candidate's input tensor itself
    reached the caller. Every served result is now checked against the
    layout production showed for the call's signature; a mismatch serves
    production and rolls the route back."""
    name = candidate_op(f"ust_hostile::silu_{kind}", _wrong_structure(kind), "aten::silu")
    us.enable(silu_config("live", {"torch_op": name, "target": "aten::silu"}, sample=0.0))
    x = torch.randn(4, 8) if kind != "strides" else torch.randn(8, 8)
    outs = []
    for _ in range(5):
        v = x.clone()
        y = F.silu(v)
        outs.append(y)
        assert torch.equal(v, x)
        want = F.silu(x)
        assert y.shape == want.shape and y.dtype == want.dtype and y.stride() == want.stride()
        assert y.data_ptr() != v.data_ptr()
    r = silu_route(us.report())
    assert r["mode"] == "rolled_back", r["rollout"]
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "schema" and ev["while_serving"] is True, ev
    assert r["rollout"]["served"]["candidate"] == 1  # the one right served call; the third was caught
    print(ev["message"])
