"""Candidates from files: an entry point in a Python file, as agents write them.

    understudy candidate add kernels/rms.py::ModelNew --like _C::rms_norm

An entry is a function (KernelAgent's `kernel_function`, AutoKernel's
`kernel_fn`, any `run`) or a class whose instances are called (KernelBench's
`ModelNew`, an nn.Module: built once with `init` or the file's
`get_init_inputs()`, moved to the call's device, its `forward` called). Its
parameters are mapped onto the target's arguments and its results onto what
the target writes and returns (understudy.adapt); the result is a torch op
with the target's schema, which the engine runs as any torch-op candidate.

The file is named in the config by its path, entry and SHA-256, and run only
from the bytes hashed. With qualify "process" (the default of `candidate
add`) the serving process does not run the file at first: the op's overload
`qualify` sends each call's arguments (the engine's private copies) to a
Python process of its own that loaded the file, and brings back what it
wrote and returned, to be judged as any shadow call. The engine serves a
route from the op itself, which loads the file here, once q_calls shadows of
that route passed (candidate.qualify_calls). A crash, a hang past the
deadline or a broken answer there fails that call (the route rolls back,
with the evidence) and the child is not used again.
"""
from __future__ import annotations

import hashlib
import inspect
import io
import linecache
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from . import adapt

NAMESPACE = "understudy_file"
_ENTRY_GUESSES = ("ModelNew", "kernel_function", "kernel_fn", "run")


class FileCandidateError(ValueError):
    """A file candidate cannot be made: the message names the file, the entry and what is wrong."""


@dataclass
class FileSpec:
    """A file candidate as the config names it."""

    path: str
    entry: str
    target: str
    sha256: Optional[str] = None
    args: Dict[str, str] = field(default_factory=dict)
    style: Optional[str] = None
    init: Any = None
    qualify: str = "process"
    qualify_calls: int = 3
    deadline_ms: float = 10000.0

    def label(self, digest: str) -> str:
        return f"file {os.path.basename(self.path)}::{self.entry} sha256:{digest[:12]}"


def split_ref(ref: str):
    """"FILE::ENTRY" -> (FILE, ENTRY); "FILE" -> (FILE, None)."""
    path, sep, entry = ref.rpartition("::")
    if not sep:
        return ref, None
    return path, entry or None


