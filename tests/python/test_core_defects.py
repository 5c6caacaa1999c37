"""Regressions of the core, each named after what went wrong and checked
against an independent ground truth: the same calls without understudy, or
arithmetic in the test."""
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import understudy
from conftest import ROOT, candidate_dir
from test_shadow import candidate_op

_lib = torch.library.Library("ust_defect", "DEF")
# vLLM's rotary_embedding writes query and key in place; both are views
# split out of one fused qkv, so neither is contiguous.
_lib.define("rotary(Tensor(a!) query, Tensor(b!) key, Tensor cos) -> ()")
_lib.define("accum(Tensor(a!) acc, Tensor x) -> ()")
_lib.define("ident(Tensor x) -> Tensor")
_lib.define("twice(Tensor x) -> Tensor")


def _rotary(query, key, cos):
    query.mul_(cos)
    key.mul_(cos)


def _accum(acc, x):
    # writes its first row, then refuses a negative input: a production op
    # that raises after writing part of its output
    acc[0] += x[0]
    if bool((x < 0).any()):
        raise ValueError("accum: negative input")
    acc[1:] += x[1:]


for _key in ("CPU", "CUDA"):
    _lib.impl("rotary", _rotary, _key)
    _lib.impl("accum", _accum, _key)
    _lib.impl("ident", lambda x: x.clone(), _key)
    _lib.impl("twice", lambda x: x * 2, _key)

PROBLEMS = {
    "rotary": {"bindings": [{"op": "ust_defect::rotary", "key": {"T": "query[0]"}}]},
    "accum": {"bindings": [{"op": "ust_defect::accum", "key": {"N": "acc[0]"}}]},
    "ident": {"bindings": [{"op": "ust_defect::ident", "key": {"N": "x[0]"}}]},
    "twice": {"bindings": [{"op": "ust_defect::twice", "key": {"N": "x[0]"}}]},
}


@pytest.fixture
def problems(tmp_path):
    d = tmp_path / "problems"
    d.mkdir()
    for name, body in PROBLEMS.items():
        (d / f"{name}.json").write_text(json.dumps({"schema_version": 1, "operator": name, **body}))
    return d


def only_route(rep, op):
    (o,) = [o for o in rep["operators"] if o["name"] == op]
    (r,) = o["shapes"]
    return r


def test_written_views_of_a_fused_tensor_are_judged_on_values(us, problems):
    """A correct candidate of an op that writes non-contiguous views (query
    and key split out of one qkv) was rolled back on "stride": snapshots were
    cloned contiguous and compared stride for stride."""
    def cand(query, key, cos):
        query.copy_(query * cos)
        key.copy_(key * cos)

    name = candidate_op("ust_defect_cand::rotary", cand, "ust_defect::rotary")
    us.enable({"operators": {"rotary": {"mode": "shadow", "sample": 1.0,
                                        "candidate": {"torch_op": name, "target": "ust_defect::rotary"}}},
               "report": {"interval_s": 0}}, problems=problems)
    g = torch.Generator().manual_seed(1)
    for t in (3, 5, 8):
        qkv = torch.randn(t, 3 * 16, generator=g)
        q, k = qkv[:, :16], qkv[:, 16:32]
        assert not q.is_contiguous() and not k.is_contiguous()
        cos = torch.rand(t, 16, generator=g)
        want = qkv.clone()
        want[:, :16] *= cos
        want[:, 16:32] *= cos
        torch.ops.ust_defect.rotary(q, k, cos)
        assert torch.equal(qkv, want)  # production served, untouched
    rep = us.report()
    sh = [s["shadow"] for o in rep["operators"] for s in o["shapes"]]
    assert len(sh) == 3
    assert all(s["passed"] == 1 and s["failed"] == 0 and s["rollback"] is None for s in sh), sh


def _accum_without_understudy(acc, x):
    acc = acc.clone()
    try:
        _accum(acc, x)
    except ValueError as e:
        return acc, str(e)
    return acc, None


