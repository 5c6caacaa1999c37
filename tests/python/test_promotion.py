"""Promotion decided by a sequential test on paired times, on CPU torch.

Production and the candidates are ops defined here that compute the same
result and hold the call for a known time: the candidate half again as
long, 40 % shorter, or as long. Ground truth is those times, and the runs
each op records. A slower candidate is never promoted and is rejected, a
faster one is promoted, an equal one ends inconclusive; every decision
carries its evidence.

The holds are sleeps of 30 ms and the differences large, so that a loaded
machine cannot turn a decision: with four CPU-bound processes on two cores,
a 10 ms sleep was seen to overrun by a quarter in a typical pair of calls
(production's A/A spread would then widen delta past a 40 % effect), a
30 ms one by under 1 %."""
import json
import random
import time

import pytest
import torch

import understudy
from test_shadow import candidate_op

BASE_S = 0.030
_lib = torch.library.Library("ust_promo", "DEF")
_lib.define("work(Tensor x) -> Tensor")


def _hold(seconds):
    time.sleep(seconds)  # a sleeping hold: on a loaded machine a busy one loses its core at random


# levels: production holds BASE_S times one of them, drawn per run (seeded);
# runs: what each run of either op saw, for the order the calls ran them in
_prod = {"levels": (1.0,), "rng": random.Random(0), "runs": []}


def production(x):
    _prod["runs"].append(("P", x.data_ptr()))
    _hold(BASE_S * _prod["rng"].choice(_prod["levels"]))
    return x * 3


_lib.impl("work", production, "CPU")
PROBLEM = {"schema_version": 1, "operator": "work", "description": "x * 3 held for a known time, defined by the test",
           "bindings": [{"op": "ust_promo::work", "key": {"N": "x[-1]"}}]}


def candidate(factor):
    def run(x):
        _prod["runs"].append(("C", x.data_ptr()))
        _hold(BASE_S * factor)
        return x * 3

    return candidate_op(f"ust_promo_cand::work_{int(factor * 100)}", run, "ust_promo::work")


@pytest.fixture
def problems(tmp_path):
    d = tmp_path / "problems"
    d.mkdir()
    (d / "work.json").write_text(json.dumps(PROBLEM))
    _prod.update(levels=(1.0,), rng=random.Random(0), runs=[])
    return d


def route_config(factor, max_samples=200, aa_sample=None, **extra):
    guard = {} if aa_sample is None else {"aa_sample": aa_sample}  # None: the default share
    return {"operators": {"work": {
        "mode": "shadow", "sample": 1.0,
        "candidate": {"torch_op": candidate(factor), "target": "ust_promo::work"},
        "guard": guard,
        "promotion": {"min_verified": 5, "alpha": 0.05, "delta": 0.05, "max_samples": max_samples}}},
        "report": {"interval_s": 0}, **extra}


def run_route(us, problems, factor, calls, max_samples=200, aa_sample=None, **extra):
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
    ro, modes = run_route(us, problems, 1.5, calls=200)
    assert set(modes) == {"shadow"}
    pr = ro["promotion"]
    assert pr["state"] == "rejected", pr
    t = pr["test"]
    assert t["ratio_lower"] > 1 + pr["delta_used"] and 1.3 < t["ratio_median"] < 1.7, pr
    assert f"n {t['samples']}" in pr["note"] and "alpha 0.05" in pr["note"]
    # not before production's own spread was measured: 8 A/A pairs at the default share (1 in 4)
    assert pr["aa_spread"]["checks"] >= 8 and len(modes) >= 32


def test_a_faster_candidate_is_promoted_with_its_evidence(us, problems):
    ro, modes = run_route(us, problems, 0.6, calls=200)
    assert modes[-1] == "canary" and ro["mode"] == "canary", ro["promotion"]
    last = ro["last_transition"]
    assert last["by"] == "policy" and last["reason"].startswith("faster: n ")
    assert "sequence [" in last["reason"] and "(A/A " in last["reason"] and "alpha 0.05" in last["reason"]
    # the decision was taken at the first call that could take it: once the
    # A/A pairs were in (the 8th at the 32nd call), not at max_samples
    assert 32 <= len(modes) < 60


def test_no_decision_before_enough_aa_pairs(us, problems):
    """A/A at 1 in 10 calls: its 8th pair comes with the 80th call, and the
    test, clear long before, waits for it."""
    ro, modes = run_route(us, problems, 0.6, calls=200, aa_sample=0.1)
    assert modes[-1] == "canary" and len(modes) >= 80, modes


