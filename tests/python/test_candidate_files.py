"""Candidates from files (understudy.files, `understudy candidate add`):
KernelBench's ModelNew and KernelAgent's kernel_function made candidates of
vLLM's destination-passing `_C::rms_norm`, qualified in a process of their
own by default. Ground truth: every call of a test entry appends the id of
the process that ran it to $UST_TEST_CALL_LOG; results are compared with a
float64 reference computed here and with production run alone."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import understudy
from conftest import ROOT
from test_qualify_process import call_log, ran_in  # noqa: F401 - call_log is a fixture
from test_qualify_process import signals_reach_the_child  # noqa: F401 - autouse: a crash there ends as one

SCHEMA = "_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()"
_keep = []


def _define_rms_norm():
    """vLLM's _C::rms_norm, implemented here in torch (once per process)."""
    try:
        torch._C._get_schema("_C::rms_norm", "")
        return
    except RuntimeError:
        pass
    lib = torch.library.Library("_C", "FRAGMENT")
    _keep.append(lib)
    lib.define("rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()")

    def rms(out, x, w, eps):
        out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)

    lib.impl("rms_norm", rms, "CPU")


_define_rms_norm()


def reference(x, w, eps=1e-6):
    x64 = x.double()
    return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()).to(x.dtype)


LOG = "import os\ndef _log():\n    with open(os.environ['UST_TEST_CALL_LOG'], 'a') as f:\n        f.write(f'{os.getpid()}\\n')\n"

MODEL_NEW = LOG + textwrap.dedent("""
    import torch
    import torch.nn as nn

    class ModelNew(nn.Module):
        def __init__(self, eps):
            super().__init__()
            self.eps = eps

        def forward(self, hidden_states, weight):
            _log()
            v = hidden_states.pow(2).mean(-1, keepdim=True)
            return hidden_states * torch.rsqrt(v + self.eps) * weight

    def get_init_inputs():
        return [1e-6]
""")

KERNEL_FUNCTION = LOG + textwrap.dedent("""
    import torch

    def kernel_function(x, weight, eps):
        _log()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
""")


def cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python-shim"))
    return subprocess.run([sys.executable, "-m", "understudy", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def rms_call(x, w):
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, w, 1e-6)
    return out


def route(rep, op="rms_norm"):
    (o,) = [o for o in rep["operators"] if o["name"] == op]
    return o, o["shapes"]


def test_added_model_new_qualifies_in_its_own_process_then_runs_here(us, tmp_path, call_log):
    f = tmp_path / "rms_kb.py"
    f.write_text(MODEL_NEW)
    cfg = tmp_path / "understudy.json"
    r = cli("candidate", "add", f"{f}::ModelNew", "--like", "_C::rms_norm", "--schema", SCHEMA,
            "--config", str(cfg), "--sample", "1.0")
    assert r.returncode == 0, r.stderr
    assert "module 'ModelNew'" in r.stderr and "hidden_states->input" in r.stderr
    entry = json.loads(cfg.read_text())["operators"]["rms_norm"]
    cand = entry["candidate"]
    assert cand == {"file": str(f), "entry": "ModelNew", "sha256": understudy.sha256_of(f), "target": "_C::rms_norm",
                    "qualify": "process", "qualify_calls": 3}
    assert entry["mode"] == "shadow"
    assert len(ran_in(call_log)) == 0  # the check ran the file in a process of its own, calling nothing

    cfg_doc = json.loads(cfg.read_text())
    cfg_doc["report"] = {"interval_s": 0}
    cfg.write_text(json.dumps(cfg_doc))
    us.enable(str(cfg))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, generator=g)
    xs = [torch.randn(8, 64, generator=g) for _ in range(6)]
    outs = [rms_call(x, w) for x in xs]
    for x, o in zip(xs, outs):  # shadow: production served, bit for bit what it computes alone
        assert torch.equal(o, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
        assert torch.allclose(o.double(), reference(x, w).double(), rtol=1e-5, atol=1e-6)
    pids = ran_in(call_log)
    assert len(pids) == 6 and all(p != os.getpid() for p in pids[:3]) and pids[3:] == [os.getpid()] * 3, pids
    rep = us.report()
    op, (s,) = route(rep)
    src = op["candidate"]["source"]
    assert op["candidate"]["qualify"] == "process" and op["candidate"]["qualify_calls"] == 3
    assert src["kind"] == "file" and src["path"] == str(f) and src["sha256"] == cand["sha256"]
    assert src["form"] == "module" and src["style"] == "value" and src["args"]["hidden_states"] == "input"
    assert s["shadow"]["verified"] == 6 and s["shadow"]["passed"] == 6 and s["shadow"]["process_passed"] == 3
    by = dict(s["served_by"])
    # a ModelNew in torch: every op it runs is torch's (6 per run: pow, mean, add, rsqrt, mul, mul)
    assert by.pop("fallback") == "calls torch: 6 aten calls per run, 0% of its work in bound ops"
    assert s["fallback"]["runs"] == 3  # its runs here; those in its qualifying process are not seen
    # no kernel tracer on the CPU: production's kernels are not named
    assert by == {"production": "_C::rms_norm", "production_kernels": [], "candidate": src["label"], "now": "production"}
    assert src["label"].startswith("file rms_kb.py::ModelNew sha256:")


def test_kernel_function_serves_live_through_the_python_function(us, tmp_path, call_log):
    f = tmp_path / "rms_ka.py"
    f.write_text(KERNEL_FUNCTION)
    entry = understudy.candidate_from_file(str(f), like="_C::rms_norm", qualify="here")
    assert entry["source"]["entry"] == "kernel_function" and entry["source"]["form"] == "function"
    eps_name = torch._C._get_schema("_C::rms_norm", "").arguments[3].name  # test_shadow.py's spells it eps
    assert entry["source"]["args"] == {"x": "input", "weight": "weight", "eps": eps_name}
    us.enable({"operators": {"rms_norm": {"mode": "live", "sample": 0.0, "candidate": entry}},
               "report": {"interval_s": 0}})
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, generator=g)
    for n in (3, 3, 5):
        x = torch.randn(n, 32, generator=g)
        got = rms_call(x, w)
        assert torch.allclose(got.double(), reference(x, w).double(), rtol=1e-5, atol=1e-6)
    rep = us.report()
    _, shapes = route(rep)
    served = sum(s["rollout"]["served"]["candidate"] for s in shapes)
    qualifying = sum(s["shadow"]["verified"] for s in shapes)  # a route's first call qualifies it on copies
    assert served == 1 and qualifying == 2
    assert served + qualifying == len(ran_in(call_log))  # each call the report counts ran the file, here
    assert set(ran_in(call_log)) == {os.getpid()}
    assert all(s["served_by"]["now"] == "candidate" for s in shapes if s["rollout"]["served"]["candidate"])


