"""The report file and `python -m understudy report`."""
import os
import subprocess
import sys
import time

import torch

from conftest import ROOT, load_report


def test_periodic_atomic_report_and_cli_table(us, report_path):
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}}, "report": {"path": str(report_path), "interval_s": 0.05}})
    for _ in range(10):
        torch.mm(torch.randn(16, 8), torch.randn(8, 4))
    deadline = time.time() + 5
    while not report_path.exists() and time.time() < deadline:
        time.sleep(0.02)
    assert report_path.exists(), "the periodic report was not written"
    rep = load_report(report_path)  # a complete JSON document: written atomically
    assert rep["schema"] == "understudy.report" and rep["version"] == 1
    us.disable()
    leftovers = [p for p in os.listdir(report_path.parent) if ".tmp." in p]
    assert leftovers == []
    final = load_report(report_path)
    (gemm,) = final["operators"]
    assert gemm["calls"] == 10 and gemm["weight"] == 1.0
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    out = subprocess.run([sys.executable, "-m", "understudy", "report", str(report_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "aten::mm|cpu|f32,f32|M=16,K=8,N=4" in out.stdout
    assert "p50 us" in out.stdout
    bad = report_path.parent / "bad.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "understudy", "report", str(bad)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "cannot read report" in out.stderr
