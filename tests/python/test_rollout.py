"""Canary and live: candidates serve per shape key, are promoted on evidence
and rolled back on the first verified mismatch; modes persist across restarts.

Ground truth: counters inside the production kernel and the candidate (a
Python op each, defined here), which say which arm really ran, and the
values each arm computes (the candidate's differ from production's in the
last bits, within tolerance, so a served tensor tells its arm).
"""
import json
import threading
from collections import Counter

import pytest
import torch

import understudy
from conftest import clocked
from test_shadow import candidate_op

_lib = torch.library.Library("ust_rollout", "DEF")
_lib.define("scale(Tensor x) -> Tensor")
RUNS = Counter()
WRONG = {"after": None}  # the candidate goes wrong after this many of its runs


def production(x):
    RUNS["production"] += 1
    return x * 2


def candidate_value(x):
    return x * 2 * (1 + 2 ** -12)  # within fp32's tolerance, and never bit-equal to production


def _candidate(x):
    RUNS["candidate"] += 1
    if WRONG["after"] is not None and RUNS["candidate"] > WRONG["after"]:
        return x * 2 + 1
    return candidate_value(x)


for _key in ("CPU", "CUDA"):
    _lib.impl("scale", production, _key)

PROBLEM = {"schema_version": 1, "operator": "scale", "description": "x * 2, defined by the test",
           "bindings": [{"op": "ust_rollout::scale", "key": {"M": "rows(x)", "N": "x[-1]"}}]}


@pytest.fixture
def problems(tmp_path):
    d = tmp_path / "problems"
    d.mkdir()
    (d / "scale.json").write_text(json.dumps(PROBLEM))
    RUNS.clear()
    WRONG["after"] = None
    return d


def config(mode="shadow", sample=1.0, **extra):
    op = {"mode": mode, "sample": sample, "candidate": {"torch_op": cand(), "target": "ust_rollout::scale"}}
    op.update(extra)
    return {"operators": {"scale": op}, "report": {"interval_s": 0}}


def cand():
    return candidate_op("ust_rollout_cand::scale", _candidate, "ust_rollout::scale")


def route(rep):
    (op,) = rep["operators"]
    (r,) = op["shapes"]
    return r


def calls(n, x):
    return [torch.ops.ust_rollout.scale(x) for _ in range(n)]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def calls_until(mode, x, batch=10, limit=400):
    """Calls in batches until the route is in mode (verdicts on a GPU arrive
    through the worker: each batch is flushed). Returns the served arms."""
    arms = []
    while len(arms) < limit:
        arms += [arm_of(y, x) for y in calls(batch, x)]
        understudy.flush()
        if route(understudy.report())["rollout"]["mode"] == mode:
            return arms
    raise AssertionError(f"not {mode} after {limit} calls")


def arm_of(y, x):
    if torch.equal(y, x * 2):
        return "production"
    if torch.equal(y, candidate_value(x)):
        return "candidate"
    return "neither"


@pytest.mark.parametrize("device", DEVICES)
def test_promoted_through_canary_to_live(us, problems, device):
    x = torch.randn(8, 64, device=device)
    us.enable(config(sample=0.5, promotion={"min_verified": 4, "min_speedup": 0, "canary": 0.5}), problems=problems)
    arms = calls_until("live", x)
    r = route(us.report())
    ro = r["rollout"]
    assert ro["mode"] == "live" and ro["transitions"] == 2
    assert ro["last_transition"]["from"] == "canary" and ro["last_transition"]["by"] == "policy"
    # the report's arm of every call agrees with the values the caller got
    assert r["calls"] == len(arms) and "neither" not in arms
    assert (arms.count("production"), arms.count("candidate")) == (ro["served"]["production"], ro["served"]["candidate"])
    # production ran for the calls it served, for each verification of the candidate and for
    # the A/A checks of shadow calls
    assert RUNS["production"] == ro["served"]["production"] + ro["served"]["candidate_verified"] + \
        r["shadow"]["aa"]["runs"]
    assert RUNS["candidate"] == ro["served"]["candidate"] + r["shadow"]["calls"] - ro["served"]["candidate_verified"]
    # live: the candidate serves every call; production runs only for the sampled half
    before = dict(RUNS)
    arms = [arm_of(y, x) for y in calls(20, x)]
    understudy.flush()
    assert arms == ["candidate"] * 20
    assert RUNS["candidate"] - before["candidate"] == 20
    assert RUNS["production"] - before["production"] == 10
    r = route(us.report())
    assert r["shadow"]["failed"] == 0 and r["rollout"]["promotion"]["state"] == "live"


