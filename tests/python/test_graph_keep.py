"""Which enables keep torch's CUDA graphs for replays gated from the host
(python-shim/understudy/graphs.py): only a native candidate's shadow goes
into a graph, and shadow.graph_gate "device" asks for none; and that a
capture keys its thread's calls one by one. Runs without a GPU;
test_graph_shadow_cuda.py and test_cuda.py run the graphs themselves."""
import json
import threading

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
                                     for n in ("capture_begin", "capture_end", "instantiate", "replay", "reset",
                                               "raw_cuda_graph", "raw_cuda_graph_exec"))
    us.disable()
    assert not graphs._keep
    us.enable({"operators": {"rms_norm": {"mode": "observe"}}})
    assert not graphs._keep
    us.disable()


class _Graph:
    """Behaves as torch.cuda.CUDAGraph does for the hooks: keep_graph keeps
    the graph (raw_cuda_graph answers) and leaves instantiation to
    instantiate() or the first replay; without it, capture_end instantiates
    and drops the graph. Every call goes into log."""
    log = []
    _made = 0

    def __init__(self, keep_graph=False):
        _Graph._made += 1
        self.keep, self.graph, self.exec = keep_graph, 0, 0
        self.n = _Graph._made

    def capture_begin(self):
        self.log.append(("capture_begin", self.n))

    def capture_end(self):
        self.graph = 0x1000 + self.n
        if not self.keep:  # in torch's own code, not through the Python method
            _Graph.instantiate(self)
            self.graph = 0
        self.log.append(("capture_end", self.n))

    def instantiate(self):
        self.exec = 0x2000 + self.n + 16 * len(self.log)
        self.log.append(("instantiate", self.n))

    def replay(self):
        if not self.exec:
            _Graph.instantiate(self)
        self.log.append(("replay", self.n))

    def reset(self):
        self.graph = self.exec = 0
        self.log.append(("reset", self.n))

    def raw_cuda_graph(self):
        if not self.graph:
            raise RuntimeError("no graph kept")
        return self.graph

    def raw_cuda_graph_exec(self):
        if not self.exec:
            raise RuntimeError("not instantiated")
        return self.exec


class _Lib:
    """The library's graph entry points, logged; ust_graph_replay says that
    every other replay starts something after it."""

    def __init__(self, log):
        self.log, self.replays = log, 0
        self.hosted = 78  # the id of the next hosted capture

    def ust_graph_capture_hosted(self, stream):
        self.log.append(("capture_hosted", stream))
        return self.hosted

    def ust_graph_bind(self, graph, capture, exec_):
        self.log.append(("bind", graph, capture, exec_))
        return 1

    def ust_graph_replay(self, exec_, stream):
        self.replays += 1
        self.log.append(("gate", exec_, stream))
        return self.replays % 2

    def ust_graph_replayed(self, exec_, stream):
        self.log.append(("replayed", exec_, stream))

    def ust_graph_unbind(self, exec_):
        self.log.append(("unbind", exec_))

    def ust_graph_unseen(self):
        self.log.append(("unseen",))
        return 1

    def ust_graph_capture_id(self, stream):
        self.log.append(("capture_id", stream))
        return 91

    def ust_graph_exposed(self, capture):
        self.log.append(("exposed", capture))
        return 1


@pytest.fixture
def hooked(monkeypatch):
    """_Graph wrapped by the hooks, on a stand-in device 1 whose current
    stream is 0x5001; graphs made meanwhile kept."""
    log = []
    cls = type("Graph", (_Graph,), {"log": log})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0x5000 + (
        device if device is not None else 1)})())
    monkeypatch.setattr(graphs, "_keep", True)
    cls.lib = _Lib(log)
    assert graphs.wrap(cls, cls.lib)
    return cls, log


def test_a_kept_graph_is_captured_hosted_bound_and_replayed_between_the_hooks(hooked):
    """Made while graphs are kept: the capture is marked hosted on the
    current stream, the graph instantiated at capture_end and bound with that
    capture's id; each replay is gated before torch's replay on the graph's
    device's stream, and replayed after it only when the gate says so."""
    cls, log = hooked
    g = cls()
    g.capture_begin()
    g.capture_end()
    for _ in range(3):
        g.replay()
    ex = g.exec  # read here, not through the hooks (that would hand it out)
    assert log == [("capture_begin", g.n), ("capture_hosted", 0x5001), ("capture_end", g.n), ("instantiate", g.n),
                   ("bind", g.graph, 78, ex),
                   ("gate", ex, 0x5001), ("replay", g.n), ("replayed", ex, 0x5001),
                   ("gate", ex, 0x5001), ("replay", g.n),
                   ("gate", ex, 0x5001), ("replay", g.n), ("replayed", ex, 0x5001)]
    del log[:]
    g.reset()
    assert log == [("unbind", ex), ("reset", g.n)]