@pytest.mark.parametrize("mode", ["live", "canary"])
def test_production_raising_on_snapshots_leaves_what_production_leaves(us, problems, mode):
    """Live/canary, verified: production runs on snapshots first. When it
    raised after writing part of them, the partly written snapshots were
    copied into the caller's arguments and production ran again on them: an
    accumulating op added twice. The caller must see what production alone
    leaves: its exception, its arguments as it left them."""
    def cand(acc, x):
        acc.add_(x)

    name = candidate_op("ust_defect_cand::accum", cand, "ust_defect::accum")
    op = {"mode": mode, "sample": 1.0, "candidate": {"torch_op": name, "target": "ust_defect::accum"}}
    if mode == "canary":
        op["canary"] = 0.5  # every second call is the candidate's (and verified)
    us.enable({"operators": {"accum": op}, "report": {"interval_s": 0}}, problems=problems)
    acc = torch.arange(12.0).reshape(3, 4)
    x = torch.full((3, 4), -1.0)
    for _ in range(4):
        want_acc, want_err = _accum_without_understudy(acc, x)
        assert want_err is not None
        with pytest.raises(Exception, match="negative input"):
            torch.ops.ust_defect.accum(acc, x)
        assert torch.equal(acc, want_acc), (acc, want_acc)
    # a call that does not raise is still served, and correctly
    x = torch.ones(3, 4)
    want_acc, _ = _accum_without_understudy(acc, x)
    torch.ops.ust_defect.accum(acc, x)
    assert torch.equal(acc, want_acc)


def test_fp8_dtypes_reach_native_candidates_exactly(us, problems):
    """Every fp8 dtype reached candidates as one {kDLFloat, 8} code. The
    candidate ABI's version 2 carries the exact dtype of every argument and
    output; a probe candidate says which one it saw."""
    probe = candidate_dir() / "libdtype_probe.so"
    us.enable({"operators": {"ident": {"mode": "shadow", "sample": 1.0, "candidate": understudy.native(probe)}},
               "report": {"interval_s": 0}}, problems=problems)
    want = {}
    for n, dt in enumerate([torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]):
        x = torch.zeros(n + 1, 4).to(dt)
        torch.ops.ust_defect.ident(x)
        want[n + 1] = {torch.float8_e4m3fn: 11, torch.float8_e5m2: 12, torch.float8_e4m3fnuz: 13,
                       torch.float8_e5m2fnuz: 14}[dt]
    rep = us.report()
    (o,) = [o for o in rep["operators"] if o["name"] == "ident"]
    seen = {int(s["dims"]["N"]): s["shadow"]["rollback"]["message"] for s in o["shapes"]}
    for n, code in want.items():
        assert seen[n].endswith(f"x {code}, out {code}"), (n, seen[n])


def test_candidate_abi_3_refuses_flags_it_does_not_know(us, problems):
    """The candidate ABI's version 3: reserved fields and undefined flag bits
    are 0; a descriptor with bits this library does not know (they may mean
    something later) is refused, naming them, and production keeps serving."""
    import ctypes
    lib = ctypes.CDLL(str(understudy.library_path()))
    lib.ust_candidate_abi_version.restype = ctypes.c_uint32
    lib.ust_abi_version.restype = ctypes.c_uint32
    assert lib.ust_candidate_abi_version() == 3 and lib.ust_abi_version() == 1
    bad = candidate_dir() / "libdtype_probe_unknown_flags.so"
    with pytest.raises(understudy.UnderstudyError, match=r"flags 0x6 and reserved 0: bits and fields"):
        us.enable({"operators": {"ident": {"mode": "shadow", "sample": 1.0, "candidate": understudy.native(bad)}}},
                  problems=problems)
    x = torch.zeros(2, 4)
    assert torch.equal(torch.ops.ust_defect.ident(x), x)


