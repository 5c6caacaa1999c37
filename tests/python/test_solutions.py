"""FlashInfer-Bench Solutions as candidates (understudy.solutions): an RMSNorm
Definition with a constant hidden size, and Python Solutions written here,
destination-passing and value-returning, for vLLM's `_C::rms_norm`. Ground
truth: each call of a Solution's entry appends the id of the process it ran
in to $UST_TEST_CALL_LOG; results are compared with a float64 reference."""
import json
import os

import pytest
import torch

import understudy

fib = pytest.importorskip("flashinfer_bench", reason="flashinfer-bench (./run.sh test installs it)")
from flashinfer_bench.data import Solution  # noqa: E402
from test_candidate_files import _define_rms_norm, reference, rms_call  # noqa: E402

_define_rms_norm()

DEFINITION = {
    "name": "rmsnorm_h64", "op_type": "rmsnorm",
    "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 64}},
    "inputs": {"hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "float32"},
               "weight": {"shape": ["hidden_size"], "dtype": "float32"}},
    "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "float32"}},
    "reference": "import torch\n\ndef run(hidden_states, weight):\n    x = hidden_states\n"
                 "    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight\n",
}
LOG = ("import os\n\ndef _log():\n    with open(os.environ['UST_TEST_CALL_LOG'], 'a') as f:\n"
       "        f.write(f'{os.getpid()}\\n')\n")
DPS = LOG + ("import torch\n\ndef run(h, w, out):\n    _log()\n"
             "    out.copy_(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w)\n")
VALUE = LOG + ("import torch\nfrom .helpers import scale\n\ndef run(h, w):\n    _log()\n"
               "    return scale(h) * w\n")
HELPERS = "import torch\n\ndef scale(h):\n    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)\n"


def solution(name, main, dps, extra=()):
    return {"name": name, "definition": "rmsnorm_h64", "author": "test",
            "spec": {"language": "python", "target_hardware": ["cpu"], "entry_point": "main.py::run",
                     "destination_passing_style": dps},
            "sources": [{"path": "main.py", "content": main}, *extra]}


@pytest.fixture
def call_log(tmp_path, monkeypatch):
    path = tmp_path / "calls.log"
    monkeypatch.setenv("UST_TEST_CALL_LOG", str(path))
    return path


def pids(path):
    """The process of each call of the Solution's entry, in order."""
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def calls(path):
    return len(pids(path))


def write(tmp_path, sol):
    (tmp_path / "def.json").write_text(json.dumps(DEFINITION))
    (tmp_path / "sol.json").write_text(json.dumps(sol))
    return str(tmp_path / "sol.json"), str(tmp_path / "def.json"), Solution.model_validate(sol).hash()


def shapes(rep):
    (o,) = [o for o in rep["operators"] if o["name"] == "rms_norm"]
    return o, {s["key"]: s for s in o["shapes"]}


@pytest.mark.parametrize("style", ["destination", "value"])
def test_a_solution_is_shadowed_on_the_routes_its_definition_covers(us, tmp_path, call_log, style):
    sol = solution("rms_dps", DPS, True) if style == "destination" else \
        solution("rms_val", VALUE, False, [{"path": "helpers.py", "content": HELPERS}])
    path, dpath, h = write(tmp_path, sol)
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": {
        "solution": path, "definition": dpath, "hash": h, "target": "_C::rms_norm", "qualify": "here"}}},
        "report": {"interval_s": 0}})
    g = torch.Generator().manual_seed(0)
    w64, w32 = torch.randn(64, generator=g), torch.randn(32, generator=g)
    for n in (3, 5, 5):
        x = torch.randn(n, 64, generator=g)
        assert torch.allclose(rms_call(x, w64).double(), reference(x, w64).double(), rtol=1e-5, atol=1e-6)
    x = torch.randn(4, 32, generator=g)
    rms_call(x, w32)  # hidden_size 32: outside the Definition
    op, routes = shapes(us.report())
    src = op["candidate"]["source"]
    assert src["kind"] == "solution" and src["hash"] == h and src["definition"] == "rmsnorm_h64"
    assert src["destination_passing"] is (style == "destination") and src["const_axes"] == {"hidden_size": 64}
    assert src["args"] == {"hidden_states": "input", "weight": "weight"}
    assert op["candidate"]["when"] == {"N": 64}  # the constant axis as a route constraint
    inside = [s for k, s in routes.items() if k.endswith("N=64")]
    (outside,) = [s for k, s in routes.items() if k.endswith("N=32")]
    assert sum(s["shadow"]["passed"] for s in inside) == 3 == calls(call_log)  # the N=32 call never ran it
    assert outside["shadow"]["calls"] == 0 and outside["mode"] == "shadow"
    assert outside["served_by"]["why"] == "the route's key is outside the candidate's 'when'"
    assert all(s["served_by"]["candidate"] == f"solution {sol['name']} sha1:{h[:12]}" for s in routes.values())


