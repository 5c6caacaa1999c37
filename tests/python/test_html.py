"""The report for people: the roofline figures it draws, the HTML page
(rendered by headless Chromium) and the text tables.

Ground truth: W and Q evaluated here from the operator definitions' own
text (conftest's evaluator) over the arguments the tests hand in, the
hardware profile the tests write, and the report's own figures where the
page is checked against the report it was made from."""
import json

import pytest
import torch

from conftest import _dim, _expr, ROOT
from test_shadow import routes, rms_inputs, run_rms_norm

PROFILE = {"schema_version": 1, "name": "test ceilings", "match": ["no such device"],
           "p_peak": {"fp32": 2e12, "bf16": 8e12}, "b_peak": 5e10, "source": "a test's made-up figures"}


def work_of(definition, op, args):
    """(W, Q) of one call, from problems/<definition>.json's text for op."""
    d = json.loads((ROOT / "problems" / f"{definition}.json").read_text())
    (rl,) = [b["roofline"] for b in d["bindings"] if b["op"] == op]
    env = {k: _dim(v, args) for k, v in rl["vars"].items()}
    return _expr(rl["W"], env), _expr(rl["Q_read"], env) + _expr(rl["Q_write"], env)


@pytest.fixture
def hw_dir(tmp_path):
    d = tmp_path / "hardware"
    d.mkdir()
    (d / "test.json").write_text(json.dumps(PROFILE))
    return d


def test_report_carries_w_q_intensity_and_achieved_rate(us, hw_dir):
    """Per shape key the report sums W and Q over the calls whose floor it
    evaluated; M=7 and M=8 share the pow2 bucket M=8, so the sums are of two
    different calls. intensity = W/Q, achieved = mean W / median time, and
    (one W path, one profile) achieved / roof(intensity) = S."""
    inputs = rms_inputs(shapes=((7, 128), (8, 128), (64, 256)))
    us.enable({"operators": {"rms_norm": {"mode": "observe", "sample": 1.0}},
               "hardware": {"dir": str(hw_dir), "profile": PROFILE["name"]}})
    run_rms_norm(inputs, repeat=3)
    rep = us.report()
    us.disable()
    want = {}
    for x, w in inputs:
        m = 1 << (x.shape[0] - 1).bit_length()
        wq = work_of("rms_norm", "_C::rms_norm", {"out": x, "input": x, "weight": w, "eps": 1e-6})
        acc = want.setdefault((m, x.shape[1]), [0, 0.0, 0.0])
        acc[0] += 3
        acc[1] += 3 * wq[0]
        acc[2] += 3 * wq[1]
    got = {(r["dims"]["M"], r["dims"]["N"]): r for r in routes(rep, "_C::rms_norm")}
    assert set(got) == set(want) == {(8, 128), (64, 256)}
    assert rep["hardware"] == [{k: PROFILE[k] for k in ("name", "p_peak", "b_peak", "source")}]
    for k, (n, flops, nbytes) in want.items():
        rf, p50 = got[k]["roofline"], got[k]["latency_ns"]["p50"]
        assert (rf["work_calls"], rf["flops_sum"], rf["bytes_sum"]) == (n, flops, nbytes), k
        assert rf["intensity"] == pytest.approx(flops / nbytes, rel=1e-12)
        assert rf["achieved_flops_s"] == pytest.approx(flops / n / p50 * 1e9, rel=1e-12)
        roof = min(PROFILE["p_peak"]["fp32"], rf["intensity"] * PROFILE["b_peak"])
        assert rf["achieved_flops_s"] / roof == pytest.approx(rf["S"], rel=1e-9), k
    assert got[(8, 128)]["roofline"]["flops_sum"] == 3 * (3 * 7 * 128 + 7) + 3 * (3 * 8 * 128 + 8)
