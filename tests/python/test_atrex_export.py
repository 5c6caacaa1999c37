"""export-atrex: the observed workload in Atrex-Bench's layout, readable the way
the benchmark reads its own data (tests/data/atrex-bench holds the original)."""
import json
import os
import subprocess
import sys

import torch

import understudy
from conftest import ROOT, assert_busiest_first, clocked, held_for
from test_shadow import rms_inputs, run_rms_norm, silu_and_mul


def test_export_writes_atrex_layout(us, tmp_path):
    """Shapes, calls and phases from the calls the test makes; each exported
    row's device time and each operator's importance from host time the test
    controls: every call of the test's _C ops takes at least the time it is
    held for (conftest.held_for) and at most what the test's clock measures
    around it, so each sum understudy reports lies between the two, and so
    do the shares computed from them."""
    report = tmp_path / "r.json"
    us.enable({"operators": {"rms_norm": {"sample": 1.0}, "silu_and_mul": {"sample": 1.0}, "gemm": {"sample": 1.0}},
               "report": {"path": str(report), "interval_s": 0}})
    ms = 1_000_000
    # (token_count, hidden_size) as exported -> (calls, held ns, phase, input shape)
    plan = {(512, 1024): (2, 20 * ms, "prefill", (300, 1024)),  # M buckets to 512
            (8, 2048): (5, 4 * ms, "decode", (8, 2048)),
            (8, 1024): (5, 1 * ms, "decode", (8, 1024))}
    measured = {}  # row -> the test's own clock, summed over its calls
    for row, (n, hold, ph, shape) in plan.items():
        (inp,) = rms_inputs(shapes=(shape,))
        with understudy.phase(ph), held_for(hold):
            measured[row] = sum(clocked(run_rms_norm, [inp], 1) for _ in range(n))
    silu_calls, silu_hold = 3, 10 * ms
    x = torch.randn(16, 2 * 512)
    with understudy.phase("decode"), held_for(silu_hold):
        silu_measured = sum(clocked(silu_and_mul, x) for _ in range(silu_calls))
    torch.mm(torch.randn(4, 4), torch.randn(4, 4))  # gemm has no Atrex mapping: not exported
    us.disable()
    out = tmp_path / "atrex"
    r = subprocess.run([sys.executable, "-m", "understudy", "export-atrex", str(out), str(report)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert r.returncode == 0, r.stderr
    shapes = json.loads((out / "rms_norm" / "shapes.json").read_text())
    observed = json.loads((out / "rms_norm" / "observed.json").read_text())
    ref = json.loads((ROOT / "tests" / "data" / "atrex-bench" / "rms_norm" / "shapes.json").read_text())
    # the benchmark's own layout: "i": {init_kwargs, input_kwargs} with the same kwargs names
    assert set(shapes["0"]) == set(ref["0"]) and set(shapes["0"]["input_kwargs"]) == set(ref["0"]["input_kwargs"])
    rows = [(shapes[str(i)]["input_kwargs"]["token_count"], shapes[str(i)]["input_kwargs"]["hidden_size"])
            for i in range(len(shapes))]
    # busiest first, as the held and measured times order them (on a quiet machine the
    # plan's 40 > 20 > 5 ms decides every pair)
    assert_busiest_first(rows, {row: n * h for row, (n, h, _, _) in plan.items()}, measured)
    for i, row in enumerate(rows):
        n, hold, ph, _ = plan[row]
        o = observed[str(i)]
        assert (o["calls"], o["phases"]) == (n, [ph])
        assert n * hold <= o["est_device_time_ns"] <= measured[row], row
    imp = json.loads((out / "operator_importance.json").read_text())["operators"]
    assert imp["rms_norm"]["phase"] == "decode/prefill" and imp["silu_and_mul"]["phase"] == "decode"
    assert (imp["rms_norm"]["num_profiles"], imp["silu_and_mul"]["num_profiles"]) == (3, 1)
    rms_lo, rms_hi = sum(n * h for n, h, _, _ in plan.values()), sum(measured.values())
    silu_lo, silu_hi = silu_calls * silu_hold, silu_measured
    assert_busiest_first(list(imp), {"rms_norm": rms_lo, "silu_and_mul": silu_lo},
                         {"rms_norm": rms_hi, "silu_and_mul": silu_hi})  # about 65 ms against 30 ms
    assert rms_lo / (rms_lo + silu_hi) <= imp["rms_norm"]["importance_score"] <= rms_hi / (rms_hi + silu_lo)
    assert silu_lo / (silu_lo + rms_hi) <= imp["silu_and_mul"]["importance_score"] <= silu_hi / (silu_hi + rms_lo)
    print(f"importance: rms_norm {imp['rms_norm']['importance_score']:.4f} in "
          f"[{rms_lo / (rms_lo + silu_hi):.4f}, {rms_hi / (rms_hi + silu_lo):.4f}] (the test's clock: "
          f"{rms_hi / (rms_hi + silu_hi):.4f})")
    assert not (out / "gemm").exists()
    silu_shapes = json.loads((out / "silu_and_mul" / "shapes.json").read_text())
    assert silu_shapes["0"]["input_kwargs"] == {"shape": [16, 1024]}


def test_export_refuses_what_it_cannot_map(tmp_path):
    from understudy.atrex import export
    import pytest

    rep = {"operators": [{"name": "gemm", "definition": "/etc/passwd", "shapes": []}]}
    with pytest.raises(ValueError, match="no operator of the report has an atrex mapping"):
        export(rep, str(tmp_path))
    bad = tmp_path / "defs"
    bad.mkdir()
    (bad / "x.json").write_text(json.dumps({"operator": "x", "atrex": {"operator": "../escape", "bindings": {}}}))
    rep = {"operators": [{"name": "x", "definition": "", "shapes": []}]}
    with pytest.raises(ValueError, match="not a plain directory name"):
        export(rep, str(tmp_path / "out"), str(bad))
