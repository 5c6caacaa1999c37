"""Failing calls kept whole in the report and replayed (`understudy repro`),
and exported as FlashInfer-Bench workloads.

Ground truth: the tensors the tests hand in (their exact values, strides and
storage offsets), production's outputs computed here in float64, and for the
replay a fresh process that sees the report alone (and the module that
defines the candidate's torch op). The exported workload is read back with
flashinfer_bench's own TraceSet and load_safetensors.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import understudy
from conftest import ROOT, load_report
from understudy import repro
from test_shadow import native, rms_inputs, run_rms_norm

THRESHOLD = 6.0  # the candidate is wrong only where silu(x) is above it

CANDIDATE_MODULE = f"""
import torch
import understudy

def silu_saturating(x):
    # right for every input whose silu stays below {THRESHOLD}, wrong above it
    return torch.nn.functional.silu(x).clamp(max={THRESHOLD})

def silu_right(x):
    return x * torch.sigmoid(x)

SATURATING = understudy.register_candidate("ust_repro::silu_saturating", silu_saturating, like="aten::silu")
RIGHT = understudy.register_candidate("ust_repro::silu_right", silu_right, like="aten::silu")
"""


@pytest.fixture(scope="module")
def candidates(tmp_path_factory):
    """The module that registers the candidates, imported here as the
    replaying process will import it."""
    path = tmp_path_factory.mktemp("repro") / "repro_candidates.py"
    path.write_text(textwrap.dedent(CANDIDATE_MODULE))
    import importlib.util
    spec = importlib.util.spec_from_file_location("repro_candidates", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def shadow(op, report=None, **guard):
    cfg = {"operators": {"silu": {"mode": "shadow", "sample": 1.0, "guard": guard,
                                  "candidate": {"torch_op": op, "target": "aten::silu"}}},
           "defaults": {"key_every": 1}, "report": {"interval_s": 0}}
    if report is not None:
        cfg["report"]["path"] = str(report)
    return cfg


def traffic(device="cpu", planted_at=4, calls=6):
    """calls views (transposed, every other column, three rows in: strides
    and an offset of their own) of fresh random tensors; the view of call
    planted_at holds one value whose silu the candidate gets wrong. Returns
    the views, and the planted one's index."""
    g = torch.Generator().manual_seed(0)
    views = []
    for i in range(calls):
        base = (torch.randn(40, 70, generator=g) * 0.5).to(device)
        x = base.t()[3:, ::2]
        if i == planted_at:
            x[5, 7] = 9.0
        views.append(x)
    return views, (5, 7)


def silu_shadowed(us, op, views, report):
    """understudy enabled with op shadowing aten::silu (its report at
    report), and silu called on each view; the caller disables it."""
    us.enable(shadow(op, report))
    for x in views:
        torch.nn.functional.silu(x)


