"""Replays of torch.cuda.CUDAGraph gated from the host.

A shadow captured beside the chain (README, "The candidate inside CUDA
graphs") leaves one kernel per captured call in the graph, which decides at
every replay, on the device, whether the replay verifies. Where torch's graph
object is replayed from Python (torch.cuda.graph, make_graphed_callables,
torch.compile's CUDA graph trees, vLLM, SGLang), these hooks let the host take
that decision instead, before each replay: the library enables those kernels
only in the replays that verify, and disabled they cost a replay almost
nothing. In a graph the hooks see captured (one whose graph is kept, below),
the shadow's body is not in the graph at all: the library starts it, as a
graph of its own on a stream of its own, behind each replay that verifies
(ust_graph_capture_hosted at capture_begin; ust_graph_replay before the
replay, ust_graph_replayed after it), so a closed gate costs the replay one
disabled kernel per captured call and no conditional node.

Enabling a node needs the graph the executable graph was made from, which
torch destroys once it instantiated it unless the graph object was made with
keep_graph=True. So while understudy is enabled with a native candidate configured
(and shadow.graph_gate is not "device"), a graph object made without
keep_graph is made with it, and instantiated at capture_end, as torch would
have done: its graph then lives as long as the object (host memory), and
raw_cuda_graph() answers. A graph whose owner asked for keep_graph=True is
left to its owner to instantiate (explicitly, or by torch at its first
replay: gated from the next one on).

A graph's raw handles (raw_cuda_graph, raw_cuda_graph_exec) asked for by
anyone but these hooks and torch's own readers are how a graph library
reaches its kernels to change them in place (cudaGraphExecUpdate,
cudaGraphExec*NodeSetParams), which nothing of understudy's sees outside
the kernel tracer's windows: the captured calls with a candidate in that
graph run production alone in its replays from then on
(ust_graph_exposed), and their routes say why. A handle taken in C++
(at::cuda::CUDAGraph), or read through torch._C._CUDAGraph's own methods
or the hooks' __wrapped__ originals, passes no hook: only the tracer's
windows see what is done with it.

The same hooks say when the thread captures (ust_graph_capture_begun after
capture_begin, ust_graph_capture_ended after capture_end, whether it raised
or not): while it does, every call it makes of an observed operator is keyed
one by one, none tallied, so that the graph's nodes map to routes.

Outside a capture, torch.compile's CUDA graph trees warm a function up with
the thread's allocations routed to the graph's pool, and then hold that every
block alive in the pool is an output they know: the hooks on
torch._C._cuda_beginAllocateCurrentThreadToPool and _cuda_endAllocateToPool
(wrap_pool()) say so (ust_pool_alloc_begun, ust_pool_alloc_ended), and a
shadowed call made meanwhile keeps none of its tensors past its return.

install() wraps __init__, capture_begin, capture_end, instantiate, replay,
reset and the raw handles of torch.cuda.CUDAGraph once per process (wrap()
does it for a class); set_keep() says whether graphs made from now on are
kept. The hooks never raise on understudy's account: a failure leaves the
graph as torch made it, its replays decided on the device.
"""
from __future__ import annotations

import json
import sys
import threading
import weakref

_installed = False
_pool_wrapped = False
_keep = False  # graphs made from now on are kept for gating
_enabled = False  # understudy is enabled: a capture begun now is seen
_generation = 0  # enables so far: a graph seen (or said unseen) under an earlier one is unseen by this one
_install_lock = threading.Lock()


# torch's modules that read a graph's raw handles and change nothing with them
_READERS = frozenset(("torch.cuda.graphs", "torch.cuda._graph_annotations"))
_HANDLES = frozenset(("raw_cuda_graph", "raw_cuda_graph_exec", "_raw_cuda_graph", "_raw_cuda_graph_exec"))


