import ast
import contextlib
import json
import math
import os
import pathlib
import re
import socket
import sys
import threading
import time
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python-shim"))

# The sanitized pass (run.sh) starts this process with PYTHONMALLOC=malloc, so
# that the Python objects the library writes into here, in-process, sit on
# the sanitized heap. The tests' own Python subprocesses keep the sanitizer
# (LD_PRELOAD) but not that: Python's allocator is chosen at start-up, and
# on the sanitized heap each child's start (torch's import) takes a second
# longer, for children that mostly check what the library prints and writes.
if "libasan" in os.environ.get("LD_PRELOAD", ""):
    os.environ.pop("PYTHONMALLOC", None)

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


def calls_behind_queued_work(call, n=10, cycles=2_000_000_000):
    """n calls made while GPU work (a sleep kernel of `cycles`, about a second
    for the default) is queued ahead of them. Returns the host time they took,
    whether the queued work was still running when they had returned (so
    nothing synchronised), and when they began (perf_counter)."""
    import torch
    torch.cuda._sleep(cycles)
    done = torch.cuda.Event()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    host_s = time.perf_counter() - t0
    done.record()
    return host_s, not done.query(), t0


# ---- tests that need a CUDA device ----------------------------------------------

def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device; skipped where torch sees none (./run.sh test-gpu runs them: "
        "pytest -m gpu)")


def needs_cuda(item):
    """Whether a test needs a CUDA device: it is marked gpu, or it carries a
    skipif whose reason names CUDA (the older spelling of the same mark,
    such as skipif(torch.cuda.device_count() < 2, reason="needs two CUDA
    devices")), so that -m gpu selects it too."""
    if item.get_closest_marker("gpu") is not None:
        return True
    return any("CUDA" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The one condition for skipping a GPU test: torch sees no CUDA device
    (not the build, not the sanitizer pass: the sanitized pass hides the
    devices with CUDA_VISIBLE_DEVICES, so torch sees none there)."""
    import torch
    cuda = torch.cuda.is_available()
    for item in items:
        if needs_cuda(item):
            if item.get_closest_marker("gpu") is None:
                item.add_marker(pytest.mark.gpu)
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


def series_labels(**labels):
    """A series' labels as the exposition writes them: these and the ones
    every series carries in this process now (engine, from what it has
    imported, and model_name where known), sorted."""
    from understudy.metrics import const_labels
    both = dict(const_labels(), **labels)
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(both.items())) + "}"


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


# ---- host time the tests control ------------------------------------------------

_held = threading.local()


@contextlib.contextmanager
def held_for(ns):
    """Within: each call of the tests' own host ops (_C::rms_norm and
    _C::silu_and_mul, defined in test_shadow.py) on this thread takes at
    least ns nanoseconds: its implementation spins until ns have passed
    since it began. Understudy's timer runs around the implementation and
    the test's clock around understudy, so each call's timed device time
    lies between ns and what the test measures around the call
    (time.perf_counter_ns reads the same CLOCK_MONOTONIC as understudy)."""
    prev = getattr(_held, "ns", 0)
    _held.ns = ns
    try:
        yield
    finally:
        _held.ns = prev


def hold_since(t0_ns):
    """Spin until the held time (held_for) has passed since t0_ns."""
    ns = getattr(_held, "ns", 0)
    while time.perf_counter_ns() - t0_ns < ns:
        pass


def clocked(fn, *args):
    """fn(*args)'s wall time in ns, measured by the test around the call."""
    t0 = time.perf_counter_ns()
    fn(*args)
    return time.perf_counter_ns() - t0


def assert_busiest_first(order, lo, hi):
    """order lists items busiest first; lo[x] <= x's true figure <= hi[x].
    Wherever the bounds separate two items (lo of one above hi of the
    other), the busier must come first; where they overlap (a noisy machine
    stretched a call) the order is not known and not checked."""
    assert set(order) == set(lo) == set(hi)
    pos = {x: i for i, x in enumerate(order)}
    for a in order:
        for b in order:
            if lo[a] > hi[b]:
                assert pos[a] < pos[b], f"{a} ({lo[a]} or more) comes after {b} ({hi[b]} at most) in {order}"


