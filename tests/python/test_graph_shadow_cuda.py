"""Shadow captured into CUDA graphs (guard/graph.c): a shadowed route's call
captured with torch.cuda.graph carries its shadow into the graph, behind
conditional nodes that its gate opens for the sampled share of replays, or,
beside the chain of a graph the host gates, started by the host behind the
replays that verify it; the comparisons' statistics come back through the
device's ring and are judged as eager calls' are. Ground truth: the same calls captured without
understudy (outputs bit-equal), the share rule counted here, and the
candidate's known wrong tail. Skipped only where torch sees no CUDA device."""

import pytest
import torch

from test_shadow import _rms, candidate_op, native, rms_inputs, routes, shadow_config

pytestmark = pytest.mark.gpu  # needs a CUDA device (conftest.py skips it without one)

SHAPES = ((1, 4096), (8, 4096), (3, 5, 128))


def _capture(inputs):
    """A graph of one _C::rms_norm call per input, into outputs it owns;
    returns (graph, outputs)."""
    outs = [torch.empty_like(x) for x, _ in inputs]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for o, (x, w) in zip(outs, inputs):
            torch.ops._C.rms_norm(o, x, w, 1e-6)
    return g, outs


def _replays(inputs, graphs, n, seed=0):
    """n rounds: fresh values into the inputs, then each graph replayed;
    yields each round's outputs per graph (cloned)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for _ in range(n):
        for x, _ in inputs:
            x.copy_(torch.randn(x.shape, device="cuda", generator=gen, dtype=x.dtype))
        got = []
        for g, outs in graphs:
            g.replay()
            got.append([o.clone() for o in outs])
        yield got


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a, b))


def _hits(n, share):
    """The replays among 1..n that a share verifies, by the rule of
    base/share.h recomputed here: replay i is verified when floor(i*q) >
    floor((i-1)*q), q the share in units of 2^-32 (all: 2^32)."""
    q = 1 << 32 if share >= 1 else int(share * (1 << 32))
    return sum((i * q) >> 32 > ((i - 1) * q) >> 32 for i in range(1, n + 1))


def _replayed_beside_plain(us, inputs, config, n):
    """The calls captured without understudy and again under config, both
    replayed n times with outputs bit-equal; the report after them."""
    plain = _capture(inputs)
    us.enable(config)
    shadowed = _capture(inputs)
    for a, b in _replays(inputs, [plain, shadowed], n):
        assert _same(a, b)
    _settle(us)
    rep = us.report()
    us.disable()
    return rep


def _settle(us):
    """The replays so far judged, and every gate written from its route now
    (a flush does both)."""
    torch.cuda.synchronize()
    us.flush()


@pytest.mark.parametrize("sample,launch,gate", [(1.0, "conditional", "replay"), (0.25, "conditional", "replay"),
                                               (1.0, "device", "replay"), (1.0, "conditional", "device"),
                                               (1.0, "device", "device"), (0.25, "device", "device"),
                                               (1.0, "conditional", "replay-kernel"),
                                               (0.25, "conditional", "replay-kernel")])
def test_captured_shadow_verifies_its_share_of_replays(us, sample, launch, gate):
    """Beside the chain, each call's shadow started: by the host behind the
    replays it verifies (shadow.graph_gate replay, the default: no node of
    it in the graph), or behind its kernel in the chain in those replays
    (shadow.graph_host_start kernel: an event record node off that kernel);
    decided on the device, by its kernel in the chain through an IF node
    (the default) or launched from the device (asked for while the host
    gates: started by the host all the same)."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=SHAPES)
    plain = _capture(inputs)  # without understudy
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["operators"]["rms_norm"]["sample"] = sample
    gate, _, start = gate.partition("-")
    cfg["shadow"] = {"graph_beside_launch": launch, "graph_gate": gate, "graph_host_start": start or "replay"}
    us.enable(cfg)
    shadowed = _capture(inputs)
    _settle(us)  # the gates open
    n = 200
    for a, b in _replays(inputs, [plain, shadowed], n):
        assert _same(a, b)
    _settle(us)
    rep = us.report()
    us.disable()
    rs = routes(rep, "_C::rms_norm")
    assert len(rs) == len(SHAPES)
    want = _hits(n, sample)
    for r in rs:
        sh = r["shadow"]
        assert r["captured"] == 1 and sh["graph"] == {"shadowed": 1, "plain": 0, "beside": 1, "ungated": 0, "exposed": 0,
                                                      "reason": None}
        assert r["graph"]["status"] == "gated", r["graph"]  # (unseen kernels need the kernel tracer: the test with it below)
        assert (sh["verified"], sh["passed"], sh["failed"]) == (want, want, 0), sh
        assert sh["skipped_by"]["capture"] == 0 and r["mode"] == "shadow"
    figs, hosted = rep["graphs"], gate == "replay"
    assert figs["launched"] == (len(SHAPES) if launch == "device" and not hosted else 0), figs
    assert figs["refused"] == 0
    assert (figs["gated"], figs["gated_replays"]) == ((len(SHAPES), n) if hosted else (0, 0)), figs
    assert (figs["hosted"], figs["host_starts"]) == ((len(SHAPES), len(SHAPES) * want) if hosted else (0, 0)), figs
    print(f"sample {sample}, {launch}, {gate}: {n} replays, {want} verified per route (of {len(rs)} routes), "
          "all passed")


