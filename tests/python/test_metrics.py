"""Prometheus exposition: well-formed text, the report's figures, served on loopback."""
import re
import urllib.request

import torch

import understudy
from test_shadow import native, rms_inputs, run_rms_norm

LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|NaN)$')


def parse(text):
    """Every line well-formed, and each family contiguous under its HELP/TYPE."""
    samples, done, current = {}, set(), None
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.startswith("# HELP ") or line.startswith("# TYPE "), line
            fam = line.split()[2]
            if line.startswith("# HELP "):
                assert fam not in done, f"family {fam} appears twice"
                if current:
                    done.add(current)
                current = fam
            continue
        assert LINE.match(line), line
        name_labels, value = line.rsplit(" ", 1)
        base = name_labels.split("{")[0]
        assert base in (current, current + "_sum", current + "_count"), f"{base} outside its family {current}"
        samples[name_labels] = float(value)
    return samples


def test_metrics_carry_the_report(us):
    us.enable({"operators": {"rms_norm": {"mode": "shadow", "sample": 1.0, "candidate": native("rms_norm_cpu")},
                             "silu": {"sample": 1.0}}, "hardware": {"profile": "H200"}})
    with understudy.phase("decode"):
        run_rms_norm(rms_inputs(shapes=((4, 128),)), repeat=5)
        torch.nn.functional.silu(torch.randn(3, 7))
    server = understudy.serve_metrics(port=0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=10) as r:
            raise AssertionError("served a path other than /metrics")
    except urllib.error.HTTPError as e:
        assert e.code == 404
    finally:
        rep = us.report()
        server.stop()
        us.disable()
    samples = parse(text)
    (s,) = [s for o in rep["operators"] for s in o["shapes"] if s["op"] == "_C::rms_norm"]
    lb = f'{{operator="rms_norm",op="_C::rms_norm",key="{s["key"]}",phase="decode",device="cpu"}}'
    assert samples["understudy_calls_total" + lb] == 5
    assert samples["understudy_shadow_passed_total" + lb] == 5
    assert samples["understudy_rolled_back" + lb] == 0
    assert samples["understudy_latency_ns_count" + lb] == 5
    assert samples["understudy_measured_device_time_ns_total" + lb] == s["device_time_ns"]
    assert samples["understudy_roofline_s" + lb] > 0
    assert samples['understudy_s_agg{phase="decode"}'] == rep["totals"]["phases"]["decode"]["S_agg"]
    assert samples['understudy_operator_weight{operator="silu"}'] > 0
    # the router's state per route: production served all 5 calls in shadow mode
    arm = lb[:-1] + ',arm="production"}'
    assert samples["understudy_served_total" + arm] == 5
    assert samples["understudy_served_total" + arm.replace("production", "candidate")] == 0
    assert samples["understudy_route_mode" + lb[:-1] + ',mode="shadow"}'] == 1


def test_metrics_escape_labels():
    rep = {"operators": [{"name": 'we"ird\\op', "weight": 0.5, "shapes": []}], "totals": {}}
    text = understudy.metrics_text(rep)
    assert 'understudy_operator_weight{operator="we\\"ird\\\\op"} 0.5' in text
    parse(text)


def test_metrics_while_disabled_answer_503(us):
    server = understudy.serve_metrics(port=0)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        raise AssertionError("expected 503")
    except urllib.error.HTTPError as e:
        assert e.code == 503 and b"not enabled" in e.read()
    finally:
        server.stop()