def test_a_graph_its_owner_keeps_is_bound_after_torch_instantiates_it_at_its_first_replay(hooked):
    """keep_graph=True by its owner: capture_end leaves it uninstantiated;
    its first replay (which instantiates it) is not gated and binds it; the
    next one is."""
    cls, log = hooked
    g = cls(keep_graph=True)
    g.capture_begin()
    g.capture_end()
    g.replay()
    g.replay()
    ex = g.exec
    assert log == [("capture_begin", g.n), ("capture_hosted", 0x5001), ("capture_end", g.n),
                   ("instantiate", g.n), ("replay", g.n), ("bind", g.graph, 78, ex),
                   ("gate", ex, 0x5001), ("replay", g.n), ("replayed", ex, 0x5001)]


def test_a_graph_not_kept_is_neither_hosted_nor_gated(hooked, monkeypatch):
    """Made while graphs are not kept: nothing is asked of the library at
    capture (torch drops such a graph once instantiated: nothing of it can
    be bound), and its replays pass through without a hook."""
    cls, log = hooked
    monkeypatch.setattr(graphs, "_keep", False)
    g = cls()
    g.capture_begin()
    g.capture_end()
    g.replay()
    assert log == [("capture_begin", g.n), ("instantiate", g.n), ("capture_end", g.n), ("replay", g.n)]


def test_a_graph_captured_while_understudy_was_off_is_said_unseen_once_when_replayed_on(hooked, monkeypatch):
    """A graph captured while understudy was off (before enable(), or while
    disabled): its first replay while it is on tells the library (once a
    graph: graphs.unseen), later ones nothing; replays while off tell it
    nothing; a graph captured while on is never unseen."""
    cls, log = hooked
    monkeypatch.setattr(graphs, "_keep", False)
    monkeypatch.setattr(graphs, "_enabled", False)
    before = cls()
    before.capture_begin()
    before.capture_end()
    before.replay()  # still off: nothing said
    monkeypatch.setattr(graphs, "_enabled", True)
    seen = cls()
    seen.capture_begin()
    seen.capture_end()
    del log[:]
    for _ in range(3):
        before.replay()
        seen.replay()
    assert log == [("unseen",), ("replay", before.n), ("replay", seen.n),
                   ("replay", before.n), ("replay", seen.n), ("replay", before.n), ("replay", seen.n)]


def test_a_graph_seen_by_an_earlier_enable_is_unseen_by_the_next(hooked, monkeypatch):
    """A graph captured while understudy was on, then disabled and enabled
    again: the new enable has none of its sites, so its first replay tells
    the library once, as a graph captured while off would; one captured
    under the new enable is seen."""
    cls, log = hooked
    monkeypatch.setattr(graphs, "_keep", False)
    monkeypatch.setattr(graphs, "_enabled", False)
    monkeypatch.setattr(graphs, "_generation", 0)
    graphs.set_enabled(True)
    old = cls()
    old.capture_begin()
    old.capture_end()
    old.replay()
    graphs.set_enabled(True)  # enabled again without a disable: the same enable
    old.replay()
    graphs.set_enabled(False)
    graphs.set_enabled(True)
    new = cls()
    new.capture_begin()
    new.capture_end()
    del log[:]
    for _ in range(2):
        old.replay()
        new.replay()
    assert log == [("unseen",), ("replay", old.n), ("replay", new.n), ("replay", old.n), ("replay", new.n)]


def test_enable_and_disable_say_whether_captures_are_seen(us):
    """enable() marks captures from then on as seen, disable() as not; the
    library counts an unseen graph only while enabled."""
    import understudy
    us.enable({"operators": {"rms_norm": {"mode": "observe"}}})
    assert graphs._enabled
    lib = understudy._load()
    assert lib.ust_graph_unseen() == 1 and lib.ust_graph_unseen() == 1
    assert us.report()["graphs"]["unseen"] == 2
    us.disable()
    assert not graphs._enabled
    assert lib.ust_graph_unseen() == 0