def test_wrong_tail_rolls_back_at_its_first_verified_replay(us):
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((64, 1024),))
    plain = _capture(inputs)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda_wrong_tail")))
    shadowed = _capture(inputs)  # no eager call first: that would roll the route back before capture
    _settle(us)
    rounds = _replays(inputs, [plain, shadowed], 40)
    a, b = next(rounds)  # one replay, judged before the next
    assert _same(a, b)
    _settle(us)
    first = us.report()
    for a, b in rounds:  # the gate is closed: production alone
        assert _same(a, b)
    _settle(us)
    after = us.report()
    us.disable()
    (r,) = routes(first, "_C::rms_norm")
    sh = r["shadow"]
    assert r["mode"] == "rolled_back" and (sh["verified"], sh["failed"]) == (1, 1), sh
    ev = sh["rollback"]
    assert ev["reason"] == "mismatch" and ev["output"] == "out" and ev["shadow_call"] == 1
    assert ev["while_serving"] is False  # shadow: production served that replay
    assert ev["first_mismatch"]["index"] == [63, 1023]
    (later,) = routes(after, "_C::rms_norm")
    assert later["shadow"]["verified"] == 1 and later["mode"] == "rolled_back"


def test_mode_change_closes_and_reopens_the_gate(us):
    """Observe closes every captured site's gate from the next replay on;
    shadow again reopens it: the graph is not captured again."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    shadowed = _capture(inputs)
    counts = []
    for mode in ("shadow", "observe", "shadow"):
        us.set_mode("rms_norm", mode)
        _settle(us)
        for _ in _replays(inputs, [shadowed], 30):
            pass
        _settle(us)
        (r,) = routes(us.report(), "_C::rms_norm")
        counts.append(r["shadow"]["verified"])
    us.disable()
    assert counts == [30, 30, 60]


def test_torch_op_candidate_leaves_production_alone_in_the_graph(us):
    name = candidate_op("ust_graph::rms_norm_torch", lambda out, x, w, eps: out.copy_(_rms(x, w, eps)),
                        "_C::rms_norm")
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    rep = _replayed_beside_plain(us, inputs, shadow_config("rms_norm", {"torch_op": name, "target": "_C::rms_norm"}), 5)
    (r,) = routes(rep, "_C::rms_norm")
    sh = r["shadow"]
    assert sh["graph"]["shadowed"] == 0 and sh["graph"]["plain"] == 1
    assert sh["graph"]["reason"].startswith("a torch-op candidate")
    assert sh["skipped_by"]["capture"] == 1 and sh["verified"] == 0


def test_a_candidate_failing_at_capture_rolls_back_and_production_serves(us):
    """A weight in float32 under a bfloat16 input: production computes it,
    the candidate refuses it (its dtypes differ). Refused while captured,
    that is a verified failure with its evidence, as in an eager call; the
    graph holds production alone."""
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.float32)
    rep = _replayed_beside_plain(us, [(x, w)], shadow_config("rms_norm", native("rms_norm_cuda")), 10)
    (r,) = routes(rep, "_C::rms_norm")
    sh = r["shadow"]
    assert r["mode"] == "rolled_back" and (sh["verified"], sh["failed"]) == (1, 1), sh
    assert sh["graph"] == {"shadowed": 0, "plain": 1, "beside": 0, "ungated": 0, "exposed": 0,
                           "reason": "the candidate failed while it was captured"}
    assert r["graph"]["status"] == "observe-only", r["graph"]
    assert r["graph"]["reason"] == "1 captured calls hold production alone: the candidate failed while it was captured"
    ev = sh["rollback"]
    assert ev["message"].startswith("while captured into a CUDA graph: ") and "dtype" in ev["message"], ev
    assert rep["graphs"]["live"] == 0


def test_disable_closes_every_gate(us):
    """Replays after disable run production alone: the next enable harvests
    the device's ring, where a replay of an open gate would have left an
    entry naming no site of its own (graphs.unknown)."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    us.enable(cfg)
    shadowed = _capture(inputs)
    _settle(us)
    for _ in _replays(inputs, [shadowed], 10):
        pass
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    assert r["shadow"]["verified"] == 10
    us.disable()
    for _ in _replays(inputs, [shadowed], 10):
        pass
    torch.cuda.synchronize()
    us.enable(cfg)
    _settle(us)
    figs = us.report()["graphs"]
    us.disable()
    assert figs == {"sites": 0, "live": 0, "open": 0, "unknown": 0, "lost": 0, "launched": 0, "refused": 0,
                    "gated": 0, "gated_replays": 0, "gate_failed": 0, "hosted": 0, "host_starts": 0,
                    "unseen": 0}, figs