def test_wrong_after_n_calls_rolls_back_at_first_verified_mismatch(us, problems):
    x = torch.randn(4, 32)
    WRONG["after"] = 7
    us.enable(config(mode="live", sample=0.5), problems=problems)
    arms = [arm_of(y, x) for y in calls(20, x)]
    # call 1 qualifies the candidate on copies (production serves it); calls
    # 2-7 correct; call 8 is not verified (every second served call is) and
    # serves the wrong value; call 9 is verified: rolled back, and the call
    # itself gets production's result; production serves from then on
    assert arms[0] == "production"
    assert arms[1:7] == ["candidate"] * 6
    assert arms[7] == "neither"
    assert arms[8:] == ["production"] * 12
    r = route(us.report())
    assert r["mode"] == "rolled_back" and r["rollout"]["mode"] == "rolled_back"
    ev = r["shadow"]["rollback"]
    assert ev["reason"] == "mismatch" and ev["while_serving"] is True and ev["served_before_verdict"] == 0
    assert r["rollout"]["served"] == {"production": 13, "candidate": 6 + 1, "candidate_verified": 3,
                                      "unlearned": 0}
    assert RUNS["candidate"] == 9


@pytest.mark.parametrize("device", DEVICES)
def test_too_little_traffic_keeps_collecting(us, problems, device):
    x = torch.randn(2, 16, device=device)
    us.enable(config(promotion={"min_verified": 50, "min_speedup": 0}), problems=problems)
    assert [arm_of(y, x) for y in calls(10, x)] == ["production"] * 10
    ro = route(us.report())["rollout"]
    assert ro["mode"] == "shadow" and ro["transitions"] == 0
    assert ro["promotion"]["state"] == "collecting" and ro["promotion"]["passes_in_stage"] == 10
    assert ro["promotion"]["needed"] == 50


@pytest.mark.parametrize("device", DEVICES)
def test_dry_run_changes_nothing_served(us, problems, device):
    x = torch.randn(2, 16, device=device)
    us.enable(config(promotion={"min_verified": 3, "min_speedup": 0, "dry_run": True}), problems=problems)
    assert [arm_of(y, x) for y in calls(10, x)] == ["production"] * 10
    ro = route(us.report())["rollout"]
    assert ro["mode"] == "shadow" and ro["transitions"] == 0 and ro["served"]["candidate"] == 0
    assert ro["promotion"]["state"] == "dry_run" and "would move to canary" in ro["promotion"]["note"]