def test_a_wrong_solution_rolls_back_naming_it(us, tmp_path, call_log):
    wrong = DPS.replace("+ 1e-6) * w)", "+ 1e-6) * w + 0.5)")
    path, dpath, h = write(tmp_path, solution("rms_wrong", wrong, True))
    us.enable({"operators": {"rms_norm": {"mode": "canary", "canary": 0.5, "sample": 1.0, "candidate": {
        "solution": path, "definition": dpath, "hash": h, "target": "_C::rms_norm", "qualify": "here"}}},
        "report": {"interval_s": 0}})
    x, w = torch.randn(4, 64), torch.randn(64)
    for _ in range(4):
        assert torch.allclose(rms_call(x, w).double(), reference(x, w).double(), rtol=1e-5, atol=1e-6)
    _, routes = shapes(us.report())
    (s,) = routes.values()
    assert s["mode"] == "rolled_back" and s["shadow"]["rollback"]["candidate"] == f"solution rms_wrong sha1:{h[:12]}"
    assert calls(call_log) == 1


def test_the_pin_is_the_solutions_content_hash(us, tmp_path):
    path, dpath, h = write(tmp_path, solution("rms_dps", DPS, True))
    other = Solution.model_validate(solution("rms_dps", DPS + "\n# edited\n", True)).hash()
    with pytest.raises(understudy.ConfigError, match=f"has content hash {h}, not the pinned {other}"):
        us.enable({"operators": {"rms_norm": {"mode": "shadow", "candidate": {
            "solution": path, "definition": dpath, "hash": other, "target": "_C::rms_norm"}}}})
    assert not understudy.is_enabled()


def test_a_solution_that_does_not_fit_its_target_is_refused(tmp_path):
    path, dpath, h = write(tmp_path, solution("rms_dps", DPS, True))
    # aten::_fused_rms_norm returns the output and its reciprocal RMS: two, where the Definition has one
    with pytest.raises(ValueError, match=r"has 1 output\(s\) \(output\); aten::_fused_rms_norm writes or returns 2"):
        understudy.candidate_from_solution(path, definition=dpath, like="aten::_fused_rms_norm")
    cuda = solution("rms_cuda", DPS, True)
    cuda["spec"]["language"] = "cuda"
    cuda["sources"] = [{"path": "main.py", "content": DPS}]
    path, dpath, _ = write(tmp_path, cuda)
    with pytest.raises(ValueError, match="only python and triton Solutions"):
        understudy.candidate_from_solution(path, definition=dpath, like="_C::rms_norm")