def test_a_raw_handle_taken_outside_understudy_closes_the_captured_calls_of_its_graph(hooked):
    """The hooks' own reads of a kept graph's raw handles (to bind it) hand
    nothing out; the test's, as a graph library's would be, each tell the
    library the capture whose graph was handed out (its calls with a
    candidate run production alone from then on), after torch answered,
    once per capture: a read torch refuses hands nothing out, and the
    graph captured again is handed out again."""
    cls, log = hooked
    g = cls()
    g.capture_begin()
    g.capture_end()
    assert not any(e[0] == "exposed" for e in log), log
    del log[:]
    ex = g.raw_cuda_graph_exec()
    graph = g.raw_cuda_graph()
    assert (ex, graph) == (g.exec, g.graph)
    assert log == [("exposed", 78)]
    g.raw_cuda_graph_exec()
    assert log == [("exposed", 78)]
    g.reset()
    cls.lib.hosted = 79
    g.capture_begin()
    g.capture_end()
    del log[:]
    g.raw_cuda_graph()
    g.raw_cuda_graph_exec()
    assert [e for e in log if e[0] == "exposed"] == [("exposed", 79)], log
    fresh = cls()
    del log[:]
    with pytest.raises(RuntimeError):
        fresh.raw_cuda_graph_exec()
    assert log == []


def test_a_graph_not_kept_is_closed_by_its_capture_id_when_handed_out(hooked, monkeypatch):
    """A graph not kept, captured while understudy is on: its capture's id
    is asked for at capture_begin (its calls' shadows or arms carry it), and
    its executable's raw handle, taken outside understudy, closes them; one
    captured while off asks nothing and closes nothing."""
    cls, log = hooked
    monkeypatch.setattr(graphs, "_keep", False)
    monkeypatch.setattr(graphs, "_enabled", True)
    g = cls()
    g.capture_begin()
    g.capture_end()
    g.raw_cuda_graph_exec()
    assert log == [("capture_begin", g.n), ("capture_id", 0x5001), ("instantiate", g.n), ("capture_end", g.n),
                   ("exposed", 91)]
    monkeypatch.setattr(graphs, "_enabled", False)
    off = cls()
    off.capture_begin()
    off.capture_end()
    del log[:]
    off.raw_cuda_graph_exec()
    assert log == []


def test_torchs_own_reads_of_a_raw_handle_hand_nothing_out(hooked):
    """torch reads a graph through its raw handles (torch.cuda.graphs'
    get_graph_data, its kernel annotations' remap): a read from those
    modules closes nothing, also through a subclass that overrides a raw
    handle and calls super() (the override is not the caller); the same
    read from any other module, torch's others included, does."""
    cls, log = hooked
    sub_src = ("class Sub(base):\n"
               "    def raw_cuda_graph_exec(self):\n        return super().raw_cuda_graph_exec()\n"
               "    def raw_cuda_graph(self):\n        return super().raw_cuda_graph()\n")
    sub_scope = {"__name__": "vllm.graphs", "base": cls}
    exec(compile(sub_src, "vllm.graphs", "exec"), sub_scope)  # noqa: S102 - a subclass defined in a library
    read = "def read(g):\n    return g.raw_cuda_graph_exec(), g.raw_cuda_graph()\n"
    for module, closes in (("torch.cuda._graph_annotations", False), ("torch.cuda.graphs", False),
                           ("torch", True), ("torch.nn.modules", True), ("vllm.compilation", True),
                           ("torchish", True)):
        scope = {"__name__": module}
        exec(compile(read, module, "exec"), scope)  # noqa: S102 - a function defined as if in that module
        for kind in (cls, sub_scope["Sub"]):
            g = kind()
            g.capture_begin()
            g.capture_end()
            del log[:]
            assert scope["read"](g) == (g.exec, g.graph)
            assert log == ([("exposed", 78)] if closes else []), (module, kind, log)


