"""Promotion decided by a sequential test on paired times, on CPU torch.

Production and the candidates are ops defined here that compute the same
result and hold the call for a known time: the candidate 10 % longer,
10 % shorter, or as long. Ground truth is those times. A slower candidate
is never promoted and is rejected, a faster one is promoted, an equal one
ends inconclusive; every decision carries its evidence."""
import json
import time

import pytest
import torch

import understudy
from test_shadow import candidate_op

BASE_S = 0.005
_lib = torch.library.Library("ust_promo", "DEF")
_lib.define("work(Tensor x) -> Tensor")


def _hold(seconds):
    time.sleep(seconds)  # a sleeping hold: on a loaded machine a busy one loses its core at random


_runs = {"n": 0, "uneven": 1.0}


def production(x):
    """Held BASE_S; with _runs["uneven"] = f, every second run f times as
    long: a shadowed call's A/A check (production run again after the
    candidate) then takes f times its first run, every time."""
    _runs["n"] += 1
    _hold(BASE_S * (_runs["uneven"] if _runs["n"] % 2 == 0 else 1.0))
    return x * 3


_lib.impl("work", production, "CPU")
PROBLEM = {"schema_version": 1, "operator": "work", "description": "x * 3 held for a known time, defined by the test",
           "bindings": [{"op": "ust_promo::work", "key": {"N": "x[-1]"}}]}


def candidate(factor):
    def run(x):
        _hold(BASE_S * factor)
        return x * 3

    return candidate_op(f"ust_promo_cand::work_{int(factor * 100)}", run, "ust_promo::work")


@pytest.fixture
def problems(tmp_path):
    d = tmp_path / "problems"
    d.mkdir()
    (d / "work.json").write_text(json.dumps(PROBLEM))
    return d


def route_config(factor, max_samples=200, aa_sample=0, **extra):
    return {"operators": {"work": {
        "mode": "shadow", "sample": 1.0,
        "candidate": {"torch_op": candidate(factor), "target": "ust_promo::work"},
        "guard": {"aa_sample": aa_sample},
        "promotion": {"min_verified": 5, "alpha": 0.05, "delta": 0.05, "max_samples": max_samples}}},
        "report": {"interval_s": 0}, **extra}


def run_route(us, problems, factor, calls, max_samples=200, aa_sample=0, **extra):
    us.enable(route_config(factor, max_samples, aa_sample, **extra), problems=problems)
    x = torch.randn(4, 8)
    modes = []
    for _ in range(calls):
        torch.ops.ust_promo.work(x)
        (op,) = us.report()["operators"]
        (r,) = op["shapes"]
        modes.append(r["rollout"]["mode"])
        if r["rollout"]["promotion"]["state"] in ("rejected", "inconclusive") or modes[-1] != "shadow":
            break
    (op,) = us.report()["operators"]
    (r,) = op["shapes"]
    return r["rollout"], modes


def test_a_slower_candidate_is_rejected_never_promoted(us, problems):
    ro, modes = run_route(us, problems, 1.10, calls=200)
    assert set(modes) == {"shadow"}
    pr = ro["promotion"]
    assert pr["state"] == "rejected", pr
    t = pr["test"]
    assert t["ratio_lower"] > 1.05 and 1.05 < t["ratio_median"] < 1.2
    assert f"n {t['samples']}" in pr["note"] and "delta 0.05, alpha 0.05" in pr["note"]


def test_a_faster_candidate_is_promoted_with_its_evidence(us, problems):
    ro, modes = run_route(us, problems, 0.90, calls=200)
    assert modes[-1] == "canary" and ro["mode"] == "canary"
    last = ro["last_transition"]
    assert last["by"] == "policy" and last["reason"].startswith("faster: n ")
    assert "sequence [" in last["reason"] and "delta 0.05, alpha 0.05" in last["reason"]
    # the decision was taken at the first sample that could take it: few, not max_samples
    assert len(modes) < 60


def test_an_equal_candidate_ends_inconclusive(us, problems):
    ro, modes = run_route(us, problems, 1.00, calls=200, max_samples=60)
    assert set(modes) == {"shadow"}
    pr = ro["promotion"]
    assert pr["state"] == "inconclusive", pr
    t = pr["test"]
    assert t["samples"] == 60 and t["ratio_lower"] < 1.05 and t["ratio_upper"] > 0.95
    assert 0.95 < t["ratio_median"] < 1.05


def test_a_difference_within_productions_own_spread_is_not_a_speedup(us, problems):
    """The delta is floored by production's own A/A spread on the route:
    with every A/A run of production 1.3x its first run, a candidate 10 %
    faster than the first run is inside that spread and not promoted
    (inconclusive), where with A/A off the same traffic promotes it."""
    _runs.update(n=0, uneven=1.3)
    try:
        ro, modes = run_route(us, problems, 0.90, calls=200, max_samples=40, aa_sample=1.0)
        us.disable()
        ro_off, modes_off = run_route(us, problems, 0.90, calls=200, aa_sample=0)
    finally:
        _runs["uneven"] = 1.0
    pr = ro["promotion"]
    assert set(modes) == {"shadow"} and pr["state"] == "inconclusive", pr
    assert pr["aa_spread"]["checks"] >= 40 and 0.2 < pr["aa_spread"]["median"] < 0.6, pr
    assert pr["delta"] == 0.05 and pr["delta_used"] == pr["aa_spread"]["median"]
    assert f"delta {pr['delta_used']:.3g} (A/A " in pr["note"]
    assert 0.75 < pr["test"]["ratio_median"] < 1.0, pr
    assert modes_off[-1] == "canary" and ro_off["last_transition"]["reason"].startswith("faster: n "), ro_off


def test_a_decision_is_kept_in_the_state_file_with_its_evidence(us, problems, tmp_path):
    """A rejection is no transition (the route stays in the config's shadow
    mode), but it is a decision: the state file keeps it with its evidence,
    and a restart finds the stage decided instead of testing again."""
    state = tmp_path / "state.json"
    ro, _ = run_route(us, problems, 1.10, calls=200, state={"path": str(state)})
    us.disable()
    pr = ro["promotion"]
    assert pr["state"] == "rejected"
    (key, row), = json.loads(state.read_text())["routes"].items()
    assert "mode" not in row  # the route's mode stays the config's
    assert row["decision"] == {"state": "rejected", "evidence": pr["note"]}
    us.enable(route_config(1.10, state={"path": str(state)}), problems=problems)
    torch.ops.ust_promo.work(torch.randn(4, 8))
    (op,) = us.report()["operators"]
    (r,) = op["shapes"]
    assert r["key"] == key and r["rollout"]["mode"] == "shadow"
    assert r["rollout"]["promotion"]["state"] == "rejected" and r["rollout"]["promotion"]["note"] == pr["note"]


def test_promotion_fields_are_checked(us, problems):
    for field, value, message in [("alpha", 0.7, "alpha' must be an error rate"),
                                  ("delta", 1.5, "delta' must be a relative difference"),
                                  ("max_samples", 3, r"max_samples' must be an integer in \[10, 100000\]")]:
        cfg = {"operators": {"work": {"mode": "shadow", "candidate": {"torch_op": candidate(1.0),
                                                                       "target": "ust_promo::work"},
                                      "promotion": {field: value}}}}
        with pytest.raises(understudy.ConfigError, match=message):
            us.enable(cfg, problems=problems)