def _caller_module(graph) -> str:
    """The module of the code that asked graph for a raw handle: the first
    frame above the hook that is not a raw-handle method of the same graph
    (a subclass overriding one and calling super() is not the caller).
    "" where no Python frame called (C++, a thread's start): outside."""
    try:
        frame = sys._getframe(2)
    except ValueError:
        return ""
    while frame is not None and frame.f_code.co_name in _HANDLES and frame.f_locals.get("self") is graph:
        frame = frame.f_back
    return (frame.f_globals.get("__name__") or "") if frame is not None else ""


def wants_keep(config_text: str) -> bool:
    """Whether an enable with this config keeps the graphs made meanwhile:
    an operator names a native candidate (only a native candidate's shadow
    goes into a graph) and shadow.graph_gate is not "device"."""
    try:
        cfg = json.loads(config_text) if config_text else {}
        if not isinstance(cfg, dict):
            return False
        shadow = cfg.get("shadow")
        if isinstance(shadow, dict) and shadow.get("graph_gate") == "device":
            return False
        ops = cfg.get("operators")
        return isinstance(ops, dict) and any(isinstance(o, dict) and isinstance(o.get("candidate"), dict) and
                                             "native" in o["candidate"] for o in ops.values())
    except (ValueError, TypeError, RecursionError):
        return False


def set_keep(keep: bool) -> None:
    global _keep
    _keep = bool(keep)


def set_enabled(enabled: bool) -> None:
    global _enabled, _generation
    if enabled and not _enabled:
        _generation += 1
    _enabled = bool(enabled)


def _unbind(graph, lib) -> None:
    """The graph's executable no longer gated (about to be made again, or
    reset)."""
    fin = graph.__dict__.pop("_understudy_unbind", None)
    graph.__dict__.pop("_understudy_exec", None)
    if fin is not None:
        fin()  # once: ust_graph_unbind(exec)


def _bind(graph, lib, raw) -> None:
    """After an instantiation: the executable gated from the host when its
    graph holds such a shadow (of the capture that made it: a shadow of a
    graph since destroyed at the same address is of another). A kept graph
    not instantiated yet is bound after its first replay (torch instantiates
    it there). raw: the class's own raw_cuda_graph and raw_cuda_graph_exec
    (asking them is not handing the graph out)."""
    try:
        handle = raw[0](graph)  # only a kept graph has one
    except Exception:  # noqa: BLE001 - nothing understudy can gate
        return
    try:
        exec_ = raw[1](graph)  # only an instantiated one has one
    except Exception:  # noqa: BLE001
        exec_ = 0
    capture = graph.__dict__.get("_understudy_capture", 0)
    graph._understudy_lazy = bool(capture) and not exec_
    if not exec_:
        return
    try:
        _unbind(graph, lib)
        if handle and exec_ and capture and lib.ust_graph_bind(handle, capture, exec_) > 0:
            fin = weakref.finalize(graph, lib.ust_graph_unbind, exec_)
            graph._understudy_unbind = fin
            graph._understudy_exec = exec_
    except Exception:  # noqa: BLE001 - the graph stays as torch made it
        pass


def install(lib) -> bool:
    """Wraps torch.cuda.CUDAGraph and torch._C's pool hooks (once per
    process). False where this torch has no graph object with raw handles
    and keep_graph (then every replay is decided on the device)."""
    global _installed, _pool_wrapped
    with _install_lock:
        if _installed:
            return True
        try:
            import torch
            cls = torch.cuda.CUDAGraph
        except (ImportError, AttributeError):
            return False
        if not _pool_wrapped:
            _pool_wrapped = wrap_pool(torch._C, lib)
        _installed = wrap(cls, lib)
        return _installed


_POOL_NAMES = ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool")


_pool_thread = threading.local()  # per thread: the pools its allocations go to, as the hooks saw


def _pools() -> set:
    pools = getattr(_pool_thread, "pools", None)
    if pools is None:
        pools = _pool_thread.pools = set()
    return pools


def _pool_key(pool):
    try:
        return tuple(pool)
    except TypeError:
        return pool


def _pool_begun(lib, pool) -> None:
    """The thread's allocations go to pool: said once per pool."""
    pools, key = _pools(), _pool_key(pool)
    if key not in pools:
        pools.add(key)
        lib.ust_pool_alloc_begun()