def _gate_kernel_runs(inputs, graphs, n):
    """n rounds of _replays under torch.profiler: the runs of the sites'
    kernels in the chain (gate_snap) its records name, and whether every
    round's outputs were bit-equal between the graphs."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        equal = all(_same(*r) if len(r) == 2 else True for r in _replays(inputs, graphs, n))
        torch.cuda.synchronize()
    runs = sum(e.count for e in prof.key_averages() if "gate_snap" in e.key)
    return runs, equal


@pytest.mark.parametrize("gate", ["replay", "device"])
def test_replays_gated_from_the_host_run_the_kernel_in_the_chain_only_to_verify(us, gate):
    """shadow.graph_gate replay (the default): before each replay of a
    torch.cuda.CUDAGraph the host enables a site's kernel in the chain only
    when the replay verifies (torch.profiler counts that kernel's runs:
    sample 0.25, 64 replays, 3 sites: 3 x 16 runs, against 3 x 64 when the
    device decides), and the replays verified are the same share. The
    graph holds no conditional node for them: the host starts each site's
    body after the replays that verify it (graphs.hosted, host_starts);
    decided on the device, an IF node in the graph starts it."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=SHAPES)
    plain = _capture(inputs)
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["operators"]["rms_norm"]["sample"] = 0.25
    cfg["shadow"] = {"graph_gate": gate}
    us.enable(cfg)
    shadowed = _capture(inputs)
    _settle(us)
    n = 64
    runs, equal = _gate_kernel_runs(inputs, [plain, shadowed], n)
    _settle(us)
    rep = us.report()
    us.disable()
    want = _hits(n, 0.25)
    rs = routes(rep, "_C::rms_norm")
    assert equal and len(rs) == len(SHAPES)
    for r in rs:
        assert r["shadow"]["graph"]["beside"] == 1 and (r["shadow"]["verified"], r["shadow"]["failed"]) == (want, 0)
    figs = rep["graphs"]
    if gate == "replay":
        assert (figs["gated"], figs["gated_replays"], figs["gate_failed"]) == (len(SHAPES), n, 0), figs
        assert (figs["hosted"], figs["host_starts"]) == (len(SHAPES), len(SHAPES) * want), figs
        assert runs == len(SHAPES) * want, runs
    else:
        assert (figs["gated"], figs["gated_replays"], figs["hosted"], figs["host_starts"]) == (0, 0, 0, 0), figs
        assert runs == len(SHAPES) * n, runs
    print(f"graph_gate {gate}: {n} replays, the kernels in the chain ran {runs} times, {want} verified per route")


def _capture_one(inputs, **kw):
    outs = [torch.empty_like(x) for x, _ in inputs]
    g = torch.cuda.CUDAGraph(**kw)
    with torch.cuda.graph(g):
        for o, (x, w) in zip(outs, inputs):
            torch.ops._C.rms_norm(o, x, w, 1e-6)
    return g, outs


def test_graphs_are_kept_while_a_native_candidate_is_configured(us):
    """Observe only: graphs made meanwhile are torch's own (not kept, no raw
    graph). A candidate configured: a graph made without keep_graph is kept
    (its raw graph answers) and instantiated at capture_end, as torch would
    have; after disable, graphs are torch's own again."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    us.enable({"operators": {"rms_norm": {"mode": "observe"}}})
    g, _ = _capture_one(inputs)
    with pytest.raises(RuntimeError):
        g.raw_cuda_graph()
    us.disable()
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    g, _ = _capture_one(inputs)
    assert all(_raw(g))  # read past the hooks: the graph is not handed out
    g.replay()
    torch.cuda.synchronize()
    _settle(us)
    assert us.report()["graphs"]["gated"] == 1
    us.disable()
    g, _ = _capture_one(inputs)
    with pytest.raises(RuntimeError):
        g.raw_cuda_graph()


def test_a_graph_captured_again_after_reset_gates_only_its_own_shadows(us):
    """Captured again in observe (no shadow) after reset(), the object's new
    graph, which may get the old one's address, gates nothing (the old
    shadows are of another capture) and replays production alone; in
    shadow again, its own new shadow is gated."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    outs = [torch.empty_like(x) for x, _ in inputs]
    g = torch.cuda.CUDAGraph()

    def capture():
        with torch.cuda.graph(g):
            for o, (x, w) in zip(outs, inputs):
                torch.ops._C.rms_norm(o, x, w, 1e-6)
    capture()
    _settle(us)
    assert us.report()["graphs"]["gated"] == 1
    g.reset()
    us.set_mode("rms_norm", "observe")
    capture()
    runs, _ = _gate_kernel_runs(inputs, [(g, outs)], 5)
    _settle(us)
    figs = us.report()["graphs"]
    assert runs == 0 and figs["gated"] == 0, (runs, figs)
    g.reset()
    us.set_mode("rms_norm", "shadow")
    capture()
    _settle(us)
    runs, _ = _gate_kernel_runs(inputs, [(g, outs)], 5)
    _settle(us)
    figs = us.report()["graphs"]
    us.disable()
    assert runs == 5 and figs["gated"] == 1 and figs["gate_failed"] == 0, (runs, figs)


def test_a_graph_its_owner_keeps_is_gated_once_its_owner_instantiates_it(us):
    """CUDAGraph(keep_graph=True): capture_end leaves it uninstantiated, as
    its owner asked; gated from its owner's instantiate() on. Instantiated
    again, the new executable is gated in the old one's place (its own
    count of replays: the share rule from its first replay); reset, none
    is."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["operators"]["rms_norm"]["sample"] = 0.5
    us.enable(cfg)
    g, outs = _capture_one(inputs, keep_graph=True)
    assert us.report()["graphs"]["gated"] == 0  # left to its owner to instantiate
    g.instantiate()
    _settle(us)
    runs, _ = _gate_kernel_runs(inputs, [(g, outs)], 20)
    _settle(us)
    rep = us.report()
    g.instantiate()  # again: a new executable graph
    again, _ = _gate_kernel_runs(inputs, [(g, outs)], 7)
    _settle(us)
    rep2 = us.report()
    g.reset()
    rep3 = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    assert r["shadow"]["verified"] == 10 and runs == 10, (r["shadow"], runs)
    assert (rep["graphs"]["gated"], rep["graphs"]["gated_replays"]) == (1, 20), rep["graphs"]
    (r2,) = routes(rep2, "_C::rms_norm")
    assert again == _hits(7, 0.5) == 3 and r2["shadow"]["verified"] == 13, (again, r2["shadow"])
    assert (rep2["graphs"]["gated"], rep2["graphs"]["gated_replays"]) == (1, 27), rep2["graphs"]
    assert rep3["graphs"]["gated"] == 0, rep3["graphs"]


def test_a_kept_graph_torch_instantiates_at_its_first_replay_is_gated_from_the_next(us):
    """CUDAGraph(keep_graph=True) replayed without instantiate(): torch
    instantiates it at its first replay, which no one gated (its shadow,
    started by the host, does not run: 0 verified); every replay after it is
    gated and verified (sample 1), outputs bit-equal to a graph without
    understudy."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    plain = _capture(inputs)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    g, outs = _capture_one(inputs, keep_graph=True)
    equal = all(_same(a, b) for a, b in _replays(inputs, [plain, (g, outs)], 9))
    _settle(us)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    assert equal and (r["shadow"]["verified"], r["shadow"]["failed"]) == (8, 0), r["shadow"]
    figs = rep["graphs"]
    assert (figs["gated"], figs["gated_replays"], figs["hosted"], figs["host_starts"]) == (1, 8, 1, 8), figs


