"""understudy calibrate: a measured profile the library loads and scores with."""
import json
import os
import statistics
import subprocess
import sys

import pytest

from conftest import HIST_REL, ROOT, clocked, held_for, roofline_floor_ns
from test_shadow import routes, rms_inputs, run_rms_norm


def test_calibrated_profile_scores_host_calls(us, tmp_path):
    hw = tmp_path / "hw"
    hw.mkdir()
    out = hw / "host.json"
    r = subprocess.run([sys.executable, "-m", "understudy", "calibrate", "--device", "cpu", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "python-shim")))
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    assert prof["b_peak"] > 1e8 and prof["p_peak"]["fp32"] > 1e8 and prof["p_peak"]["bf16"] > 0
    assert "(measured)" in prof["name"] and prof["source"].startswith("understudy calibrate")
    us.enable({"operators": {"rms_norm": {"sample": 1.0}},
               "hardware": {"dir": str(hw), "profile": prof["name"]}})  # the library's own loader accepts it
    (x, w), hold = rms_inputs(shapes=((16, 1024),))[0], 2_000_000
    with held_for(hold):
        measured = [clocked(run_rms_norm, [(x, w)], 1) for _ in range(3)]
    rep = us.report()
    us.disable()
    (rt,) = routes(rep, "_C::rms_norm")
    assert rt["roofline"]["hardware"] == prof["name"]
    assert rt["roofline"]["calls"] == 3
    # S against the floor of the measured profile's own figures, W and Q
    # evaluated here from the definition, and the calls' held and measured time
    tsol = roofline_floor_ns("rms_norm", "_C::rms_norm", {"out": x, "input": x, "weight": w, "eps": 1e-6}, prof)
    assert rt["roofline"]["tsol_ns_mean"] == pytest.approx(tsol, abs=1e-3)
    s_lo = tsol / (statistics.median(measured) * (1 + HIST_REL))
    assert s_lo <= rt["roofline"]["S"] <= tsol / (hold * (1 - HIST_REL))