def pool_ended(lib, pool) -> None:
    """They no longer go to pool (a pool never begun here: nothing)."""
    pools, key = _pools(), _pool_key(pool)
    if key in pools:
        pools.discard(key)
        lib.ust_pool_alloc_ended()


def wrap_pool(mod, lib) -> bool:
    """Wraps mod's (torch._C's) functions that route the calling thread's
    allocations to a graph's pool and end that, so that the library knows
    (ust_pool_alloc_begun after the first returned, ust_pool_alloc_ended
    after the second, whether it raised or not; once per pool, so that
    ending a pool the thread never began, or beginning one twice, moves
    nothing); False, and mod untouched, where it or the library lacks one
    of them. A capture's end, which ends its pool inside torch, is said by
    the CUDAGraph hooks (pool_ended)."""
    begun, ended = getattr(lib, "ust_pool_alloc_begun", None), getattr(lib, "ust_pool_alloc_ended", None)
    if begun is None or ended is None or not all(callable(getattr(mod, n, None)) for n in _POOL_NAMES):
        return False
    begin, end = (getattr(mod, n) for n in _POOL_NAMES)

    def _begin(device, pool, *args, **kwargs):
        out = begin(device, pool, *args, **kwargs)
        try:
            _pool_begun(lib, pool)
        except Exception:  # noqa: BLE001 - its calls keep what they keep
            pass
        return out

    def _end(device, pool, *args, **kwargs):
        try:
            return end(device, pool, *args, **kwargs)
        finally:
            try:
                pool_ended(lib, pool)
            except Exception:  # noqa: BLE001
                pass

    _begin.__wrapped__, _end.__wrapped__ = begin, end
    setattr(mod, _POOL_NAMES[0], _begin)
    setattr(mod, _POOL_NAMES[1], _end)
    return True


_NAMES = ("__init__", "capture_begin", "capture_end", "instantiate", "replay", "reset", "raw_cuda_graph",
          "raw_cuda_graph_exec")