def _raw(g):
    """g's raw handles (graph, executable graph) taken as a C++ library
    takes them (at::cuda::CUDAGraph), past understudy's hooks: nothing
    handed out as far as understudy can see."""
    cls = torch.cuda.CUDAGraph
    return tuple(getattr(f, "__wrapped__", f)(g) for f in (cls.raw_cuda_graph, cls.raw_cuda_graph_exec))


def _hit(i, share):
    """Replay i (from 1) is in the share, by the rule _hits counts."""
    return _hits(i, share) > _hits(i - 1, share)


def _served_by_candidate(a, b):
    """A replay's outputs against production's: the candidate rounds the
    normalised value to bfloat16 before the weight multiply, production
    after it, so on random rows of 4096 its outputs differ from production's
    in some elements (bit for bit) and agree within bfloat16's rounding."""
    if _same(a, b):
        return False
    for p, q in zip(a, b):
        torch.testing.assert_close(q.float(), p.float(), rtol=2e-2, atol=2e-2)
    return True


def _serve_config(mode, lib="rms_norm_cuda", **extra):
    cfg = shadow_config("rms_norm", native(lib))
    cfg["operators"]["rms_norm"].update(mode=mode, **extra)
    return cfg


def test_a_shadow_captured_beside_the_chain_only_verifies(us):
    """A route in shadow when captured gets its shadow beside the chain
    (graph.beside): every replay verified, as in the chain; set live, its
    replays are still verified but production serves them (outputs
    bit-equal to a graph captured without understudy). A call whose copies
    would keep more than shadow.graph_beside_max_mb (1 here) is captured
    in the chain instead and, set live, serves the candidate."""
    # M=8 would keep about 0.4 MiB, M=256 about 6 MiB
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096), (256, 4096)))
    plain = _capture(inputs)
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["shadow"] = {"graph_beside_max_mb": 1}
    us.enable(cfg)
    shadowed = _capture(inputs)
    for a, b in _replays(inputs, [plain, shadowed], 20):
        assert _same(a, b)
    _settle(us)
    rs = {r["dims"]["M"]: r for r in routes(us.report(), "_C::rms_norm")}
    assert rs[8]["shadow"]["graph"]["beside"] == 1 and rs[256]["shadow"]["graph"]["beside"] == 0, rs
    assert all(r["shadow"]["graph"]["shadowed"] == 1 and r["shadow"]["verified"] == 20 for r in rs.values()), rs
    us.set_mode("rms_norm", "live")
    _settle(us)
    rounds = list(_replays(inputs, [plain, shadowed], 10, seed=1))
    _settle(us)
    rs = {r["dims"]["M"]: r for r in routes(us.report(), "_C::rms_norm")}
    us.disable()
    assert all(torch.equal(a[0], b[0]) for a, b in rounds)  # beside: production served
    assert all(_served_by_candidate([a[1]], [b[1]]) for a, b in rounds)  # in the chain: the candidate
    assert all((r["shadow"]["verified"], r["shadow"]["failed"]) == (30, 0) for r in rs.values()), rs