def read_pinned(path: str, sha256: Optional[str]):
    """The file's bytes and their SHA-256, refused when it differs from the pin."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FileCandidateError(f"candidate file '{path}' cannot be read: {e.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256.lower():
        raise FileCandidateError(f"candidate file '{path}' has SHA-256 {digest}, not the pinned {sha256}: it changed "
                                 "since it was added; add it again to pin the new bytes")
    return data, digest


def load_module(path: str, data: bytes, digest: str) -> types.ModuleType:
    """Execute the file's bytes as a module of its own (its folder on
    sys.path while it runs, so that it may import its neighbours); the
    source that tools read back (inspect, Triton) is the bytes executed."""
    name = f"_understudy_file_{digest[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    try:
        code = compile(data, path, "exec")
    except SyntaxError as e:
        raise FileCandidateError(f"candidate file '{path}' is not valid Python: {e.msg} (line {e.lineno})") from None
    module = types.ModuleType(name)
    module.__file__ = path
    text = data.decode("utf-8", errors="replace")
    linecache.cache[path] = (len(data), None, text.splitlines(True), path)
    folder = os.path.dirname(path)
    sys.modules[name] = module
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        exec(code, module.__dict__)
    except BaseException as e:
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise FileCandidateError(f"candidate file '{path}' raised while it was loaded: {type(e).__name__}: {e}") \
            from None
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def pick_entry(module: types.ModuleType, path: str, entry: Optional[str]) -> str:
    if entry:
        if not hasattr(module, entry):
            found = [n for n in _ENTRY_GUESSES if hasattr(module, n)]
            raise FileCandidateError(f"candidate file '{path}' defines no '{entry}'"
                                     + (f" (it defines {', '.join(found)})" if found else ""))
        return entry
    found = [n for n in _ENTRY_GUESSES if hasattr(module, n)]
    if len(found) != 1:
        raise FileCandidateError(f"candidate file '{path}': name the entry as FILE::ENTRY"
                                 + (f" (it defines {', '.join(found)})" if found else
                                    f" (none of {', '.join(_ENTRY_GUESSES)} is defined)"))
    return found[0]


class _ModuleEntry:
    """A class entry (KernelBench's ModelNew): one instance, built once,
    moved to each call's device on its first call there; called as its
    forward."""

    def __init__(self, cls, init, module, label):
        args, kwargs = [], {}
        if init is None and hasattr(module, "get_init_inputs"):
            try:
                init = list(module.get_init_inputs())
            except Exception as e:
                raise FileCandidateError(f"{label}: get_init_inputs() raised {type(e).__name__}: {e}") from None
        if isinstance(init, dict):
            kwargs = dict(init)
        elif init is not None:
            args = list(init)
        try:
            self.instance = cls(*args, **kwargs)
        except TypeError as e:
            raise FileCandidateError(f"{label}: cannot be built ({e}); give its constructor's arguments as init "
                                     "(KernelBench's get_init_inputs())") from None
        except Exception as e:
            raise FileCandidateError(f"{label}: its constructor raised {type(e).__name__}: {e}") from None
        fwd = getattr(self.instance, "forward", None) or getattr(self.instance, "__call__")
        self.forward = fwd
        self.__signature__ = inspect.signature(fwd)
        self._lock = threading.Lock()
        self._on = set()

    def __call__(self, *args):
        to = getattr(self.instance, "to", None)
        dev = next((a.device for a in args if hasattr(a, "device") and hasattr(a, "dtype")), None)
        if to is not None and dev is not None and dev not in self._on:
            with self._lock:
                if dev not in self._on:
                    self.instance = to(dev) or self.instance
                    self.forward = getattr(self.instance, "forward")
                    self._on.add(dev)
        return self.forward(*args)


def build_impl(spec: FileSpec, target: adapt.Target, digest_out: Optional[list] = None):
    """Load the file (pinned) and adapt its entry to target. Returns (impl,
    info): impl takes the target's arguments; info says what was made."""
    data, digest = read_pinned(spec.path, spec.sha256)
    if digest_out is not None:
        digest_out.append(digest)
    module = load_module(spec.path, data, digest)
    name = pick_entry(module, spec.path, spec.entry)
    obj = getattr(module, name)
    label = f"{spec.path}::{name}"
    if inspect.isclass(obj):
        fn, form = _ModuleEntry(obj, spec.init, module, label), "module"
    elif callable(obj):
        fn, form = obj, "function"
    else:
        raise FileCandidateError(f"{label} is a {type(obj).__name__}, not a function or a class")
    try:
        a = adapt.build(target, fn, entry_name=label, args=spec.args, style=spec.style)
    except adapt.AdaptError as e:
        raise FileCandidateError(str(e)) from None
    info = {"entry": name, "form": form, "sha256": digest, **a.describe()}
    return a.wrap(fn), info


# ---- the qualifying process ------------------------------------------------------------

def _send(sock: socket.socket, obj) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    sock.sendall(struct.pack("<Q", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> Optional[bytes]:
    chunks = []
    while n > 0:
        b = sock.recv(min(n, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _recv(sock: socket.socket):
    """A message, loaded without running code from it (weights_only); None at EOF."""
    import torch

    head = _recv_exact(sock, 8)
    if head is None:
        return None
    (n,) = struct.unpack("<Q", head)
    if n > (64 << 30):
        raise ValueError(f"a message of {n} bytes")
    data = _recv_exact(sock, n)
    if data is None:
        return None
    return torch.load(io.BytesIO(data), weights_only=True)


class ChildRunner:
    """The serving side of one qualifying process: it loaded the candidate
    (a file's entry, a Solution) and runs calls sent to it, one at a time.
    Lost for good on a crash, a hang past the deadline or a broken answer;
    every later call then raises. label names the candidate in messages;
    hello is the first message (understudy.filehost reads it), the
    target's schema added; a candidate the process cannot load raises
    error."""

    def __init__(self, label: str, hello: dict, target: adapt.Target, *, deadline_ms: float = 10000.0,
                 start_timeout_s: float = 300.0, error: type = FileCandidateError):
        self.label, self.target, self.deadline_ms = label, target, deadline_ms
        self.lost: Optional[str] = None
        self.runs = 0
        self._lock = threading.Lock()
        parent, child = socket.socketpair()
        self._sock = parent
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("UNDERSTUDY_CONFIG", None)  # the child runs the candidate, not understudy
        env.pop("UNDERSTUDY_CANDIDATE_MODULES", None)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "understudy.filehost", str(child.fileno())],
                                         pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            child.close()
        _children.append(self)
        self._sock.settimeout(start_timeout_s)
        try:
            _send(self._sock, {**hello, "schema": target.schema})
            reply = _recv(self._sock)
        except (OSError, socket.timeout) as e:
            reply = None
            why = f"it did not answer within {start_timeout_s:.0f} s ({e})"
        else:
            why = None
        if reply is None:
            why = why or self._ended("while it loaded the candidate")
            self.stop()
            raise error(f"{label}: its qualifying process failed: {why}")
        if not reply.get("ok"):
            self.stop()
            raise error(reply.get("error", "its qualifying process refused it"))
        self.info = reply.get("info", {})
        self.pid = self.proc.pid

    def _ended(self, when: str) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return f"it closed its socket {when}"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"it was killed by {name} {when}"
        return f"it exited with status {rc} {when}"

    def stop(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _lose(self, why: str) -> None:
        self.lost = why
        self.stop()

    def __call__(self, *args, **kwargs):
        import torch

        vals = adapt.positional(self.target, args, kwargs)
        label = self.label
        with self._lock:
            if self.lost is not None:
                raise RuntimeError(f"{label} was refused in its qualifying process: {self.lost}")
            self.runs += 1
            self._sock.settimeout(self.deadline_ms / 1000.0)
            try:
                _send(self._sock, {"args": vals})
                reply = _recv(self._sock)
            except socket.timeout:
                self._lose(f"it did not answer within {self.deadline_ms:.0f} ms and was killed")
                raise RuntimeError(f"{label}: {self.lost}") from None
            except Exception as e:
                why = self._ended("during a call") if isinstance(e, OSError) else f"a broken answer ({e})"
                self._lose(why)
                raise RuntimeError(f"{label}: in its qualifying process {why}") from None
            if reply is None:
                self._lose(self._ended("during a call"))
                raise RuntimeError(f"{label}: in its qualifying process {self.lost}")
        if not reply.get("ok"):
            raise RuntimeError(f"{label} (in its qualifying process): {reply.get('error')}")
        for i, t in reply.get("written", {}).items():
            dst = vals[int(i)]
            if not isinstance(t, torch.Tensor) or t.shape != dst.shape or t.dtype != dst.dtype:
                raise RuntimeError(f"{label}: its qualifying process sent back '{self.target.args[int(i)].name}' "
                                   "of another shape or dtype")
            dst.copy_(t)
        ret = reply.get("ret")
        if all(a is None for a in self.target.return_aliases):
            return ret
        # a return that aliases a written argument is the caller's argument itself
        rets = list(ret) if isinstance(ret, (tuple, list)) else [ret]
        out = [vals[a] if a is not None else r for a, r in zip(self.target.return_aliases, rets)]
        return out[0] if len(out) == 1 else tuple(out)


_children: List[ChildRunner] = []


def spawn(spec: FileSpec, target: adapt.Target, *, start_timeout_s: float = 300.0) -> ChildRunner:
    """The qualifying process of a file's entry."""
    hello = {"kind": "file", "path": spec.path, "entry": spec.entry, "sha256": spec.sha256, "args": spec.args,
             "style": spec.style, "init": spec.init}
    return ChildRunner(f"{spec.path}::{spec.entry}", hello, target, deadline_ms=spec.deadline_ms,
                       start_timeout_s=start_timeout_s)


def _stop_children() -> None:
    for c in _children:
        c.stop()


import atexit  # noqa: E402

atexit.register(_stop_children)


# ---- registration ----------------------------------------------------------------------

@dataclass
class Registered:
    op: str                   # "understudy_file::name", the torch op the config names
    spec: FileSpec
    digest: str
    info: dict
    child: Optional[ChildRunner] = None

    def source(self) -> dict:
        src = {"kind": "file", "label": self.spec.label(self.digest), "path": self.spec.path,
               "entry": self.info.get("entry", self.spec.entry), "form": self.info.get("form"),
               "sha256": self.digest, "target": self.spec.target, "style": self.info.get("style"),
               "args": self.info.get("args", {})}
        if self.info.get("ignores"):
            src["ignores"] = self.info["ignores"]
        return src

    def entry(self) -> dict:
        """The config's candidate entry that the engine reads."""
        e = {"torch_op": self.op, "target": self.spec.target, "source": self.source()}
        if self.spec.qualify == "process":
            e["qualify"] = "process"
            e["qualify_calls"] = self.spec.qualify_calls
        return e


_registered: Dict[str, Registered] = {}
_reg_lock = threading.RLock()


def op_name(path: str, entry: str, digest: str) -> str:
    stem = re.sub(r"[^a-z0-9_]", "_", os.path.splitext(os.path.basename(path))[0].lower())[:40]
    ent = re.sub(r"[^a-z0-9_]", "_", entry.lower())[:40]
    return f"{stem}_{ent}_{digest[:12]}"


def register(spec: FileSpec) -> Registered:
    """Define the file's torch op (and, with qualify "process", its
    overload `qualify` with the process that runs it). The same file, entry
    and target registered again returns what was registered the first time.
    Raises FileCandidateError naming what is wrong."""
    from .candidates import _define

    spec.path = os.path.abspath(spec.path)
    try:
        target = adapt.target_named(spec.target)
    except ValueError as e:
        raise FileCandidateError(f"{spec.path}::{spec.entry}: --like/target {e}") from None
    if spec.qualify not in ("here", "process"):
        raise FileCandidateError(f"qualify must be 'here' or 'process', not {spec.qualify!r}")
    _, digest = read_pinned(spec.path, spec.sha256)
    spec.sha256 = digest
    key = f"{spec.path}|{spec.entry}|{digest}|{spec.target}|{spec.qualify}|{sorted(spec.args.items())}|{spec.style}"
    with _reg_lock:
        if key in _registered:  # the same op; how many calls qualify a route is the entry's own
            reg = _registered[key]
            reg.spec.qualify_calls = spec.qualify_calls
            return reg
        child = None
        if spec.qualify == "process":
            child = spawn(spec, target)
            info, impl_here = child.info, _lazy_here(spec, target)
        else:
            impl_here, info = build_impl(spec, target)
        name = op_name(spec.path, info.get("entry") or spec.entry or "entry", digest)
        if spec.entry is None:
            spec.entry = info.get("entry")
        suffix = 0
        op = name
        while _defined(f"{NAMESPACE}::{op}"):
            suffix += 1
            op = f"{name}_{suffix}"
        _define(NAMESPACE, op, impl_here, spec.target)
        if child is not None:
            _define(NAMESPACE, op + ".qualify", child, spec.target)
        reg = Registered(f"{NAMESPACE}::{op}", spec, digest, info, child)
        _registered[key] = reg
        return reg


def register_later(spec: FileSpec) -> dict:
    """For a target not defined yet (vLLM's _C ops load after understudy is
    enabled at start-up): the config entry now, its torch op named from the
    pinned file and entry, and the op registered by a thread that waits for
    the target (the engine counts the calls until then as waiting for the
    op). A file that cannot be made a candidate then is one line on stderr."""
    spec.path = os.path.abspath(spec.path)
    if not spec.entry:
        raise FileCandidateError(f"'{spec.path}': name the entry (FILE::ENTRY) of a candidate whose target "
                                 f"{spec.target} is not defined yet")
    _, digest = read_pinned(spec.path, spec.sha256)
    spec.sha256 = digest
    name = op_name(spec.path, spec.entry, digest)
    if _defined(f"{NAMESPACE}::{name}"):
        raise FileCandidateError(f"{NAMESPACE}::{name} is defined already, for another target")

    def wait():
        import time
        while not _defined(spec.target):
            time.sleep(0.2)
        try:
            register(spec)
        except Exception as e:
            sys.stderr.write(f"understudy: candidate {spec.path}::{spec.entry} for {spec.target}: {e}\n")

    threading.Thread(target=wait, name="understudy-file-candidate", daemon=True).start()
    reg = Registered(f"{NAMESPACE}::{name}", spec, digest, {"entry": spec.entry})
    return reg.entry()


def _defined(op: str) -> bool:
    """Whether the dispatcher op ("ns::name" or "ns::name.overload") is defined."""
    import torch

    qual, _, overload = op.partition(".")
    try:
        torch._C._get_schema(qual, overload)
        return True
    except RuntimeError:
        return False


def lazy(build: Callable[[], Callable]) -> Callable:
    """An op's implementation in this process, made by build() at its first
    call (a file or Solution candidate loaded here once a route qualified it
    in its own process)."""
    lock = threading.Lock()
    state: Dict[str, Callable] = {}

    def impl(*args, **kwargs):
        fn = state.get("impl")
        if fn is None:
            with lock:
                fn = state.get("impl")
                if fn is None:
                    fn = state["impl"] = build()
        return fn(*args, **kwargs)

    return impl


def _lazy_here(spec: FileSpec, target: adapt.Target) -> Callable:
    """The file loaded here (from the pinned bytes) at the op's first call."""
    return lazy(lambda: build_impl(spec, target)[0])


def from_file(ref: str, *, like: str, sha256: Optional[str] = None, args: Optional[Dict[str, str]] = None,
              style: Optional[str] = None, init: Any = None, qualify: str = "process", qualify_calls: int = 3,
              deadline_ms: float = 10000.0) -> dict:
    """Make a candidate of an entry point in a file and return its config
    entry (for operators.<name>.candidate).

    ref: "FILE::ENTRY" (ENTRY may be left out when the file defines one of
    ModelNew, kernel_function, kernel_fn, run). like: the op it stands in
    for, defined in this process. sha256: the pin (default: the file's
    current digest). args: {parameter: target argument} where names differ
    beyond the common aliases. style: "value" or "destination" (default:
    from the parameters). init: a class entry's constructor arguments (a
    list or a dict; default: the file's get_init_inputs(), else none).
    qualify: "process" (runs in a process of its own until a route
    qualified it) or "here". Raises FileCandidateError naming what is wrong.
    """
    path, entry = split_ref(ref)
    spec = FileSpec(path=path, entry=entry, target=like, sha256=sha256, args=dict(args or {}), style=style,
                    init=init, qualify=qualify, qualify_calls=int(qualify_calls), deadline_ms=float(deadline_ms))
    return register(spec).entry()


def check(ref: str, *, like_schema: str, sha256: Optional[str] = None, args=None, style=None, init=None,
          start_timeout_s: float = 300.0) -> dict:
    """Load and adapt the file in a process of its own (never here): what
    the entry is and how it maps onto the target, or FileCandidateError."""
    path, entry = split_ref(ref)
    spec = FileSpec(path=os.path.abspath(path), entry=entry, target="", sha256=sha256, args=dict(args or {}),
                    style=style, init=init)
    _, digest = read_pinned(spec.path, sha256)
    spec.sha256 = digest
    child = spawn(spec, adapt.target_of(like_schema), start_timeout_s=start_timeout_s)
    child.stop()
    return {"sha256": digest, **child.info}


# ---- adding a file to a config -------------------------------------------------------

def operator_binding(target: str, problems=None) -> Optional[str]:
    """The operator whose definition binds target ("_C::rms_norm" ->
    "rms_norm"), among the definitions in problems (default: the shipped)."""
    import json
    import pathlib

    from . import problems_dir

    qual, _, overload = target.partition(".")
    for f in sorted(pathlib.Path(problems or problems_dir()).glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for b in doc.get("bindings", []) if isinstance(doc, dict) else []:
            if b.get("op") == qual and overload in b.get("overloads", [""]):
                return doc.get("operator")
    return None


def add(ref: str, *, like: str, schema: Optional[str] = None, config: Optional[str] = None,
        operator: Optional[str] = None, mode: Optional[str] = "shadow", sample: Optional[float] = None,
        args: Optional[Dict[str, str]] = None, style: Optional[str] = None, init: Any = None,
        qualify: str = "process", qualify_calls: int = 3, check_first: bool = True, problems=None) -> dict:
    """Name a file's entry point as the candidate of an operator, pinned to
    the file's bytes now, and return {"operator": NAME, "entry": {...}}:
    the operator's config entry (its candidate {"file", "entry", "sha256",
    "target", ...}). config: a JSON config file to write it into (made when
    missing; its other fields kept), atomically. check_first: load and
    adapt the entry in a process of its own first (the schema of like must
    be known here: an op defined in this process, or schema=TEXT), so that
    a bad file or entry is refused now, with the reason."""
    import json

    path, entry = split_ref(ref)
    path = os.path.abspath(path)
    _, digest = read_pinned(path, None)
    info = {}
    if check_first:
        if schema is None:
            try:
                schema = adapt.target_named(like).schema
            except ValueError as e:
                raise FileCandidateError(f"--like {e}: import what defines it, or give its schema") from None
        info = check(ref, like_schema=schema, sha256=digest, args=args, style=style, init=init)
        entry = entry or info.get("entry")
    if entry is None:
        raise FileCandidateError(f"name the entry of '{path}' as FILE::ENTRY")
    op = operator or operator_binding(like, problems)
    if op is None:
        raise FileCandidateError(f"no operator definition binds '{like}': name one with --operator")
    cand = {"file": path, "entry": entry, "sha256": digest, "target": like, "qualify": qualify}
    if qualify == "process":
        cand["qualify_calls"] = int(qualify_calls)
    if args:
        cand["args"] = dict(args)
    if style:
        cand["style"] = style
    if init is not None:
        cand["init"] = init
    op_entry: Dict[str, Any] = {}
    doc: Dict[str, Any] = {}
    if config is not None and os.path.exists(config):
        try:
            with open(config) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise FileCandidateError(f"config '{config}' cannot be read as JSON: {e}") from None
        if not isinstance(doc, dict):
            raise FileCandidateError(f"config '{config}' is not a JSON object")
        old = (doc.get("operators") or {}).get(op)
        op_entry = dict(old) if isinstance(old, dict) else ({"mode": old} if isinstance(old, str) else {})
    if mode is not None:
        op_entry["mode"] = mode
    if sample is not None:
        op_entry["sample"] = sample
    op_entry["candidate"] = cand
    if config is not None:
        doc.setdefault("operators", {})
        if not isinstance(doc["operators"], dict):
            raise FileCandidateError(f"config '{config}': 'operators' is not an object")
        doc["operators"][op] = op_entry
        tmp = f"{config}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, config)
    return {"operator": op, "entry": op_entry, "checked": info}