# The log-bucketed histogram ("log2-sub16-ns"): 16 buckets an octave, a
# quantile read as its bucket's midpoint, within 1/32 of the true value.
HIST_REL = 1 / 32


# ---- roofline floors evaluated here, from the definitions' own text ---------------

_PATHS = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
          "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e4m3", "torch.int8": "int8"}
_DIM = re.compile(r"^(?:(rows|numel|len|esize|bytes|obytes|nbytes|onbytes|dtsize)\((\w+)\)|(\w+)\[(-?\d+)\]|(\w+))$")


def _dim(expr, args):
    """A value of the key-dimension grammar (dispatch/dimexpr.c), read from
    the call's arguments (name -> tensor, list or number)."""
    m = _DIM.match(expr.strip())
    assert m, f"not a dimension: {expr}"
    fn, name, tname, idx, plain = m.groups()
    if tname:
        return args[tname].shape[int(idx)]
    if plain:
        return int(args[plain])
    v = args[name]
    if fn in ("obytes", "onbytes", "dtsize") and v is None:
        return 0
    return {"rows": lambda t: math.prod(t.shape[:-1]), "numel": lambda t: t.numel(), "len": len,
            "esize": lambda t: t.element_size(), "bytes": _bytes, "obytes": _bytes,
            "nbytes": lambda t: t.nbytes, "onbytes": lambda t: t.nbytes,
            "dtsize": lambda dt: torch.empty(0, dtype=dt).element_size()}[fn](v)


def _bytes(t):
    """The bytes a tensor's elements occupy: an expanded (stride-0) dimension
    is read once, not once per logical element."""
    return math.prod(n for n, s in zip(t.shape, t.stride()) if s != 0) * t.element_size() if t.numel() else 0


def _expr(text, env):
    """A roofline expression (scorer/expr.c: + - * / % ^, min max ceil floor
    abs cdiv) in Python, over the vars in env."""
    funcs = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "abs": abs,
             "cdiv": lambda a, b: math.ceil(a / b)}
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Mod: math.fmod, ast.Pow: lambda a, b: a ** b}

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return float(n.value)
        if isinstance(n, ast.Name):
            return float(env[n.id])
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp):
            return ops[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.Call):
            return float(funcs[n.func.id](*[ev(a) for a in n.args]))
        raise AssertionError(f"{text}: {ast.dump(n)}")

    return ev(ast.parse(text.replace("^", "**"), mode="eval"))


def roofline_floor_ns(definition, op, args, profile):
    """T_SOL of one call of op in ns: W and Q as problems/<definition>.json
    writes them for op's binding, evaluated here over the call's arguments,
    against a hardware profile (its JSON as a dict): max(W / P_peak[path of
    W_dtype's dtype], (Q_read + Q_write) / B_peak). None when the profile
    has no peak for that dtype (the call is then not scored)."""
    d = json.loads((ROOT / "problems" / f"{definition}.json").read_text())
    (rl,) = [b["roofline"] for b in d["bindings"] if b["op"] == op]
    env = {k: _dim(v, args) for k, v in rl["vars"].items()}
    path = _PATHS.get(str(args[rl["W_dtype"]].dtype))
    if path is None or path not in profile["p_peak"]:
        return None
    w, q = _expr(rl["W"], env), _expr(rl["Q_read"], env) + _expr(rl["Q_write"], env)
    return max(w / profile["p_peak"][path], q / profile["b_peak"]) * 1e9


def hardware_profile(name):
    return json.loads((ROOT / "problems" / "hardware" / f"{name}.json").read_text())


def need(ok, why):
    """A missing prerequisite (a tool or package ./run.sh test's set-up
    installs) fails where that set-up ran (it exports UNDERSTUDY_TEST_SETUP)
    or under CI, and skips, saying why, elsewhere (a machine where pytest
    is run by hand, such as the GPU machine)."""
    if ok:
        return
    if os.environ.get("UNDERSTUDY_TEST_SETUP") or os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def free_port(pair=False):
    """A free loopback port (with pair, one whose successor is free too)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pair:
            return port
        if port < 65535:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise AssertionError("no free port pair")