def replay_cli(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "UNDERSTUDY_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python-shim")] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return subprocess.run([sys.executable, "-m", "understudy", "repro", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


def only_route(rep):
    (r,) = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "aten::silu"]
    return r


def check_kept(rep, views, planted, at, device="cpu"):
    """The kept call is exactly the planted one: its argument's layout and
    values, production's and the candidate's values where they differ."""
    x = views[at]
    r = only_route(rep)
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "mismatch" and ev["output"] == "result 0" and ev["shadow_call"] == at + 1
    kept = r["shadow"]["repro"]
    assert kept["candidate"]["id"] == "torch_op:ust_repro::silu_saturating"
    call = kept["call"]
    assert (call["op"], call["overload"], call["reason"], call["output"]) == ("aten::silu", "", "mismatch", "result 0")
    assert call["device"] == ("cpu" if device == "cpu" else f"cuda:{x.device.index or 0}")
    (arg,) = call["args"]
    t = arg["tensor"]
    assert (arg["name"], t["dtype"], t["shape"], t["stride"], t["storage_offset"]) == \
        ("self", "float32", list(x.shape), list(x.stride()), x.storage_offset())
    back = repro.tensor(t, "cpu")
    assert back.stride() == x.stride() and back.storage_offset() == x.storage_offset()
    assert torch.equal(back, x.cpu())
    # the shape key is bucketed; the kept call and the evidence are exact
    assert ev["shape"] == list(x.shape) and "M=" in r["key"]
    flat = planted[0] * x.shape[1] + planted[1]
    assert call["first_mismatch"] == flat == ev["first_mismatch"]["flat_index"]
    (out,) = call["outputs"]
    want = torch.nn.functional.silu(x.cpu().double()).reshape(-1)
    differ = {w["flat_index"]: w for w in out["worst"]}
    assert flat in differ and len(differ) == int((want > THRESHOLD).sum())
    for i, w in differ.items():
        assert w["candidate"] == THRESHOLD
        assert w["production"] == pytest.approx(want[i].item(), rel=1e-6)


def test_a_failing_call_is_kept_whole_and_replays_in_a_fresh_process(us, tmp_path, candidates):
    path, mod = candidates
    views, planted = traffic()
    report = tmp_path / "report.json"
    silu_shadowed(us, mod.SATURATING, views, report)
    us.disable()
    rep = load_report(report)
    check_kept(rep, views, planted, at=4)
    # another process, the report and the candidate's module alone: the guard fails it again, the same way
    r = replay_cli(report, "--import", path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kept verdict mismatch in result 0; replayed: mismatch in result 0 (1 of 1340 elements" in r.stdout
    assert r.stdout.rstrip().endswith("; reproduced"), r.stdout
    listed = replay_cli(report, "--list")
    assert listed.returncode == 0 and listed.stdout.startswith(only_route(rep)["key"] + ": mismatch in result 0")


def test_a_merge_keeps_the_kept_call_of_the_earliest_rollback(us, tmp_path, candidates):
    """Two processes' reports of one route, one keeping a failing call: the
    merged report keeps it, and it replays from the merged report."""
    path, mod = candidates
    views, planted = traffic()
    report = tmp_path / "report.json"
    silu_shadowed(us, mod.SATURATING, views, report)
    us.disable()
    rep = load_report(report)
    other = json.loads(json.dumps(rep))
    other["pid"] += 1
    sh = only_route(other)["shadow"]
    sh["repro"] = None
    sh["rollback"]["unix_ms"] += 1000  # a later rollback, without a kept call
    (tmp_path / "other.json").write_text(json.dumps(other))
    merged = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, "-m", "understudy", "merge", merged, report, tmp_path / "other.json"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           [str(ROOT / "python-shim")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p])))
    assert r.returncode == 0, r.stderr
    m = load_report(merged)
    assert only_route(m)["shadow"]["repro"] == only_route(rep)["shadow"]["repro"]
    check_kept(m, views, planted, at=4)
    res = replay_cli(merged, "--import", path)
    assert res.returncode == 0 and res.stdout.rstrip().endswith("; reproduced"), res.stdout + res.stderr


def test_a_replay_with_a_corrected_candidate_says_it_is_not_reproduced(us, tmp_path, candidates):
    path, mod = candidates
    views, _ = traffic()
    report = tmp_path / "report.json"
    silu_shadowed(us, mod.SATURATING, views, report)
    us.disable()
    fixed = json.dumps(shadow(mod.RIGHT))
    r = replay_cli(report, "--import", path, "--config", fixed)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "replayed: passed (1 verified); NOT reproduced" in r.stdout
    # in this process the same replay returns the verdicts side by side
    out = repro.replay(load_report(report), config=json.loads(fixed))
    assert out["same"] is False and out["replayed"]["failed"] == 0 and out["replayed"]["verified"] == 1
    assert out["kept"] == {"reason": "mismatch", "output": "result 0"}


