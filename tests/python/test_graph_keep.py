"""Which enables keep torch's CUDA graphs for replays gated from the host
(python-shim/understudy/graphs.py): only a native candidate's shadow goes
into a graph, and shadow.graph_gate "device" asks for none. Runs without a
GPU; test_graph_shadow_cuda.py runs the graphs themselves."""
import json

import pytest
import torch

from understudy import graphs
from test_shadow import native, shadow_config


def _cfg(candidate=None, mode="shadow", gate=None):
    op = {"mode": mode}
    if candidate is not None:
        op["candidate"] = candidate
    cfg = {"operators": {"rms_norm": op}}
    if gate is not None:
        cfg["shadow"] = {"graph_gate": gate}
    return json.dumps(cfg)


@pytest.mark.parametrize("text,keep", [
    (_cfg({"native": "/x/librms.so", "sha256": "0" * 64}), True),
    (_cfg({"native": "/x/librms.so"}, gate="replay"), True),
    (_cfg({"native": "/x/librms.so"}, gate="device"), False),
    (_cfg({"torch_op": "ns::rms_norm"}), False),
    (_cfg(mode="observe"), False),
    ("", False),
    ("[1, 2]", False),
    ("{not json", False),
    (json.dumps({"operators": {"rms_norm": "shadow"}}), False),
])
def test_graphs_are_kept_only_for_a_native_candidate(text, keep):
    assert graphs.wants_keep(text) is keep


def test_enable_keeps_graphs_and_disable_stops(us):
    """enable() with a native candidate wraps torch.cuda.CUDAGraph (once per
    process) and keeps the graphs made meanwhile; disable() stops keeping;
    an observe-only enable keeps none."""
    us.enable(shadow_config("rms_norm", native("rms_norm_cpu")))
    assert graphs._keep
    assert graphs._installed and all(hasattr(getattr(torch.cuda.CUDAGraph, n), "__wrapped__")
                                     for n in ("capture_begin", "capture_end", "instantiate", "replay", "reset"))
    us.disable()
    assert not graphs._keep
    us.enable({"operators": {"rms_norm": {"mode": "observe"}}})
    assert not graphs._keep
    us.disable()