class _Invalidated(_Graph):
    """A capture torch invalidated: capture_end raises."""

    def capture_end(self):
        self.log.append(("capture_end", self.n))
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_capture_keys_its_threads_calls_one_by_one(us):
    """Between capture_begin and capture_end (also one that raises) the
    capturing thread's calls of an operator that keys 1 in 8 at random past
    the warm-up are each keyed, none tallied, so that the graph's nodes map
    to routes; another thread's calls meanwhile, and the thread's own once
    the capture ended, are keyed at random again. Every call is counted once."""
    us.enable({"defaults": {"key_every": 8, "key_after": 0}, "operators": {"gemm": "observe"}})
    lib = us._load()
    ok, bad = (type("Graph", (base,), {"log": []}) for base in (_Graph, _Invalidated))
    assert graphs.wrap(ok, lib) and graphs.wrap(bad, lib)
    a = torch.randn(8, 16)
    b = {n: torch.randn(16, n) for n in range(1, 6)}

    def calls(n):
        for _ in range(800):
            torch.mm(a, b[n])
    g = ok()
    g.capture_begin()
    calls(1)
    other = threading.Thread(target=calls, args=(2,))
    other.start()
    other.join()
    g.capture_end()
    calls(3)
    g = bad()
    g.capture_begin()
    calls(4)
    with pytest.raises(RuntimeError, match="capturing"):
        g.capture_end()
    calls(5)
    assert lib.ust_graph_capture_ended() == 0  # none left under way on this thread
    (op,) = [o for o in us.report()["operators"] if o["name"] == "gemm"]
    keys = {int(s["key"].split("N=")[-1]): s for s in op["shapes"]}
    for n in (1, 4):  # captured
        assert (keys[n]["calls"], keys[n]["estimated"]) == (800, 0)
    for n in (2, 3, 5):  # keyed at random: 100 +- 9.4 (sd) of 800 each, each standing for 8; 5 sd
        assert keys[n]["estimated"] % 7 == 0 and abs(keys[n]["estimated"] // 7 - 100) <= 47, keys[n]
    seen = sum(s["calls"] - s["estimated"] for s in keys.values())
    assert op["tallied"] + seen == 5 * 800


def test_the_pool_hooks_say_when_a_thread_allocates_to_a_graph_pool():
    """torch._C's functions that route the thread's allocations to a graph's
    pool (a CUDA graph tree's warm-up) and end that: each hook calls torch's
    first and then tells the library, the end whether torch's raised or not;
    a module or a library without them is left as it is."""
    import types
    log = []

    class Lib:
        def ust_pool_alloc_begun(self):
            log.append("begun")
            return 1

        def ust_pool_alloc_ended(self):
            log.append("ended")
            return 0

    def begin(device, pool):
        log.append(("begin", device, pool))

    def end(device, pool):
        log.append(("end", device, pool))
        raise RuntimeError("no such pool")

    mod = types.SimpleNamespace(_cuda_beginAllocateCurrentThreadToPool=begin, _cuda_endAllocateToPool=end)
    lib = Lib()
    assert graphs.wrap_pool(mod, lib)
    mod._cuda_beginAllocateCurrentThreadToPool(0, (1, 2))
    with pytest.raises(RuntimeError, match="no such pool"):
        mod._cuda_endAllocateToPool(0, (1, 2))
    assert log == [("begin", 0, (1, 2)), "begun", ("end", 0, (1, 2)), "ended"]
    assert mod._cuda_endAllocateToPool.__wrapped__ is end
    # once per pool: an end of a pool the thread never began moves nothing,
    # nor a second begin; a capture's end (torch ends its pool) ends it too
    log.clear()
    with pytest.raises(RuntimeError):
        mod._cuda_endAllocateToPool(0, (7, 0))
    mod._cuda_beginAllocateCurrentThreadToPool(0, (7, 0))
    mod._cuda_beginAllocateCurrentThreadToPool(0, (7, 0))
    graphs.pool_ended(lib, (7, 0))
    graphs.pool_ended(lib, (7, 0))
    assert log == [("end", 0, (7, 0)), ("begin", 0, (7, 0)), "begun", ("begin", 0, (7, 0)), "ended"]
    # another thread's pools are its own
    seen = []
    t = threading.Thread(target=lambda: (mod._cuda_beginAllocateCurrentThreadToPool(0, (7, 0)), seen.append(log[-1])))
    t.start()
    t.join()
    assert seen == ["begun"]
    bare = types.SimpleNamespace(_cuda_endAllocateToPool=end)
    assert not graphs.wrap_pool(bare, Lib()) and bare._cuda_endAllocateToPool is end
    assert not graphs.wrap_pool(types.SimpleNamespace(_cuda_beginAllocateCurrentThreadToPool=begin,
                                                      _cuda_endAllocateToPool=end), object())