def wrap(cls, lib) -> bool:
    """Wraps cls's methods (torch.cuda.CUDAGraph's, or a class that
    behaves as it does) with the hooks; False, and cls untouched, where it
    lacks one of them."""
    import torch
    if not all(hasattr(cls, n) for n in _NAMES):
        return False
    init, capture_begin, capture_end, instantiate, replay, reset, raw_graph, raw_exec = (getattr(cls, n)
                                                                                         for n in _NAMES)
    raw = (raw_graph, raw_exec)
    gate, replayed = lib.ust_graph_replay, lib.ust_graph_replayed
    unseen = getattr(lib, "ust_graph_unseen", None)
    capture_id = getattr(lib, "ust_graph_capture_id", None)
    exposed = getattr(lib, "ust_graph_exposed", None)
    begun, ended = getattr(lib, "ust_graph_capture_begun", None), getattr(lib, "ust_graph_capture_ended", None)

    def _init(self, *args, **kwargs):
        owner_keeps = kwargs.get("keep_graph", args[0] if args else False)
        if _keep and not owner_keeps and len(args) + len(kwargs) <= 1 and set(kwargs) <= {"keep_graph"}:
            try:
                init(self, True)
                self._understudy_instantiates = self._understudy_kept = True
                return
            except TypeError:  # a constructor without keep_graph: as its owner asked
                pass
        init(self, *args, **kwargs)
        if owner_keeps:
            self._understudy_kept = True

    def _capture_begin(self, *args, **kwargs):
        capture_begin(self, *args, **kwargs)
        # the thread's calls keyed one by one until it ends (none tallied):
        # their nodes map to routes; said whether enabled or not, a capture
        # may outlive either
        if begun is not None and not self.__dict__.get("_understudy_capturing"):
            try:
                begun()
                self._understudy_capturing = True
            except Exception:  # noqa: BLE001 - its calls tallied like any others
                pass
        # its calls pass this enable's dispatcher hooks while it captures
        self._understudy_seen = _generation if _enabled else None
        self._understudy_capture = 0
        if not self.__dict__.get("_understudy_kept"):
            # torch drops its graph once instantiated: nothing of it can be
            # gated; the capture's id, which closes its calls if it is handed out
            try:
                if _enabled and capture_id is not None:
                    device = torch.cuda.current_device()
                    self._understudy_capture = capture_id(torch.cuda.current_stream(device).cuda_stream)
            except Exception:  # noqa: BLE001
                pass
            return
        try:  # the capture's id, which its shadows carry; they are started by the host behind its replays
            device = torch.cuda.current_device()
            self._understudy_capture = lib.ust_graph_capture_hosted(torch.cuda.current_stream(device).cuda_stream)
            self._understudy_device = device
        except Exception:  # noqa: BLE001 - nothing of it gated
            self._understudy_capture = 0

    def _capture_end(self):
        try:
            capture_end(self)
        finally:
            if self.__dict__.pop("_understudy_capturing", False):
                try:
                    ended()
                except Exception:  # noqa: BLE001
                    pass
            try:  # torch ended the capture's pool for the thread, whatever began it
                pool_ended(lib, self.pool())
            except Exception:  # noqa: BLE001
                pass
        if self.__dict__.get("_understudy_instantiates"):
            instantiate(self)  # where torch would have
        _bind(self, lib, raw)

    def _instantiate(self):
        try:
            _unbind(self, lib)  # torch destroys the executable it replaces
        except Exception:  # noqa: BLE001
            pass
        instantiate(self)
        _bind(self, lib, raw)

    def _replay(self):
        d = self.__dict__
        if _enabled and d.get("_understudy_seen") != _generation and unseen is not None:
            try:  # a graph this enable did not see captured: said once per graph and enable
                if unseen() == 1:
                    d["_understudy_seen"] = _generation
            except Exception:  # noqa: BLE001
                pass
        exec_ = d.get("_understudy_exec")
        if exec_ is None:
            replay(self)
            if d.pop("_understudy_lazy", False):  # torch instantiated it just now
                _bind(self, lib, raw)
            return
        try:
            stream = torch.cuda.current_stream(d.get("_understudy_device")).cuda_stream  # where torch replays it
            after = gate(exec_, stream)
        except Exception:  # noqa: BLE001 - replayed as torch would
            after = 0
        replay(self)
        if after:  # the bodies of the shadows this replay verifies, behind it
            try:
                replayed(exec_, stream)
            except Exception:  # noqa: BLE001
                pass

    def _reset(self):
        try:
            _unbind(self, lib)
        except Exception:  # noqa: BLE001 - reset as torch does, whatever understudy says
            pass
        reset(self)

    def _handed_out(self):
        """A raw handle asked for by code outside understudy and torch's
        own readers (torch.cuda.graphs' get_graph_data, torch's graph
        annotations: they only read a graph through them): the calls with
        a candidate its capture holds run production alone (before the
        caller has it). Once per graph object and capture."""
        d = self.__dict__
        capture = d.get("_understudy_capture", 0)
        if not capture or exposed is None or d.get("_understudy_handed") == capture:
            return
        if _caller_module(self) in _READERS:
            return
        d["_understudy_handed"] = capture
        try:
            exposed(capture)
        except Exception:  # noqa: BLE001
            pass

    def _raw_cuda_graph(self):
        handle = raw_graph(self)
        _handed_out(self)
        return handle

    def _raw_cuda_graph_exec(self):
        handle = raw_exec(self)
        _handed_out(self)
        return handle

    new = (_init, _capture_begin, _capture_end, _instantiate, _replay, _reset, _raw_cuda_graph, _raw_cuda_graph_exec)
    for fn, old in zip(new, (init, capture_begin, capture_end, instantiate, replay, reset, raw_graph, raw_exec)):
        fn.__name__, fn.__qualname__, fn.__doc__ = old.__name__, getattr(old, "__qualname__", old.__name__), \
            old.__doc__
        fn.__wrapped__ = old
    for name, fn in zip(_NAMES, new):  # a Python class: setting its attributes does not fail
        setattr(cls, name, fn)
    return True