def test_canary_serves_its_share_of_replays_and_live_every_one(us):
    """canary 0.25: before the candidate qualifies, every replay is verified
    on copies with production serving; the pass qualifies it, and from the
    next replay it serves exactly the replays the share rule picks (the
    site's replay count, from 1), each verified at sample 1; live serves
    every replay; observe gives every replay back to production. One
    capture throughout."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    plain = _capture(inputs)
    us.enable(_serve_config("canary", canary=0.25))
    shadowed = _capture(inputs)
    _settle(us)
    (a, b), = [next(_replays(inputs, [plain, shadowed], 1))]
    assert _same(a, b)  # qualifying: production serves
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    assert (r["mode"], r["shadow"]["verified"], r["shadow"]["passed"]) == ("canary", 1, 1), r["shadow"]
    served = [_served_by_candidate(a, b) for a, b in _replays(inputs, [plain, shadowed], 200, seed=1)]
    want = [_hit(i, 0.25) for i in range(2, 202)]
    assert served == want and sum(want) == 50
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    sh = r["shadow"]
    assert (sh["verified"], sh["passed"], sh["failed"]) == (51, 51, 0), sh
    us.set_mode("rms_norm", "live")
    _settle(us)
    assert all(_served_by_candidate(a, b) for a, b in _replays(inputs, [plain, shadowed], 50, seed=2))
    us.set_mode("rms_norm", "observe")
    _settle(us)
    assert not any(_served_by_candidate(a, b) for a, b in _replays(inputs, [plain, shadowed], 20, seed=3))
    _settle(us)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    sh = r["shadow"]
    assert (sh["verified"], sh["passed"], sh["failed"]) == (101, 101, 0), sh
    assert r["captured"] == 1 and sh["graph"] == {"shadowed": 1, "plain": 0, "beside": 0, "ungated": 0, "exposed": 0,
                                                      "reason": None}
    print(f"canary 0.25: {sum(served)} of 200 replays served by the candidate; live: 50 of 50; observe: 0 of 20")


def test_a_mismatch_under_live_replays_rolls_back_from_the_next_replay(us):
    """A candidate that saturates its results at 8 serves live replays while
    every result is within that (weights of a quarter); weights grown 8 times
    make its results wrong: the replay that shows it is verified (it has
    served), the route rolls back, and the replays after serve production."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 4096, generator=g).to(device="cuda", dtype=torch.bfloat16)
    w = (0.25 * torch.randn(4096, generator=g)).to(device="cuda", dtype=torch.bfloat16)
    inputs = [(x, w)]
    plain = _capture(inputs)
    us.enable(_serve_config("live", lib="rms_norm_cuda_saturates"))
    shadowed = _capture(inputs)
    _settle(us)
    for _ in _replays(inputs, [plain, shadowed], 1):
        pass  # qualifies on copies
    _settle(us)
    assert all(_served_by_candidate(a, b) for a, b in _replays(inputs, [plain, shadowed], 10, seed=1))
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    assert r["mode"] == "live" and (r["shadow"]["verified"], r["shadow"]["failed"]) == (11, 0), r["shadow"]
    w.mul_(8)
    (a, b), = [next(_replays(inputs, [plain, shadowed], 1, seed=2))]
    assert not _same(a, b)  # the wrong results served once
    _settle(us)
    after = [_same(a, b) for a, b in _replays(inputs, [plain, shadowed], 10, seed=3)]
    _settle(us)
    rep = us.report()
    us.disable()
    assert all(after)
    (r,) = routes(rep, "_C::rms_norm")
    sh = r["shadow"]
    assert r["mode"] == "rolled_back" and (sh["verified"], sh["failed"]) == (12, 1), sh
    assert sh["rollback"]["reason"] == "mismatch" and sh["rollback"]["output"] == "out"
    assert sh["rollback"]["while_serving"] is True  # that replay's entry says the candidate served it


def _compiled_rms_norm():
    """A step that calls _C::rms_norm (a mutating custom op) from inductor's
    generated code, under torch.compile(mode="reduce-overhead"), with fresh
    dynamo state; and its (8, 4096) bf16 inputs."""
    torch._dynamo.reset()

    def step(x, w):
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, w, 1e-6)
        return out

    (x, w), = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    return torch.compile(step, mode="reduce-overhead"), x, w


@pytest.mark.parametrize("beside_mb", [16, 0])
def test_reduce_overhead_graphs_hold_the_shadow_and_serve_live(us, beside_mb):
    """torch.compile(mode="reduce-overhead"): inductor calls _C::rms_norm
    (a mutating custom op) from its generated code; cudagraph trees warm
    up on the first call, record the second and replay every later one. The
    recorded call holds its shadow: every replay verified (sample 1), the
    outputs bit-equal to production's arithmetic run eagerly (the ground
    truth: the op's own implementation). Set live, the replays after are
    verified and, with the shadow in the chain (graph_beside_max_mb 0),
    served by the candidate, not captured again; beside the chain (the
    default for a route in shadow) production serves them (verify-only)."""
    fn, x, w = _compiled_rms_norm()
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["shadow"] = {"graph_beside_max_mb": beside_mb}
    us.enable(cfg)
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = 40
    for _ in range(n):
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen, dtype=x.dtype))
        assert torch.equal(fn(x, w), _rms(x, w, 1e-6))
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    sh = r["shadow"]
    eager = r["calls"] - r["captured"]  # the warm-up's calls, shadowed eagerly
    beside = 1 if beside_mb else 0
    assert r["captured"] == 1 and sh["graph"] == {"shadowed": 1, "plain": 0, "beside": beside, "ungated": 0, "exposed": 0,
                                                      "reason": None}, (r, sh)
    # each call ran rms_norm once: eagerly (the warm-up) or in a replay (the
    # recording is replayed for its outputs), and each of those is verified
    assert (sh["verified"], sh["passed"], sh["failed"]) == (n, n, 0), (eager, sh)
    us.set_mode("rms_norm", "live")
    _settle(us)
    m = 20
    for _ in range(m):
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen, dtype=x.dtype))
        y, want = fn(x, w).clone(), _rms(x, w, 1e-6)
        if beside:
            assert torch.equal(y, want)  # verify-only: production's
        else:
            assert not torch.equal(y, want)  # the candidate's rounding
            torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    us.disable()
    torch._dynamo.reset()
    assert r["captured"] == 1 and r["shadow"]["verified"] == n + m and r["mode"] == "live", r
    print(f"reduce-overhead ({'beside' if beside else 'chain'}): {eager} eager call(s), 1 captured, "
          f"{n + m - eager} replays verified; live served {0 if beside else m} of {m}")