def test_a_speed_gate_out_of_reach_keeps_testing(us, problems):
    """min_speedup far out of reach: the stage's paired samples are kept and
    judged, and six of them cannot decide anything yet (the sequence for the
    median has no ends before enough samples agree)."""
    x = torch.randn(2, 16)
    us.enable(config(promotion={"min_verified": 3, "min_speedup": 1e9}), problems=problems)
    calls(6, x)
    ro = route(us.report())["rollout"]
    assert ro["mode"] == "shadow" and ro["promotion"]["state"] == "testing"
    t = ro["promotion"]["test"]
    assert t["samples"] == 6 and t["ratio_lower"] is None and t["ratio_upper"] is None and t["ratio_median"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_restart_restores_the_state_file(us, problems, tmp_path, device):
    state = tmp_path / "rollout.json"
    x, z = torch.randn(3, 8, device=device), torch.randn(5, 8, device=device)
    WRONG["after"] = 0
    cfg = config(sample=1.0) | {"state": {"path": str(state)}}
    us.enable(cfg, problems=problems)
    calls(1, z)  # shadowed: the always-wrong candidate is rolled back on this key
    understudy.flush()
    key = route(us.report())["key"]
    xkey = key.replace("M=5", "M=3")
    understudy.set_mode(key=xkey, mode="live")  # a key not seen yet
    us.disable()
    saved = json.loads(state.read_text())["routes"]
    assert saved[key]["mode"] == "rolled_back" and "mismatch" in saved[key]["reason"]
    assert saved[xkey]["mode"] == "live"

    RUNS.clear()
    WRONG["after"] = None
    us.enable(cfg | {"operators": {"scale": cfg["operators"]["scale"] | {"sample": 0.0}}}, problems=problems)
    # restored live, the candidate qualifies again in this process (on copies,
    # production serving) before it serves; a GPU's verdict is in after a flush
    arms = [arm_of(y, x) for y in calls(1, x)]
    understudy.flush()
    arms += [arm_of(y, x) for y in calls(1, x)]
    assert arms == ["production", "candidate"] and RUNS["production"] == 1
    assert arm_of(calls(1, z)[0], z) == "production" and RUNS["candidate"] == 2
    rep = us.report()
    by_key = {s["key"]: s for s in rep["operators"][0]["shapes"]}
    assert by_key[xkey]["rollout"]["mode"] == "live" and by_key[xkey]["rollout"]["last_transition"]["by"] == "state"
    assert by_key[key]["mode"] == "rolled_back" and by_key[key]["shadow"]["rollback"]["reason"] == "restored"


def test_a_bad_state_file_is_refused(us, problems, tmp_path):
    state = tmp_path / "rollout.json"
    state.write_text(json.dumps({"schema": "understudy.state v1", "routes": {"k|x": {"mode": "warp"}}}))
    with pytest.raises(understudy.ConfigError, match="'routes.k\\|x.mode' must be a mode"):
        us.enable(config() | {"state": {"path": str(state)}}, problems=problems)
    assert not understudy.is_enabled()


@pytest.mark.parametrize("device", DEVICES)
def test_mode_changes_under_four_threads_keep_exact_counts(us, problems, device):
    x = torch.randn(4, 32, device=device)
    us.enable(config(sample=0.5), problems=problems)
    calls(1, x)
    key = route(us.report())["key"]
    arms = []
    changed = threading.Event()
    started = threading.Barrier(5)

    def worker():
        started.wait()
        mine = []
        while not changed.is_set() or len(mine) < 50:
            mine.append(arm_of(torch.ops.ust_rollout.scale(x), x))
        arms.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    modes = [("live", None), ("canary", 0.3), ("shadow", None), ("observe", None)]
    started.wait()
    for i in range(200):
        m, p = modes[i % len(modes)]
        understudy.set_mode(key=key, mode=m, canary=p)
    changed.set()
    for t in threads:
        t.join()
    understudy.flush()
    r = route(us.report())
    ro = r["rollout"]
    assert "neither" not in arms
    assert r["calls"] == 1 + len(arms)
    # the first call (observe) was production's
    assert (arms.count("production") + 1, arms.count("candidate")) == (ro["served"]["production"],
                                                                       ro["served"]["candidate"])
    # production also runs again for the A/A checks of shadow calls (1 in 32 by default)
    assert RUNS["production"] == ro["served"]["production"] + ro["served"]["candidate_verified"] + \
        r["shadow"]["aa"]["runs"]
    assert RUNS["candidate"] == ro["served"]["candidate"] + r["shadow"]["calls"] - ro["served"]["candidate_verified"]
    assert r["shadow"]["verified"] == r["shadow"]["passed"] == r["shadow"]["calls"]
    assert ro["transitions"] == 200


def test_reload_changes_modes_and_refuses_other_fields(us, problems):
    x = torch.randn(2, 8)
    cfg = config(mode="shadow")
    us.enable(cfg, problems=problems)
    assert arm_of(calls(1, x)[0], x) == "production"
    cfg["operators"]["scale"]["mode"] = "live"
    understudy.reload(cfg)
    assert arm_of(calls(1, x)[0], x) == "candidate"
    changed = json.loads(json.dumps(cfg))
    changed["operators"]["scale"]["candidate"]["torch_op"] = "ust_rollout_cand::other"
    changed["operators"]["scale"]["mode"] = "observe"  # reloadable, but the reload is refused as a whole
    with pytest.raises(understudy.ConfigError, match="'operators.scale.candidate.torch_op' differs"):
        understudy.reload(changed)
    with pytest.raises(understudy.ConfigError, match="'max_routes' differs"):
        understudy.reload(json.loads(json.dumps(cfg)) | {"max_routes": 7, "operators": changed["operators"] | {
            "scale": cfg["operators"]["scale"] | {"mode": "observe"}}})
    assert arm_of(calls(1, x)[0], x) == "candidate"  # nothing applied
    key = route(us.report())["key"]
    cfg["operators"]["scale"]["routes"] = {key: {"mode": "canary", "canary": 0.5}}
    understudy.reload(cfg)
    ro = route(us.report())["rollout"]
    assert ro["mode"] == "canary" and ro["canary"] == pytest.approx(0.5)


def test_native_candidate_serves_live_in_place(us):
    from test_shadow import native, rms_inputs, run_rms_norm
    inputs = rms_inputs(shapes=((6, 128), (2, 256)))
    expected = run_rms_norm(inputs, repeat=1)
    us.enable({"operators": {"rms_norm": {"mode": "live", "sample": 0.5, "candidate": native("rms_norm_cpu")}},
               "report": {"interval_s": 0}})
    served = run_rms_norm(inputs, repeat=4)
    rep = us.report()
    rs = [s for s in rep["operators"][0]["shapes"] if s["op"] == "_C::rms_norm"]
    assert len(rs) == 2
    for r in rs:
        # the first call qualifies the candidate on copies; of the three it
        # serves, every second is verified
        assert r["rollout"]["served"]["candidate"] == 3 and r["rollout"]["served"]["production"] == 1
        assert r["rollout"]["qualified"] is True
        assert r["shadow"]["passed"] == 2 and r["shadow"]["failed"] == 0
    for i, y in enumerate(served):
        torch.testing.assert_close(y, expected[i % 2], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_live_candidate_is_what_a_cuda_graph_replays(us, problems):
    x = torch.randn(16, 256, device="cuda")
    us.enable(config(mode="live", sample=0.0), problems=problems)
    calls(1, x)  # qualifies the candidate on copies; its verdict is in after a flush
    understudy.flush()
    assert route(us.report())["rollout"]["qualified"] is True
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.ops.ust_rollout.scale(x)
    x.copy_(torch.randn(16, 256, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert arm_of(y, x) == "candidate"
    key = route(us.report())["key"]
    understudy.set_mode(key=key, mode="observe")
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        y2 = torch.ops.ust_rollout.scale(x)
    g2.replay()
    torch.cuda.synchronize()
    assert arm_of(y2, x) == "production"
    r = route(us.report())
    ro = r["rollout"]
    assert ro["captured"] == {"production": 1, "candidate": 1}
    # captures serve nothing themselves: served counts the one call outside
    # them, production's while the candidate qualified
    assert r["calls"] == 3 and ro["served"]["candidate"] == 0 and ro["served"]["production"] == 1


@pytest.mark.gpu
def test_cuda_wrong_after_n_strict_serves_production(us, problems):
    x = torch.randn(64, 512, device="cuda")
    WRONG["after"] = 3
    us.enable(config(mode="live", sample=1.0, strict=True), problems=problems)
    arms = [arm_of(y, x) for y in calls(1, x)]  # qualifies on copies, production serving
    understudy.flush()
    arms += [arm_of(y, x) for y in calls(7, x)]
    assert arms == ["production"] + ["candidate"] * 2 + ["production"] * 5
    r = route(us.report())
    assert r["mode"] == "rolled_back" and r["shadow"]["rollback"]["served_before_verdict"] == 0
    assert r["rollout"]["served"]["candidate"] == 2


def test_native_candidate_outputs_take_the_learned_layout(us):
    """A native candidate whose result is a return value: its outputs are laid
    out like production's, from this call's production run when verified,
    else from the layout learned for the call's input shapes; a call whose
    shapes have not been seen with production yet is served by production."""
    from test_shadow import native
    us.enable({"operators": {"silu": {"mode": "live", "sample": 0.5, "candidate": native("silu_cpu")}},
               "report": {"interval_s": 0}})
    x = torch.randn(6, 40)
    z = torch.randn(5, 40)  # the same shape key (M is bucketed), another signature
    seq = (x, x, x, z, z, z)
    served = [torch.nn.functional.silu(v) for v in seq]
    rep = us.report()
    us.disable()
    (r,) = [s for s in rep["operators"][0]["shapes"] if s["op"] == "aten::silu"]
    sv = r["rollout"]["served"]
    # call 1 qualifies the candidate on copies and learns x's layout; of the
    # served calls every second is verified; call 4 is the first with z's
    # shapes and unverified: production serves it (and its layout is learned)
    assert sv == {"production": 2, "candidate": 4, "candidate_verified": 2, "unlearned": 1}
    assert r["shadow"]["passed"] == 3 and r["shadow"]["failed"] == 0
    for y, v in zip(served, seq):
        want = torch.nn.functional.silu(v)
        assert y.shape == want.shape and y.stride() == want.stride()
        torch.testing.assert_close(y, want, atol=1e-6, rtol=1e-5)


_lib.define("addinto(Tensor(a!) x, Tensor y) -> ()")


def _addinto(x, y):
    RUNS["production"] += 1
    x.add_(y)


_lib.impl("addinto", _addinto, "CPU")


def _with_addinto(problems):
    (problems / "addinto.json").write_text(json.dumps({
        "schema_version": 1, "operator": "addinto",
        "bindings": [{"op": "ust_rollout::addinto", "writes": ["x"], "key": {"M": "rows(x)", "N": "x[-1]"}}]}))
    return problems


def test_aa_sampling_with_a_serving_candidate(us, problems):
    """A/A runs belong to shadow calls; a call the candidate serves unverified has none."""
    x = torch.randn(4, 8)
    us.enable(config(mode="live", sample=0.5, guard={"aa_sample": 0.5}), problems=problems)
    assert [arm_of(y, x) for y in calls(7, x)] == ["production"] + ["candidate"] * 6  # it qualifies first
    r = route(us.report())
    assert r["shadow"]["aa"]["runs"] == 0 and r["rollout"]["served"]["candidate_verified"] == 3
    understudy.set_mode(key=r["key"], mode="shadow")
    before = RUNS["production"]
    assert [arm_of(y, x) for y in calls(6, x)] == ["production"] * 6
    r = route(us.report())
    # in shadow mode the A/A sample runs production a second time, as before the fix
    assert r["shadow"]["aa"]["runs"] > 0
    assert RUNS["production"] - before == 6 + r["shadow"]["aa"]["runs"]


def test_candidate_op_not_defined_yet_waits_and_production_serves_once(us, problems):
    """A live torch-op candidate whose op this process does not define (yet):
    resolved at enable, it is reported as waiting for its op; each call is
    production's, run once (an in-place op run twice would add twice), and
    nothing counts as an internal error."""
    us.enable({"operators": {"addinto": {"mode": "live", "sample": 1.0,
                                         "candidate": {"torch_op": "ust_rollout_missing::addinto",
                                                       "target": "ust_rollout::addinto"}}},
               "report": {"interval_s": 0}}, problems=_with_addinto(problems))
    x, y = torch.zeros(2, 4), torch.ones(2, 4)
    torch.ops.ust_rollout.addinto(x, y)
    rep = us.report()
    assert torch.equal(x, torch.ones(2, 4)) and RUNS["production"] == 1
    assert rep["totals"]["internal_errors"] == 0
    assert route(rep)["rollout"]["served"]["production"] == 1
    (op,) = rep["operators"]
    assert op["candidate"]["op_state"] == "waiting for op" and op["candidate"]["calls_waiting_for_op"] == 1


def test_concurrent_failing_verifications_each_serve_production(us, problems):
    """Every call is verified (sample 1) and the candidate is always wrong:
    whichever thread's verdict rolled the route back, each call's own failed
    verdict gives it production's result."""
    import time as _time
    WRONG["after"] = 0
    slow = candidate_op("ust_rollout_cand::slow_wrong",
                        lambda x: (_time.sleep(0.002), x * 2 + 1)[1], "ust_rollout::scale")
    x = torch.randn(64, 64)
    wrong = 0
    for _ in range(10):
        us.enable({"operators": {"scale": {"mode": "live", "sample": 1.0,
                                           "candidate": {"torch_op": slow, "target": "ust_rollout::scale"}}},
                   "report": {"interval_s": 0}}, problems=problems)
        out = []
        barrier = threading.Barrier(4)

        def worker():
            barrier.wait()
            out.append(torch.ops.ust_rollout.scale(x))

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wrong += sum(arm_of(y, x) != "production" for y in out)
        us.disable()
    assert wrong == 0


def test_reload_keeps_a_rollback(us, problems):
    x = torch.randn(4, 8)
    WRONG["after"] = 0
    cfg = config(mode="observe", sample=1.0)
    us.enable(cfg, problems=problems)
    calls(1, x)
    key = route(us.report())["key"]
    cfg["operators"]["scale"]["routes"] = {key: "live"}
    understudy.reload(cfg)
    assert arm_of(calls(1, x)[0], x) == "production"  # verified, wrong: rolled back, production served
    assert route(us.report())["rollout"]["mode"] == "rolled_back"
    cfg["operators"]["scale"]["strict"] = True  # an unrelated change
    understudy.reload(cfg)
    assert route(us.report())["rollout"]["mode"] == "rolled_back"
    assert arm_of(calls(1, x)[0], x) == "production"


def test_passes_of_one_stage_do_not_count_for_the_next(us, problems):
    """Four threads, promotion after one pass with a 1 % canary: shadow passes
    concluding after the move to canary must not promote it to live."""
    x = torch.randn(64, 64)
    for _ in range(20):
        us.enable(config(promotion={"min_verified": 1, "min_speedup": 0, "canary": 0.01}), problems=problems)
        barrier = threading.Barrier(4)

        def worker():
            barrier.wait()
            calls(3, x)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ro = route(us.report())["rollout"]
        assert ro["mode"] == "canary" or ro["served"]["candidate"] > 0
        us.disable()


def test_a_saved_mode_belongs_to_its_candidate(us, problems, tmp_path):
    """A restart with another candidate does not inherit the promotion (or
    the rollback) of the one before: the route starts from its operator's mode."""
    state = tmp_path / "rollout.json"
    x = torch.randn(3, 8)
    cfg = config(mode="observe", sample=0.0) | {"state": {"path": str(state)}}
    us.enable(cfg, problems=problems)
    calls(1, x)
    key = route(us.report())["key"]
    understudy.set_mode(key=key, mode="live")
    assert [arm_of(y, x) for y in calls(2, x)] == ["production", "candidate"]  # it qualifies, then serves
    us.disable()
    assert json.loads(state.read_text())["routes"][key]["candidate"] == "torch_op:" + cand()
    other = candidate_op("ust_rollout_cand::other", candidate_value, "ust_rollout::scale")
    cfg["operators"]["scale"]["candidate"] = {"torch_op": other, "target": "ust_rollout::scale"}
    us.enable(cfg, problems=problems)
    assert arm_of(calls(1, x)[0], x) == "production"
    assert route(us.report())["rollout"]["mode"] == "observe"
    us.disable()
    cfg["operators"]["scale"]["candidate"] = {"torch_op": cand(), "target": "ust_rollout::scale"}
    us.enable(cfg, problems=problems)  # the candidate it was promoted with: restored
    assert [arm_of(y, x) for y in calls(2, x)] == ["production", "candidate"]
    assert route(us.report())["rollout"]["mode"] == "live"


def test_set_mode_errors_name_what_is_wrong(us, problems):
    us.enable(config(), problems=problems)
    with pytest.raises(understudy.UnderstudyError, match="not a bound dispatcher op"):
        understudy.set_mode(key="ust_rollout::nope|cpu|f32|M=1,N=1", mode="live")
    with pytest.raises(understudy.UnderstudyError, match="canary share 1.5 is not in"):
        understudy.set_mode(key="ust_rollout::scale|cpu|f32|M=1,N=1", mode="canary", canary=1.5)
    with pytest.raises(understudy.UnderstudyError, match="mode 'warp' is not one of"):
        understudy.set_mode(key="ust_rollout::scale|cpu|f32|M=1,N=1", mode="warp")
    with pytest.raises(ValueError, match="needs canary"):
        understudy.set_mode(key="ust_rollout::scale|cpu|f32|M=1,N=1", mode="canary")
    us.disable()
    us.enable({"operators": {"scale": "observe"}, "report": {"interval_s": 0}}, problems=problems)
    with pytest.raises(understudy.UnderstudyError, match="has no candidate"):
        understudy.set_mode("scale", "live")
    with pytest.raises(understudy.UnderstudyError, match="no candidate targeting it"):
        understudy.set_mode(key="ust_rollout::scale|cpu|f32|M=1,N=1", mode="canary", canary=0.5)


SLOW_SPENT = []


def _slow_candidate(x):
    """The candidate that takes 2 ms a call (production: microseconds); the
    time it really spent is the test's own record."""
    import time
    t0 = time.perf_counter_ns()
    time.sleep(0.002)
    y = candidate_value(x)
    SLOW_SPENT.append(time.perf_counter_ns() - t0)
    return y


def test_a_live_routes_device_time_counts_its_candidates_time(us, problems):
    """A live route's served calls ran the candidate, not production: the
    route's device time (est_device_time_ns, which the operators' weights
    share) counts them at the candidate's time; so do a report merged from
    it and the recent window. Ground truth: the time the candidate spent
    inside its calls, by its own clock; production, the route's only other
    arm, runs in microseconds. Every call is verified (sample 1), so the
    candidate's timed runs are the calls the test timed. The estimate lies
    between bounds that hold however slowly the machine runs: each later
    call's timed figure at least the candidate's own time, and at most what
    the test's clock measured around the call."""
    from understudy.merge import merge
    SLOW_SPENT.clear()
    slow = candidate_op("ust_rollout_slow::scale", _slow_candidate, "ust_rollout::scale")
    us.enable({"operators": {"scale": {"mode": "live", "sample": 1.0,
                                       "candidate": {"torch_op": slow, "target": "ust_rollout::scale"}}},
               "report": {"interval_s": 0, "window_s": 3600}}, problems=problems)
    x = torch.randn(8, 64)
    n = 40
    around = sum(clocked(calls, 1, x) for _ in range(n))
    understudy.flush()
    rep = us.report()
    r = route(rep)
    served = r["rollout"]["served"]["candidate"]
    assert served == n - 1, r["rollout"]  # the first call qualified it on copies, production serving
    assert len(SLOW_SPENT) == n  # each call ran it once: served, or on copies
    assert r["latency_ns"]["p50"] < min(SLOW_SPENT)  # production: microseconds
    # The estimate counts the calls the candidate served at the mean of its
    # timed runs (each one at least its own time: 39 times its shortest at
    # least) and the one production served at production's estimate; both
    # arms of each call ran inside the test's clock around it (at most).
    est = r["est_device_time_ns"]
    lo, hi = served * min(SLOW_SPENT), around
    assert lo <= est <= hi, (lo, est, hi)
    assert route(merge([rep]))["est_device_time_ns"] == pytest.approx(est, rel=1e-9)
    # before the worker's first window boundary the window spans everything since enable
    assert rep["window"]["totals"]["est_device_time_ns"] == pytest.approx(est, rel=1e-9)
