"""export-atrex: the observed workload in Atrex-Bench's layout, readable the way
the benchmark reads its own data (tests/data/atrex-bench holds the original)."""
import json
import os
import subprocess
import sys

import torch

from conftest import ROOT
from test_shadow import rms_inputs, run_rms_norm


def test_export_writes_atrex_layout(us, tmp_path):
    report = tmp_path / "r.json"
    us.enable({"operators": {"rms_norm": {"sample": 1.0}, "silu_and_mul": {"sample": 1.0}, "gemm": {"sample": 1.0}},
               "report": {"path": str(report), "interval_s": 0}})
    with __import__("understudy").phase("prefill"):
        run_rms_norm(rms_inputs(shapes=((300, 1024),)), repeat=2)  # M buckets to 512
    with __import__("understudy").phase("decode"):
        run_rms_norm(rms_inputs(shapes=((8, 1024), (8, 2048))), repeat=5)
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
    got = {(s["input_kwargs"]["token_count"], s["input_kwargs"]["hidden_size"]) for s in shapes.values()}
    assert got == {(512, 1024), (8, 1024), (8, 2048)}
    calls = {(shapes[i]["input_kwargs"]["token_count"], shapes[i]["input_kwargs"]["hidden_size"]):
             (observed[i]["calls"], observed[i]["phases"]) for i in shapes}
    assert calls == {(512, 1024): (2, ["prefill"]), (8, 1024): (5, ["decode"]), (8, 2048): (5, ["decode"])}
    dev = [observed[str(i)]["est_device_time_ns"] for i in range(len(observed))]
    assert dev == sorted(dev, reverse=True)  # busiest first
    imp = json.loads((out / "operator_importance.json").read_text())
    assert set(imp["operators"]) == {"rms_norm"}
    assert imp["operators"]["rms_norm"]["importance_score"] == 1.0
    assert imp["operators"]["rms_norm"]["phase"] == "decode/prefill"
    assert not (out / "gemm").exists()


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