def test_a_crash_in_the_qualifying_process_rolls_back_and_production_serves(us, tmp_path, call_log):
    f = tmp_path / "crash.py"
    f.write_text(LOG + "import os, signal\n\ndef kernel_function(x, weight, eps):\n    _log()\n"
                 "    os.kill(os.getpid(), signal.SIGSEGV)\n")
    entry = understudy.candidate_from_file(f"{f}::kernel_function", like="_C::rms_norm")
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": entry}},
               "report": {"interval_s": 0}})
    x, w = torch.randn(4, 16), torch.randn(16)
    for _ in range(3):
        assert torch.equal(rms_call(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    _, (s,) = route(us.report())
    ev = s["shadow"]["rollback"]
    assert s["mode"] == "rolled_back" and "SIGSEGV" in ev["message"] and ev["candidate"].startswith("file crash.py")
    assert len(ran_in(call_log)) == 1 and ran_in(call_log)[0] != os.getpid()


def test_a_file_signalling_the_serving_process_from_its_qualifying_process_is_killed(us, tmp_path, call_log):
    """The process a file qualifies in runs as the same user: the file could
    signal the serving process. It is confined as a native candidate's
    qualifying process is, before the file runs: setsid fails there
    (EPERM), and a signal to its parent (this process) kills it with
    SIGSYS, never arriving here."""
    import signal

    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    try:
        f = tmp_path / "signals.py"
        f.write_text(LOG + "import os, signal\n\ndef kernel_function(x, weight, eps):\n    _log()\n"
                     "    try:\n        os.setsid()\n    except PermissionError:\n        _log()\n"
                     "    os.kill(os.getppid(), signal.SIGUSR1)\n    return x\n")
        entry = understudy.candidate_from_file(f"{f}::kernel_function", like="_C::rms_norm")
        us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": entry}},
                   "report": {"interval_s": 0}})
        x, w = torch.randn(4, 16), torch.randn(16)
        for _ in range(3):
            assert torch.equal(rms_call(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
        _, (s,) = route(us.report())
    finally:
        signal.signal(signal.SIGUSR1, old)
    ev = s["shadow"]["rollback"]
    assert s["mode"] == "rolled_back" and "SIGSYS" in ev["message"], ev
    assert got == []  # the signal never reached this process
    child = ran_in(call_log)[0]
    assert ran_in(call_log) == [child, child] and child != os.getpid()  # setsid failed there, then it was killed


def test_an_entry_that_raises_rolls_back_with_its_error(us, tmp_path):
    f = tmp_path / "raises.py"
    f.write_text("def kernel_function(x, weight, eps):\n    raise NotImplementedError('no tail handling')\n")
    entry = understudy.candidate_from_file(str(f), like="_C::rms_norm", qualify="here")
    us.enable({"operators": {"rms_norm": {"mode": "canary", "canary": 0.5, "sample": 1.0, "candidate": entry}},
               "report": {"interval_s": 0}})
    x, w = torch.randn(4, 16), torch.randn(16)
    for _ in range(4):
        assert torch.equal(rms_call(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    _, (s,) = route(us.report())
    ev = s["shadow"]["rollback"]
    assert s["mode"] == "rolled_back" and "no tail handling" in ev["message"]


def test_a_result_of_the_wrong_shape_is_named(us, tmp_path):
    f = tmp_path / "short.py"
    f.write_text("def kernel_function(x, weight, eps):\n    return x[:, :-1]\n")
    entry = understudy.candidate_from_file(str(f), like="_C::rms_norm", qualify="here")
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": entry}},
               "report": {"interval_s": 0}})
    rms_call(torch.randn(4, 16), torch.randn(16))
    _, (s,) = route(us.report())
    msg = s["shadow"]["rollback"]["message"]
    out_name = torch._C._get_schema("_C::rms_norm", "").arguments[0].name
    assert f"result for '{out_name}' is (4, 15)" in msg and "writes it as (4, 16)" in msg


@pytest.mark.parametrize("text, ref, message", [
    ("def kernel_function(x, weight, eps)\n    return x\n", "bad.py", "is not valid Python"),
    ("def other(x):\n    return x\n", "bad.py::kernel_function", "defines no 'kernel_function'"),
    ("raise RuntimeError('import-time failure')\n", "bad.py", "import-time failure"),
    ("def kernel_function(x, weight, eps, mystery):\n    return x\n", "bad.py",
     "parameter 'mystery' matches no argument"),
])
def test_a_bad_file_or_entry_is_refused_with_the_reason(tmp_path, text, ref, message):
    (tmp_path / "bad.py").write_text(text)
    r = cli("candidate", "add", str(tmp_path / ref), "--like", "_C::rms_norm", "--schema", SCHEMA,
            "--config", str(tmp_path / "c.json"))
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "c.json").exists()


def test_a_file_changed_since_it_was_pinned_is_a_config_error(us, tmp_path):
    f = tmp_path / "rms.py"
    f.write_text(KERNEL_FUNCTION)
    pin = understudy.sha256_of(f)
    f.write_text(KERNEL_FUNCTION + "\n# edited\n")
    cfg = {"operators": {"rms_norm": {"mode": "shadow", "candidate": {
        "file": f"{f}::kernel_function", "sha256": pin, "target": "_C::rms_norm", "qualify": "here"}}}}
    with pytest.raises(understudy.ConfigError, match=r"operators.rms_norm.candidate.*not the pinned"):
        us.enable(cfg)
    assert not understudy.is_enabled()


def test_a_file_whose_target_is_defined_later_waits_for_it(us, tmp_path, call_log):
    """vLLM's _C ops are defined after understudy is enabled at start-up:
    the file's op is registered once its target exists."""
    f = tmp_path / "later.py"
    f.write_text(KERNEL_FUNCTION)
    us.enable({"operators": {"silu": {"mode": "shadow", "sample": 1.0, "candidate": {
        "file": f"{f}::kernel_function", "sha256": understudy.sha256_of(f), "target": "ust_later_test::silu",
        "qualify": "here", "args": {"weight": "y", "eps": "alpha"}}}},
        "problems_dir": str(_later_problems(tmp_path)), "report": {"interval_s": 0}})
    (op,) = [o for o in us.report()["operators"] if o["name"] == "silu"]
    assert op["candidate"]["op_state"] == "waiting for op"
    lib = torch.library.Library("ust_later_test", "DEF")
    _keep.append(lib)
    lib.define("silu(Tensor x, Tensor y, float alpha) -> Tensor")
    lib.impl("silu", lambda x, y, alpha: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + alpha) * y, "CPU")
    import time
    end = time.monotonic() + 60
    while time.monotonic() < end and not any(n.startswith("understudy_file::later_kernel_function")
                                             for n in torch._C._dispatch_get_all_op_names()):
        time.sleep(0.05)
    x, w = torch.randn(4, 8), torch.randn(8)
    torch.ops.ust_later_test.silu(x, w, 1e-6)
    (op,) = [o for o in us.report()["operators"] if o["name"] == "silu"]
    (s,) = op["shapes"]
    assert op["candidate"]["op_state"] == "resolved" and s["shadow"]["passed"] == 1 and len(ran_in(call_log)) == 1


def _later_problems(tmp_path):
    d = tmp_path / "problems"
    d.mkdir()
    for p in (ROOT / "problems").iterdir():
        if p.name != "silu.json":
            (d / p.name).symlink_to(p)
    (d / "silu.json").write_text(json.dumps({"schema_version": 1, "operator": "silu", "bindings": [
        {"op": "ust_later_test::silu", "key": {"M": "rows(x)", "N": "x[-1]"}}]}))
    return d