def test_a_graph_trees_warm_up_keeps_no_shadow_tensor_in_the_graphs_pool(us):
    """torch.compile(mode="reduce-overhead") warms the function up with the
    thread's allocations routed to the graph's pool, and checks right after
    that every block alive there is an output it knows (inductor's slow-path
    assert, on by default). A shadow failing in the warm-up keeps its
    evidence but none of its tensors past the call (no repro of it), so the
    check holds whatever the worker's pace."""
    fn, x, w = _compiled_rms_norm()
    w.mul_(16)  # past the candidate's saturation: its first verification fails
    assert torch._inductor.config.triton.slow_path_cudagraph_asserts
    us.enable(_serve_config("shadow", lib="rms_norm_cuda_saturates"))
    for _ in range(6):
        assert torch.equal(fn(x, w), _rms(x, w, 1e-6))  # production's, the pool's check passed
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    us.disable()
    torch._dynamo.reset()
    sh = r["shadow"]
    # the first failure rolls it back: in the warm-up (one failure), or, in a
    # process whose graph trees record the function at once, from replays
    assert sh["failed"] >= 1 and sh["rollback"]["reason"] == "mismatch", sh
    assert sh["repro"] is None, sh["repro"]


def test_an_out_argument_needs_no_copy_before_production(us):
    """_C::rms_norm overwrites its out argument (problems/rms_norm.json):
    its captured call copies nothing before production, so each replay runs
    one gate kernel in the chain, not two (torch.profiler's kernel records
    count them: the shadow beside the chain's gate_snap)."""
    from torch.profiler import ProfilerActivity, profile
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    shadowed = _capture(inputs)
    _settle(us)
    n = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in _replays(inputs, [shadowed], n):
            pass
        torch.cuda.synchronize()
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    us.disable()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gates = sum(name.removeprefix("void ").startswith(("gate_kernel", "gate_snap")) for name in names)
    assert r["shadow"]["verified"] == n and gates == n, (gates, r["shadow"])


@pytest.mark.parametrize("correlation", ["callbacks", "records"])
def test_the_kernel_tracer_times_the_replays_of_a_shadowed_graph(us, correlation):
    """The kernel tracer (CUPTI) on while a shadowed call is captured and
    replayed inside a window: every replay verified, as without it, and
    every replay a replayed call of the route timed by production's kernel
    (the candidate's nodes are the shadow's, not the route's). Ground truth:
    the test's own replay count. (callbacks become records once torch's
    profiler has run in the process: either way the executable graph is
    found past the graphs the shadow's capture made.)"""
    from test_kernel_timer_cuda import mm_for
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    x = torch.randn(64, 64, device="cuda")
    cfg = shadow_config("rms_norm", native("rms_norm_cuda"))
    cfg["operators"]["gemm"] = {"mode": "observe", "sample": 1.0}
    cfg["timer"] = {"kind": "cupti", "budget": 0, "window_ms": 5000, "correlation": correlation}
    us.enable(cfg)
    mm_for(x, 1.0)  # GPU calls seen: the window (5 s) opens
    shadowed = _capture(inputs)  # the gate is written as the capture ends: no flush (it would close the window)
    n = 40
    for _ in _replays(inputs, [shadowed], n):
        pass
    _settle(us)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    print(f"\ntracer ({correlation}) and captured shadow: captured {r['captured']}, replayed {r['replayed']}, "
          f"kernel_timed {r['kernel_timed']}, verified {r['shadow']['verified']}; timer "
          f"{ {k: v for k, v in rep['timer'].items() if k not in ('unattributed', 'phases')} }")
    assert rep["timer"]["kind"] == "cupti", rep["timer"]
    assert r["captured"] == 1 and r["shadow"]["graph"]["shadowed"] == 1, r
    assert (r["shadow"]["verified"], r["shadow"]["passed"]) == (n, n), r["shadow"]
    assert (r["replayed"], r["kernel_timed"]) == (n, n), r
    # the shadow's bodies are understudy's own graphs: neither unknown nor unseen by any route
    tm = rep["timer"]
    assert tm["graph_own_kernels"] >= n and tm["graph_unknown_kernels"] == 0, tm
    assert r["graph"]["unseen_kernels"] == 0 and r["graph"]["status"] == "gated", r["graph"]


def live_changed_in_place():
    """A live route's call captured (kept graph) inside a kernel tracer's
    window (callbacks), served by the candidate, then its executable graph
    updated in place (cudaGraphExecUpdate from its own graph, a change CUDA
    accepts) and replayed again. Prints, as JSON, the replays served by the
    candidate before and after the change, whether the later ones equal the
    graph captured without understudy, and the route."""
    import ctypes
    import json
    import time
    import understudy
    from test_kernel_timer_cuda import _cudart, mm_for
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    plain = _capture(inputs)
    cfg = _serve_config("live")
    cfg["operators"]["gemm"] = {"mode": "observe", "sample": 1.0}
    cfg["timer"] = {"kind": "cupti", "budget": 0, "window_ms": 20000, "correlation": "callbacks"}
    understudy.enable(cfg)
    mm_for(torch.randn(64, 64, device="cuda"), 1.0)  # the window opens; no flush below: it would close it
    shadowed = _capture(inputs)

    def rounds(n, seed):
        out = list(_replays(inputs, [plain, shadowed], n, seed=seed))
        torch.cuda.synchronize()
        time.sleep(0.2)  # the worker judged them and wrote the gates (it polls every 2 ms)
        return out

    rounds(1, 0)  # verified with production serving: the pass qualifies the candidate
    before = sum(_served_by_candidate(a, b) for a, b in rounds(10, 1))
    info = (ctypes.c_byte * 64)()
    graph, exec_ = _raw(shadowed[0])  # past the hooks: only the tracer sees the change
    rc = _cudart().cudaGraphExecUpdate(exec_, graph, info)
    time.sleep(0.2)
    after = rounds(10, 2)
    rep = understudy.report()
    understudy.disable()
    (r,) = routes(rep, "_C::rms_norm")
    print(json.dumps({"rc": rc, "correlation": rep["timer"].get("correlation"), "before": before,
                      "after": sum(_served_by_candidate(a, b) for a, b in after),
                      "equal_after": sum(_same(a, b) for a, b in after),
                      "route": {"mode": r["mode"], "captured": r["captured"], "verified": r["shadow"]["verified"],
                                "failed": r["shadow"]["failed"], "exposed": r["shadow"]["graph"]["exposed"],
                                "graph": r["graph"]}}))


