"""The report file and `python -m understudy report`."""
import os
import subprocess
import sys
import time

import torch

from conftest import ROOT, clocked, held_for, load_report
from test_shadow import rms_inputs, run_rms_norm, silu_and_mul


def test_periodic_atomic_report_and_cli_table(us, report_path):
    """The operators' weights (shares of device time) lie within the bounds
    that the test's own figures give: each call of its _C ops takes at least
    the time it is held for and at most what the test's clock measures
    around it; a gemm call takes between 0 and what the clock measures."""
    ops = ("gemm", "rms_norm", "silu_and_mul")
    us.enable({"operators": {op: {"mode": "observe", "sample": 1.0} for op in ops},
               "report": {"path": str(report_path), "interval_s": 0.05}})
    a, b = torch.randn(16, 8), torch.randn(8, 4)
    lo, hi = {}, {}
    lo["gemm"], hi["gemm"] = 0, sum(clocked(torch.mm, a, b) for _ in range(10))
    with held_for(3_000_000):
        rms = rms_inputs(shapes=((8, 256),))
        hi["rms_norm"] = sum(clocked(run_rms_norm, rms, 1) for _ in range(6))
        lo["rms_norm"] = 6 * 3_000_000
    with held_for(2_000_000):
        x = torch.randn(4, 512)
        hi["silu_and_mul"] = sum(clocked(silu_and_mul, x) for _ in range(3))
        lo["silu_and_mul"] = 3 * 2_000_000
    deadline = time.monotonic() + 60  # the worker writes it every 0.05 s: a guard against one that never does
    while not report_path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert report_path.exists(), "the periodic report was not written"
    rep = load_report(report_path)  # a complete JSON document: written atomically
    assert rep["schema"] == "understudy.report" and rep["version"] == 1
    us.disable()
    leftovers = [p for p in os.listdir(report_path.parent) if ".tmp." in p]
    assert leftovers == []
    final = load_report(report_path)
    got = {o["name"]: o for o in final["operators"]}
    assert {n: o["calls"] for n, o in got.items()} == {"gemm": 10, "rms_norm": 6, "silu_and_mul": 3}
    for n in ops:
        others_lo = sum(lo[m] for m in ops if m != n)
        others_hi = sum(hi[m] for m in ops if m != n)
        w_lo, w_hi = lo[n] / (lo[n] + others_hi), hi[n] / (hi[n] + others_lo)
        assert w_lo <= got[n]["weight"] <= w_hi, (n, got[n]["weight"], w_lo, w_hi)
        assert lo[n] <= got[n]["est_device_time_ns"] <= hi[n], n
    assert got["gemm"]["weight"] > 0
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    out = subprocess.run([sys.executable, "-m", "understudy", "report", str(report_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "aten::mm|cpu|f32,f32|M=16,K=8,N=4" in out.stdout
    assert "_C::rms_norm|cpu|f32,f32,f32|M=8,N=256" in out.stdout
    assert "_C::silu_and_mul|cpu|f32,f32|M=4,d=256" in out.stdout
    assert "p50 us" in out.stdout
    bad = report_path.parent / "bad.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "understudy", "report", str(bad)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "cannot read report" in out.stderr


def test_report_into_a_pipe_closed_early_ends_quietly(us, report_path):
    """`understudy report FILE | head`: the reader leaves before the table is
    written; the command ends without a traceback, with the status a closed
    pipe gives (128 + SIGPIPE), as the shell's own tools do."""
    import signal

    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
               "report": {"path": str(report_path), "interval_s": 0}})
    for n in range(1, 200):  # keys enough for a table larger than a pipe's buffer
        torch.mm(torch.ones(n, 2), torch.ones(2, 3))
    us.disable()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    for args in (["--shapes", "1000"], []):
        p = subprocess.Popen([sys.executable, "-m", "understudy", "report", str(report_path), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        p.stdout.close()  # before the command has written anything
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 128 + signal.SIGPIPE, err
        assert err == "", err
    r = subprocess.run(f"'{sys.executable}' -m understudy report '{report_path}' --shapes 1000 | head -n 2",
                       shell=True, capture_output=True, text=True, env=env, timeout=120)
    assert len(r.stdout.splitlines()) == 2 and r.stderr == "", r.stderr


def _cli_report(path, env):
    return subprocess.run([sys.executable, "-m", "understudy", "report", str(path)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_control_characters_from_a_report_are_escaped(us, report_path):
    """A shape key, an operator name and a rollback reason carrying terminal
    escapes, a carriage return and a bidirectional override: printed as
    escapes, never as the characters."""
    us.enable({"operators": {"gemm": {"mode": "observe", "sample": 1.0}},
               "report": {"path": str(report_path), "interval_s": 0}})
    torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    us.disable()
    rep = load_report(report_path)
    (op,) = [o for o in rep["operators"] if o["shapes"]]
    op["name"] = "gemm\u202eevil"
    op["shapes"][0]["key"] = "aten::mm\x1b[2J\x1b[31m|cpu\rOWNED"
    report_path.write_text(__import__("json").dumps(rep))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    out = _cli_report(report_path, env)
    assert out.returncode == 0, out.stderr
    assert not any(c in out.stdout for c in ("\x1b", "\r", "\u202e"))
    assert "aten::mm\\x1b[2J\\x1b[31m|cpu\\rOWNED" in out.stdout and "gemm\\u202eevil" in out.stdout


def test_a_fifo_is_refused_and_a_bad_file_named_without_its_bytes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    out = _cli_report(fifo, env)
    assert out.returncode == 2 and "not a regular file" in out.stderr and "Traceback" not in out.stderr
    secret = tmp_path / "secret.json"
    secret.write_text("SECRET-TOKEN-3b1f\x1b[31m not json")
    out = _cli_report(secret, env)
    assert out.returncode == 2 and "SECRET" not in out.stderr and "\x1b" not in out.stderr
    assert "cannot read report" in out.stderr and out.stderr.count("\n") == 1