def test_a_canary_share_near_one_serves_nearly_every_call(us, problems):
    """(uint32_t)(p * 2^32 + 0.5) is out of range for p within 2^-33 of 1:
    the candidate's share of almost 1 became 0."""
    name = candidate_op("ust_defect_cand::twice", lambda x: x + x, "ust_defect::twice")
    us.enable({"operators": {"twice": {"mode": "canary", "canary": 1 - 2 ** -34, "sample": 0.0,
                                       "candidate": {"torch_op": name, "target": "ust_defect::twice"}}},
               "report": {"interval_s": 0}}, problems=problems)
    x = torch.ones(4)
    for _ in range(200):
        assert torch.equal(torch.ops.ust_defect.twice(x), x * 2)
    served = only_route(us.report(), "twice")["rollout"]["served"]
    assert served["candidate"] >= 199 and served["candidate"] + served["production"] == 200, served


def test_a_verdict_racing_a_manual_mode_change_ends_consistent(us, problems, tmp_path):
    """A verdict set the rollback flag under one lock and recorded it under
    another; a manual mode change in between could leave the route serving
    live while its row and the state file said rolled_back. One lock now
    decides both: whatever order they land in, the route, the report's last
    transition and the state file agree."""
    name = candidate_op("ust_defect_cand::twice_wrong", lambda x: x * 2 + 1, "ust_defect::twice")
    state = tmp_path / "state.json"
    us.enable({"operators": {"twice": {"mode": "live", "sample": 1.0,
                                       "candidate": {"torch_op": name, "target": "ust_defect::twice"}}},
               "state": {"path": str(state)}, "report": {"interval_s": 0}}, problems=problems)
    x = torch.ones(8)
    torch.ops.ust_defect.twice(x)
    key = only_route(us.report(), "twice")["key"]
    stop = threading.Event()
    errors = []

    def serve():
        try:
            while not stop.is_set():
                assert torch.equal(torch.ops.ust_defect.twice(x), x * 2)  # never the wrong candidate's
        except BaseException as e:  # noqa: BLE001  reported below
            errors.append(e)

    threads = [threading.Thread(target=serve) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(2000):
        us.set_mode(key=key, mode="live")
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    r = only_route(us.report(), "twice")
    assert r["mode"] == r["rollout"]["last_transition"]["to"], r["rollout"]
    us.disable()
    saved = json.loads(state.read_text())["routes"][key]
    assert saved["mode"] == r["mode"], (saved, r["mode"])


CHURN = textwrap.dedent("""
    import sys, threading, torch
    sys.path.insert(0, sys.argv[1])
    import understudy
    x = torch.randn(64)
    want = torch.nn.functional.silu(x)
    stop = threading.Event()
    bad = []
    def work():
        while not stop.is_set():
            try:
                if not torch.equal(torch.nn.functional.silu(x), want):
                    bad.append("wrong result")
            except BaseException as e:
                bad.append(repr(e))
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for _ in range(int(sys.argv[2])):
        understudy.enable({"operators": {"silu": "observe"}, "report": {"interval_s": 0}})
        understudy.disable()
    stop.set()
    for t in ts:
        t.join()
    print("errors", len(bad), bad[:3])
    sys.exit(1 if bad else 0)
""")


def test_enable_disable_under_traffic_never_breaks_a_call(tmp_path):
    """disable() freed bindings after a 1 ms sleep while threads could still
    be between the kernel lookup and the in-flight count, and torch's own
    (de)registration is not atomic against dispatching threads: processes
    crashed, or production calls raised "fallthrough_kernel was executed".
    Interceptors now stay registered for the life of the process; enable and
    disable switch them on and off."""
    script = tmp_path / "churn.py"
    script.write_text(CHURN)
    # The race showed in about one process in four (8 processes of 60 cycles
    # each, 2 at a time, on a 2-core machine).
    outs = []
    for _ in range(4):
        procs = [subprocess.Popen([sys.executable, str(script), str(ROOT / "python-shim"), "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
                 for _ in range(2)]
        outs += [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    for rc, out in outs:
        assert rc == 0, out[-2000:]