def test_a_live_route_changed_in_place_under_a_graph_serves_production_from_then_on():
    """A graph library's change in place of an executable graph holding a
    live route's captured call (live_changed_in_place, in a process of its
    own: callbacks need CUPTI's subscription, which torch's profiler, run
    by other tests here, keeps for the life of a process). Before it, every
    replay is served by the candidate (and verified); once the tracer's
    callbacks saw it, the route's replays run production alone: outputs
    bit-equal to the graph captured without understudy, nothing verified,
    the route observe-only naming the change. Ground truth: the plain
    graph's outputs and the update the test made, once."""
    import json
    import os
    import subprocess
    import sys
    from conftest import ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python-shim"), str(ROOT / "tests" / "python")]))
    out = subprocess.run([sys.executable, "-c", "import test_graph_shadow_cuda as t; t.live_changed_in_place()"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nlive route changed in place ({got['correlation']}): served by the candidate {got['before']} of 10 "
          f"replays before, {got['after']} of 10 after, bit-equal to the plain graph after {got['equal_after']} of 10; "
          f"route {got['route']}")
    assert got["rc"] == 0 and got["correlation"] == "callbacks", got
    r = got["route"]
    assert got["before"] == 10 and got["after"] == 0 and got["equal_after"] == 10, got
    assert r["mode"] == "live" and r["captured"] == 1 and r["failed"] == 0, r
    assert r["verified"] == 11, r  # the qualifying replay and the 10 served: none after the change
    assert r["graph"]["changed"] == 1 and r["graph"]["status"] == "observe-only", r["graph"]
    assert r["exposed"] == 0, r  # the handle was taken past the hooks: the tracer alone saw it


def test_strict_live_and_a_paused_shadow_under_replay(us):
    """strict: a replay cannot wait for its verdict, so a strict live
    route's replays are verified as in shadow with production serving
    (outputs bit-equal to the graph captured without understudy, every
    replay verified at sample 1). A shadowed route whose candidate went
    over its shadow budget after its capture (guard.max_slowdown, paused
    by eager calls) runs production alone in its replays from then on:
    nothing more verified. Ground truth: the plain graph's outputs and the
    replays the test ran."""
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    plain = _capture(inputs)
    us.enable(_serve_config("live", strict=True))
    strict = _capture(inputs)
    _settle(us)
    rounds = list(_replays(inputs, [plain, strict], 20))
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    us.disable()
    assert all(_same(a, b) for a, b in rounds)  # production served every replay
    sh = r["shadow"]
    assert r["mode"] == "live" and (sh["verified"], sh["passed"], sh["failed"]) == (20, 20, 0), sh

    # its kernel 64 times reads about 2-3x production's latency at M=8 (launch-bound): a budget of 1.25x
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda_slow"), guard={"max_slowdown": 1.25}))
    shadowed = _capture(inputs)
    _settle(us)
    assert all(_same(a, b) for a, b in _replays(inputs, [plain, shadowed], 5))
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    assert r["shadow"]["verified"] == 5 and "paused" not in r["shadow"], r["shadow"]
    (x, w), out = inputs[0], torch.empty_like(inputs[0][0])
    for _ in range(20):  # eager calls, shadowed and timed: the candidate (its kernel 64 times) is over the budget
        torch.ops._C.rms_norm(out, x, w, 1e-6)
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    paused_at = r["shadow"]["verified"]
    assert r["shadow"].get("paused", {}).get("reason") == "over the shadow budget", r["shadow"]
    assert all(_same(a, b) for a, b in _replays(inputs, [plain, shadowed], 20, seed=1))
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    us.disable()
    print(f"\nstrict live: 20 of 20 replays verified, production served; shadow paused after "
          f"{paused_at} verified: {r['shadow']['verified'] - paused_at} more in 20 replays")
    assert r["shadow"]["verified"] == paused_at and r["shadow"]["failed"] == 0, r["shadow"]


def test_a_second_executable_graph_of_a_capture_runs_production_alone(us):
    """A shadowed call's graph (kept, gated from the host) instantiated a
    second time out of torch's sight and bound: its site is gated by the
    first executable graph, whose replays' decisions and copies it would
    share, so in the second it is left out: its kernel disabled there
    (production alone, counted as ungated), the first verifying its
    replays as before. Ground truth: the graph captured without
    understudy, the replays the test ran, and torch.profiler's count of
    understudy's gate kernels in the second graph's launches."""
    import ctypes
    import understudy
    from torch.profiler import ProfilerActivity, profile
    from test_kernel_timer_cuda import _cudart
    inputs = rms_inputs("cuda", torch.bfloat16, shapes=((8, 4096),))
    plain, plain_outs = _capture(inputs)
    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    first, outs = _capture(inputs)
    _settle(us)
    rt = _cudart()
    rt.cudaGraphInstantiate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong]
    rt.cudaGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rt.cudaGraphExecDestroy.argtypes = [ctypes.c_void_p]
    second = ctypes.c_void_p()
    graph, _ = _raw(first)
    assert rt.cudaGraphInstantiate(ctypes.byref(second), graph, 0) == 0
    lib = understudy._load()
    assert lib.ust_graph_bind(graph, first._understudy_capture, second.value) == 0
    stream = torch.cuda.current_stream()
    gen = torch.Generator(device="cuda").manual_seed(0)
    (x, _), = inputs
    equal, n = 0, 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            x.copy_(torch.randn(x.shape, device="cuda", generator=gen, dtype=x.dtype))
            assert rt.cudaGraphLaunch(second, stream.cuda_stream) == 0
            got = outs[0].clone()
            plain.replay()
            equal += torch.equal(got, plain_outs[0])
        torch.cuda.synchronize()
    gates = sum(e.name.removeprefix("void ").startswith(("gate_kernel", "gate_snap"))
                for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    for a, b in _replays(inputs, [(plain, plain_outs), (first, outs)], n, seed=1):
        assert _same(a, b)
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    us.disable()
    torch.cuda.synchronize()
    assert rt.cudaGraphExecDestroy(second) == 0
    print(f"\nsecond executable graph: {equal} of {n} launches equal to the plain graph, {gates} gate kernels run; "
          f"the first: {r['shadow']['verified']} verified; ungated {r['shadow']['graph']['ungated']}")
    assert equal == n and gates == 0
    assert (r["shadow"]["verified"], r["shadow"]["failed"]) == (n, 0), r["shadow"]
    assert r["shadow"]["graph"]["ungated"] == 1 and r["graph"]["status"] == "observe-only", r


def test_a_graph_handed_out_runs_production_alone_in_its_replays(us):
    """Two live routes (M=8 and M=16), each captured in a graph of its own
    and served by the candidate; the M=8 graph's executable handle taken
    through torch's graph object, as a graph library would to change its
    kernels in place: from the next replay that graph runs production alone
    (bit-equal to the graph captured without understudy, nothing more
    verified), the route observe-only and saying why; the M=16 graph, not
    handed out, keeps serving the candidate. A shadowed route's graph
    (beside the chain, gated from the host) handed out the same way
    verifies nothing more. Ground truth: the plain graphs' outputs and the
    replays the test ran."""
    small, big = (rms_inputs("cuda", torch.bfloat16, shapes=((m, 4096),)) for m in (8, 16))
    plain_small, plain_big = _capture(small), _capture(big)
    us.enable(_serve_config("live"))
    live_small, live_big = _capture(small), _capture(big)
    _settle(us)

    def rounds(n, seed):
        """n replays of each graph: per live graph, replays served by the
        candidate and replays bit-equal to its plain graph."""
        got = list(zip(_replays(small, [plain_small, live_small], n, seed=seed),
                       _replays(big, [plain_big, live_big], n, seed=seed + 100)))
        _settle(us)
        return [(sum(_served_by_candidate(*r[k]) for r in got), sum(_same(*r[k]) for r in got)) for k in (0, 1)]

    rounds(1, 0)  # verified with production serving: the pass qualifies the candidate
    before = rounds(10, 1)
    exec_ = live_small[0].raw_cuda_graph_exec()  # handed out
    assert exec_ == _raw(live_small[0])[1]
    after = rounds(10, 2)
    rs = {r["dims"]["M"]: r for r in routes(us.report(), "_C::rms_norm")}
    us.disable()
    print(f"\nhanded out: M=8 served by the candidate in {before[0][0]} of 10 replays before, {after[0][0]} of 10 "
          f"after ({after[0][1]} bit-equal to the plain graph); M=16, not handed out: {before[1][0]} and "
          f"{after[1][0]}; verified {rs[8]['shadow']['verified']} and {rs[16]['shadow']['verified']}")
    assert before == [(10, 0), (10, 0)] and after == [(0, 10), (10, 0)], (before, after)
    assert (rs[8]["shadow"]["verified"], rs[16]["shadow"]["verified"]) == (11, 21), rs
    assert all(r["shadow"]["failed"] == 0 and r["mode"] == "live" for r in rs.values()), rs
    assert rs[8]["shadow"]["graph"]["exposed"] == 1 and rs[16]["shadow"]["graph"]["exposed"] == 0, rs
    assert rs[8]["graph"]["status"] == "observe-only" and rs[16]["graph"]["status"] == "gated", rs
    assert "raw handle was handed to code outside understudy" in rs[8]["graph"]["reason"], rs[8]["graph"]

    us.enable(shadow_config("rms_norm", native("rms_norm_cuda")))
    shadowed = _capture(small)
    _settle(us)
    assert all(_same(a, b) for a, b in _replays(small, [plain_small, shadowed], 5))
    _settle(us)
    (r,) = routes(us.report(), "_C::rms_norm")
    assert r["shadow"]["verified"] == 5 and r["shadow"]["graph"]["beside"] == 1, r["shadow"]
    shadowed[0].raw_cuda_graph()  # the graph itself handed out: cudaGraphExecUpdate from it changes the executable
    assert all(_same(a, b) for a, b in _replays(small, [plain_small, shadowed], 10, seed=1))
    _settle(us)
    rep = us.report()
    us.disable()
    (r,) = routes(rep, "_C::rms_norm")
    print(f"shadow beside the chain: 5 verified, then handed out: {r['shadow']['verified'] - 5} more in 10 replays; "
          f"gated replays {rep['graphs']['gated_replays']}")
    assert r["shadow"]["verified"] == 5 and r["shadow"]["graph"]["exposed"] == 1, r["shadow"]
    assert r["graph"]["status"] == "observe-only", r["graph"]
