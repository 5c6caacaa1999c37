"""understudy calibrate: a measured profile the library loads and scores with."""
import json
import os
import subprocess
import sys

from conftest import ROOT
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
    run_rms_norm(rms_inputs(shapes=((256, 1024),)), repeat=3)
    rep = us.report()
    us.disable()
    (rt,) = routes(rep, "_C::rms_norm")
    assert rt["roofline"]["hardware"] == prof["name"]
    assert rt["roofline"]["calls"] == 3 and rt["roofline"]["S"] > 0
