import json
import os
import pathlib
import sys
from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python-shim"))

import understudy  # noqa: E402


def candidate_dir():
    """The example candidates to load: $UNDERSTUDY_CANDIDATES, else the
    candidates/ folder of the build tree the library comes from, so a test run
    against another build (the sanitized one) loads that build's candidates."""
    env = os.environ.get("UNDERSTUDY_CANDIDATES")
    if env:
        return pathlib.Path(env)
    return understudy.library_path().parent / "candidates"


class DispatchCounter(TorchDispatchMode):
    """Independent ground truth: counts every aten op that reaches the Python
    dispatch key, which sits directly above BackendSelect. Composite ops are
    decomposed under the mode, so the leaf ops they call are seen exactly as
    the dispatcher would send them below."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        overload = func._overloadname
        self.counts[name + ("" if overload == "default" else "." + overload)] += 1
        with self:
            r = func.decompose(*args, **kwargs)
        if r is not NotImplemented:
            return r
        return func(*args, **kwargs)


def bound_ops(rep):
    """{display name -> calls} from a report, summed over shape keys."""
    out = Counter()
    for op in rep["operators"]:
        for s in op["shapes"]:
            out[s["op"]] += int(s["calls"])
    return out


def all_bindings(rep):
    return {b for op in rep["operators"] for b in op["bindings"]}


@pytest.fixture
def us(tmp_path):
    """understudy, disabled again after the test whatever happens."""
    yield understudy
    understudy.disable()


@pytest.fixture
def report_path(tmp_path):
    return tmp_path / "report.json"


def load_report(path):
    with open(path) as f:
        return json.load(f)