def test_a_solution_qualifies_in_its_own_process_then_runs_here(us, tmp_path, call_log):
    """By default a Solution's code is not imported into the serving process
    at first: each route's first qualify_calls shadows run it in a process
    of its own (understudy.filehost), then the route runs it here."""
    path, dpath, h = write(tmp_path, solution("rms_qualified", DPS, True))  # a Solution no other test registers
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": {
        "solution": path, "definition": dpath, "hash": h, "target": "_C::rms_norm", "qualify_calls": 2}}},
        "report": {"interval_s": 0}})
    assert calls(call_log) == 0
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, generator=g)
    xs = [torch.randn(6, 64, generator=g) for _ in range(5)]
    for x in xs:  # shadow: production served, bit for bit what it computes alone
        assert torch.equal(rms_call(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    ran = pids(call_log)
    assert len(ran) == 5 and all(p != os.getpid() for p in ran[:2]) and ran[2:] == [os.getpid()] * 3, ran
    op, routes = shapes(us.report())
    (s,) = routes.values()
    assert op["candidate"]["qualify"] == "process" and op["candidate"]["qualify_calls"] == 2
    assert s["shadow"]["verified"] == 5 and s["shadow"]["passed"] == 5 and s["shadow"]["process_passed"] == 2
    # named again with another count: the same op, the entry with that count
    from understudy import files

    started = len(files._children)
    first = understudy.candidate_from_solution(path, definition=dpath, like="_C::rms_norm", qualify_calls=2)
    again = understudy.candidate_from_solution(path, definition=dpath, like="_C::rms_norm", qualify_calls=7)
    assert again["torch_op"] == first["torch_op"] and (first["qualify_calls"], again["qualify_calls"]) == (2, 7)
    assert len(files._children) == started  # no other qualifying process was started for it


def test_a_solution_crashing_its_qualifying_process_rolls_back_and_production_serves(us, tmp_path, call_log):
    # SIGKILL, as the kernel's OOM killer sends it: no handler in that process (a sanitizer's) can turn it
    # into an exit status
    crash = LOG + "import os, signal\n\ndef run(h, w, out):\n    _log()\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    path, dpath, h = write(tmp_path, solution("rms_crash", crash, True))
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": {
        "solution": path, "definition": dpath, "hash": h, "target": "_C::rms_norm"}}},
        "report": {"interval_s": 0}})
    x, w = torch.randn(4, 64), torch.randn(64)
    for _ in range(3):
        assert torch.equal(rms_call(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    _, routes = shapes(us.report())
    (s,) = routes.values()
    ev = s["shadow"]["rollback"]
    assert s["mode"] == "rolled_back" and "killed by SIGKILL" in ev["message"], ev
    assert ev["candidate"] == f"solution rms_crash sha1:{h[:12]}"
    assert len(pids(call_log)) == 1 and pids(call_log)[0] != os.getpid()


def test_a_solution_whose_import_fails_is_refused_with_the_reason_from_its_process(us, tmp_path):
    bad = "raise RuntimeError('import-time failure')\n"
    path, dpath, h = write(tmp_path, solution("rms_bad", bad, True))
    with pytest.raises(understudy.ConfigError, match="importing main.py raised RuntimeError: import-time failure"):
        us.enable({"operators": {"rms_norm": {"mode": "shadow", "candidate": {
            "solution": path, "definition": dpath, "hash": h, "target": "_C::rms_norm"}}}})
    assert not understudy.is_enabled()
    # qualify "here" imports it in this process, and fails the same way
    with pytest.raises(ValueError, match="importing main.py raised RuntimeError: import-time failure"):
        understudy.candidate_from_solution(path, definition=dpath, like="_C::rms_norm", qualify="here")


@pytest.mark.parametrize("extra, message", [
    ({"qualify": "elsewhere"}, "qualify' must be \"process\""),
    ({"qualify": "here", "qualify_calls": 2}, "qualify_calls' applies only with \"qualify\": \"process\""),
    ({"qualify_calls": 0}, "qualify_calls' must be a whole number of calls from 1"),
])
def test_a_bad_qualify_field_is_a_config_error_naming_it(us, tmp_path, extra, message):
    path, dpath, h = write(tmp_path, solution("rms_dps", DPS, True))
    with pytest.raises(understudy.ConfigError, match=r"operators\.rms_norm\.candidate\." + message.split("'")[0]):
        us.enable({"operators": {"rms_norm": {"mode": "shadow", "candidate": {
            "solution": path, "definition": dpath, "hash": h, "target": "_C::rms_norm", **extra}}}})
    assert not understudy.is_enabled()