def test_calls_over_the_bound_keep_the_evidence_alone(us, candidates):
    _, mod = candidates
    views, _ = traffic(planted_at=0, calls=1)
    nbytes = 40 * 70 * 4  # the view spans nearly all of its storage
    for bound, kept in ((nbytes // 2, False), (0, False), (4 * nbytes, True)):
        us.enable(shadow(mod.SATURATING, repro_bytes=bound))
        torch.nn.functional.silu(views[0])
        rep = us.report()
        us.disable()
        sh = only_route(rep)["shadow"]
        assert sh["rollback"]["reason"] == "mismatch"
        assert (sh["repro"] is not None) == kept, (bound, sh["repro"])
    with pytest.raises(repro.ReproError, match="keeps no failing call"):
        repro.pick({"operators": []})


def test_a_call_while_its_thread_allocates_to_a_graph_pool_keeps_no_tensor(us, candidates):
    """torch.compile's CUDA graph trees warm up with the thread's allocations
    routed to the graph's pool, then hold that every block alive there is an
    output they know: between ust_pool_alloc_begun and ust_pool_alloc_ended
    a failing call keeps its evidence, not its tensors. The count is the
    thread's own."""
    import threading
    _, mod = candidates
    lib = us._load()
    views, _ = traffic(planted_at=0, calls=1)
    for in_pool in (True, False):
        us.enable(shadow(mod.SATURATING))
        if in_pool:
            assert lib.ust_pool_alloc_begun() == 1
            other = []
            t = threading.Thread(target=lambda: other.append(lib.ust_pool_alloc_begun()))
            t.start()
            t.join()
            assert other == [1]  # that thread's first, not this one's second
        torch.nn.functional.silu(views[0])
        if in_pool:
            assert lib.ust_pool_alloc_ended() == 0 and lib.ust_pool_alloc_ended() == 0
        rep = us.report()
        us.disable()
        sh = only_route(rep)["shadow"]
        assert sh["rollback"]["reason"] == "mismatch" and sh["rollback"]["shadow_call"] == 1
        assert (sh["repro"] is None) == in_pool, (in_pool, sh["repro"])


def test_a_passing_route_keeps_nothing_and_repro_says_so(us, tmp_path, candidates):
    _, mod = candidates
    report = tmp_path / "report.json"
    silu_shadowed(us, mod.RIGHT, traffic()[0], report)
    us.disable()
    assert only_route(load_report(report))["shadow"]["repro"] is None
    r = replay_cli(report)
    assert r.returncode == 2 and "repro: the report keeps no failing call" in r.stderr, r.stderr


RMS_MODULE = """
import torch
lib = torch.library.Library("_C", "FRAGMENT")
lib.define("rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float eps) -> ()")

def rms_norm(out, input, weight, eps):
    xf = input.float()
    out.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))

lib.impl("rms_norm", rms_norm, "CPU")
"""


def test_a_native_candidate_replays_from_the_report_alone(us, tmp_path):
    """A native candidate wrong in its last element: the kept call holds the
    written argument as it was before the call (not production's result),
    the input and the float argument; a fresh process that defines the op
    (as vLLM's _C does) replays it with the library the report names."""
    inputs = rms_inputs(shapes=((7, 128),))
    (x, w), = inputs
    report = tmp_path / "report.json"
    cfg = {"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu_wrong_tail")}},
           "defaults": {"key_every": 1}, "report": {"interval_s": 0, "path": str(report)}}
    us.enable(cfg)
    out = torch.full_like(x, 0.25)
    torch.ops._C.rms_norm(out, x, w, 1e-6)
    us.disable()
    r = [s for o in load_report(report)["operators"] for s in o["shapes"]][0]
    call = r["shadow"]["repro"]["call"]
    names = [a["name"] for a in call["args"]]
    assert names == ["out", "input", "weight", "eps"]
    args = {a["name"]: a for a in call["args"]}
    assert torch.equal(repro.tensor(args["out"]["tensor"]), torch.full_like(x, 0.25))  # before the call
    assert torch.equal(repro.tensor(args["input"]["tensor"]), x)
    assert torch.equal(repro.tensor(args["weight"]["tensor"]), w)
    assert args["eps"]["value"] == pytest.approx(1e-6) and args["eps"]["type"] == "float"
    assert call["output"] == "out" and call["first_mismatch"] == x.numel() - 1
    assert r["shadow"]["repro"]["candidate"]["id"].startswith("sha256:")
    module = tmp_path / "vllm_like_ops.py"
    module.write_text(textwrap.dedent(RMS_MODULE))
    res = replay_cli(report, "--import", module)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kept verdict mismatch in out; replayed: mismatch in out (1 of 896 elements" in res.stdout


DEFINITION = {
    "name": "silu_n20", "op_type": "activation", "description": "SiLU over rows of 20",
    "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 20}},
    "inputs": {"x": {"shape": ["M", "N"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["M", "N"], "dtype": "float32"}},
    "reference": "import torch\n\ndef run(x):\n    return torch.nn.functional.silu(x)\n",
}


def test_the_kept_call_exports_as_a_flashinfer_bench_workload(us, tmp_path, candidates):
    """The failing call as a workload of a Definition (input 'x' is silu's
    'self'): flashinfer_bench's TraceSet loads the folder, and its
    load_safetensors gives back the call's input."""
    try:
        from flashinfer_bench.bench.utils import load_safetensors
        from flashinfer_bench.data import TraceSet
    except ImportError as e:
        if os.environ.get("CI"):
            pytest.fail(f"flashinfer-bench is not installed: {e}")
        pytest.skip(f"flashinfer-bench is not installed: {e}")
    _, mod = candidates
    views, _ = traffic()
    report = tmp_path / "report.json"
    silu_shadowed(us, mod.SATURATING, views, report)
    us.disable()
    (tmp_path / "def.json").write_text(json.dumps(DEFINITION))
    out = tmp_path / "dataset"
    r = replay_cli(report, "--workload", out, "--definition", tmp_path / "def.json", "--arg", "x=self")
    assert r.returncode == 0, r.stdout + r.stderr
    ts = TraceSet.from_path(str(out))
    (trace,) = ts.workloads["silu_n20"]
    assert trace.workload.axes == {"M": 67}
    got = load_safetensors(ts.definitions["silu_n20"], trace.workload, out)
    assert torch.equal(got["x"], views[4])
    # a Definition the call does not fit is refused, naming why
    bad = dict(DEFINITION, axes={"M": {"type": "var"}, "N": {"type": "const", "value": 64}})
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = replay_cli(report, "--workload", tmp_path / "bad-out", "--definition", tmp_path / "bad.json", "--arg", "x=self")
    assert r.returncode == 2 and "fixes axis 'N' at 64; the call has 20" in r.stderr, r.stderr


@pytest.mark.gpu
def test_a_failing_cuda_call_is_kept_and_replays_on_the_gpu(us, tmp_path, candidates):
    """The same on a CUDA device: the kept argument is the candidate's own
    copy, read when the report is written (after the call returned and the
    caller changed its tensor), and the replay runs on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    path, mod = candidates
    views, planted = traffic(device="cuda")
    report = tmp_path / "report.json"
    silu_shadowed(us, mod.SATURATING, views, report)
    # as the candidate saw them: the same layouts, the values before the caller changes one
    kept_before = [v._base.clone().as_strided(v.shape, v.stride(), v.storage_offset()) for v in views]
    views[4].fill_(-1.0)  # the caller reuses its tensor: the kept call is the one the candidate saw
    us.disable()
    check_kept(load_report(report), kept_before, planted, at=4, device="cuda")
    r = replay_cli(report, "--import", path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "on cuda:0: kept verdict mismatch in result 0; replayed: mismatch in result 0" in r.stdout