def test_an_equal_candidate_ends_inconclusive(us, problems):
    ro, modes = run_route(us, problems, 1.00, calls=200, max_samples=120)
    assert set(modes) == {"shadow"}
    pr = ro["promotion"]
    assert pr["state"] == "inconclusive", pr
    t, d = pr["test"], pr["delta_used"]
    assert 0.9 < t["ratio_median"] < 1.1
    # the reason is the note's head, and it holds
    if pr["note"].startswith("within delta"):  # the sequence lies inside the zone: no effect of delta
        assert 1 - d < t["ratio_lower"] and t["ratio_upper"] < 1 + d, pr
    elif pr["note"].startswith("A/A spread"):  # the machine was noisier than delta
        assert pr["aa_spread"]["median"] > pr["delta"] and d == pr["aa_spread"]["median"], pr
    else:
        assert pr["note"].startswith("undecided after 120 samples") and t["samples"] == 120, pr


def test_a_difference_within_productions_own_spread_is_not_a_speedup(us, problems):
    """delta widens with production's own A/A spread on the route: with
    production holding 0.7, 1, 1 or 1.4 times its time at random, two of
    its runs differ by about a third in a typical pair, and a candidate 20 %
    faster than its median is no speedup: inconclusive, the spread the
    reason. With A/A off the same traffic promotes it (it is faster by 20 %
    or more in 3 calls of 4), judged with delta alone. (Levels a quarter
    apart gave a spread near the effect: its estimate from the first 8
    pairs fell under 0.2 on a loaded machine and the candidate was
    promoted.)"""
    _prod["levels"] = (0.7, 1.0, 1.0, 1.4)
    ro, modes = run_route(us, problems, 0.8, calls=300, max_samples=250)
    us.disable()
    ro_off, modes_off = run_route(us, problems, 0.8, calls=600, max_samples=1000, aa_sample=0)
    pr = ro["promotion"]
    assert set(modes) == {"shadow"} and pr["state"] == "inconclusive", pr
    assert pr["aa_spread"]["checks"] >= 8 and 0.25 < pr["aa_spread"]["median"] < 0.6, pr
    assert pr["delta"] == 0.05 and pr["delta_used"] == pr["aa_spread"]["median"], pr
    assert pr["note"].startswith(f"A/A spread {pr['delta_used']:.3g} > delta 0.05; n "), pr
    assert f"delta {pr['delta_used']:.3g} (A/A " in pr["note"]
    assert modes_off[-1] == "canary" and ro_off["last_transition"]["reason"].startswith("faster: n "), ro_off["promotion"]


def test_the_arms_run_side_by_side_on_copies_in_a_drawn_order(us, problems):
    """Ground truth of each shadowed call from the ops themselves: production
    serves on the caller's tensor; then production again and the candidate,
    each on a copy (the same copy of what they only read), one right after
    the other, the candidate first in about half of the calls; on an A/A
    call (1 in 4) production once more, beside its own run."""
    us.enable(route_config(1.0), problems=problems)
    x = torch.randn(4, 8)
    seqs = []
    for _ in range(48):
        _prod["runs"] = []
        torch.ops.ust_promo.work(x)
        seqs.append(list(_prod["runs"]))
    rep = us.report()
    shapes = {"".join(k for k, _ in s) for s in seqs}
    assert shapes <= {"PPC", "PCP", "PPPC", "PCPP"}, shapes
    assert sum(len(s) == 4 for s in seqs) == 12  # exactly 1 in 4, spread evenly
    for s in seqs:
        assert s[0] == ("P", x.data_ptr())  # serving: the caller's own tensor
        ptrs = {p for _, p in s[1:]}
        assert len(ptrs) == 1 and x.data_ptr() not in ptrs  # the arms: one shared copy of the input
    cand_first = sum(s[1][0] == "C" for s in seqs)
    assert 12 <= cand_first <= 36, cand_first  # a fair coin per call: P(outside) < 1e-3
    (op,) = rep["operators"]
    (r,) = op["shapes"]
    # each run of production again is compared with what it served
    assert r["shadow"]["aa"]["runs"] == 48 + 12 and r["shadow"]["aa"]["mismatching"] == 0


def test_a_decision_is_kept_in_the_state_file_with_its_evidence(us, problems, tmp_path):
    """A rejection is no transition (the route stays in the config's shadow
    mode), but it is a decision: the state file keeps it with its evidence,
    and a restart finds the stage decided instead of testing again."""
    state = tmp_path / "state.json"
    ro, _ = run_route(us, problems, 1.5, calls=200, state={"path": str(state)})
    us.disable()
    pr = ro["promotion"]
    assert pr["state"] == "rejected"
    (key, row), = json.loads(state.read_text())["routes"].items()
    assert "mode" not in row  # the route's mode stays the config's
    assert row["decision"] == {"state": "rejected", "evidence": pr["note"]}
    us.enable(route_config(1.5, state={"path": str(state)}), problems=problems)
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
