"""Hub layers: the forward `kernels.kernelize` put on a module, guarded.

The Hugging Face `kernels` package swaps a module's `forward` once, at
`kernelize`, for a layer's from a kernel repository (transformers maps its
`RMSNorm` to `kernels-community/liger-kernels:LigerRMSNorm` on CUDA), and
never looks again; the swap registers no dispatcher op, so nothing beneath
the module sees it. guard_kernelized(model) lifts each such module into two
opaque ops with one schema, the module's activations then its parameters
and buffers:

    understudy_hub::<name>_<id>(Tensor hidden_states, Tensor weight) -> Tensor    the original forward
    understudy_hub::<name>_<id>_c(Tensor hidden_states, Tensor weight) -> Tensor  the hub layer's forward

and installs a forward that calls the first. Production is the original
forward and the candidate the hub kernel (reverse=True: the other way
round, for a team that serves the hub kernel and checks it against the
reference). The module's scalar attributes (an epsilon) are part of <name>,
so they join every route's key; <id> is a digest of the hub layer, its
revision and the direction. Each lifted op is an operator of its own
(`hub_<name>`), defined in a folder of definitions made for the process,
and its candidate carries the kernel's repository and revision, found
through kernels.get_loaded_kernels().

Calls that need gradients, and modules whose forward returns anything but
one tensor, are served by the forward that would have served them, never
through the ops.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import pathlib
import re
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

NAMESPACE = "understudy_hub"


class HubError(ValueError):
    """A kernelized module cannot be guarded: the message names it and why."""


@dataclass
class Lifted:
    """One lifted op: a class of module with one set of scalar attributes."""

    name: str                    # the op's name in NAMESPACE, also the operator's after "hub_"
    layer: str                   # the class's kernel_layer_name
    cls: type
    attrs: Dict[str, Any]
    acts: List[str]              # the forward's activations
    params: List[str]            # parameters then buffers, as named in the module
    reverse: bool
    source: dict                 # the hub kernel: repo, revision, layer, kernel id
    hub_id: str                  # a digest of the hub layer's forward and revision, naming its op
    modules: List[Any] = field(default_factory=list)  # weak references to the modules it serves
    # whether the forward returns one tensor, learned from the op's first call (served without the op)
    checked: Dict[str, Any] = field(default_factory=lambda: {"ok": None})

    @property
    def operator(self) -> str:
        return f"hub_{self.name}_{self.hub_id}"

    @property
    def production_op(self) -> str:
        return f"{NAMESPACE}::{self.name}_{self.hub_id}"

    @property
    def candidate_op(self) -> str:
        return f"{NAMESPACE}::{self.name}_{self.hub_id}_c"

    def alive(self) -> bool:
        return any(m() is not None for m in self.modules)

    def definition(self) -> dict:
        a0 = self.acts[0]
        binding = {"op": self.production_op, "key": {"M": f"rows({a0})", "N": f"{a0}[-1]"}}
        if "rmsnorm" in self.layer.lower().replace("_", "") and self.params == ["weight"]:
            # the rms_norm operator's floor, over the lifted op's arguments
            binding["roofline"] = {"vars": {"M": f"rows({a0})", "N": f"{a0}[-1]", "Bi": f"bytes({a0})",
                                            "Bw": "bytes(weight)", "Ni": f"nbytes({a0})"},
                                   "W": "3*M*N + M", "W_dtype": a0, "Q_read": "Bi + Bw", "Q_write": "Ni"}
        served = "the hub layer" if self.reverse else "the original forward"
        return {"schema_version": 1, "operator": self.operator,
                "description": f"{self.cls.__name__} ({self.layer}) lifted by understudy.guard_kernelized: "
                               f"production is {served}; attributes {self.attrs}",
                "bindings": [binding], "bucket": {"M": "pow2"}}

    def candidate(self) -> dict:
        src = dict(self.source)
        if self.reverse:
            src = {"kind": "reference", "label": f"original {self.cls.__module__}.{self.cls.__qualname__}.forward",
                   "checks": self.source}
        return {"torch_op": self.candidate_op, "target": self.production_op, "source": src}


_lock = threading.RLock()
_lifted: Dict[str, Lifted] = {}
_calling = threading.local()  # the module whose lifted forward is calling its op, on this thread


def lifted() -> List[Lifted]:
    with _lock:
        return list(_lifted.values())


def _enc(v) -> str:
    if isinstance(v, bool):
        return "t" if v else "f"
    text = repr(v).lower()
    return text.replace("-", "m").replace("+", "").replace(".", "p")


def _op_name(cls: type, attrs: Dict[str, Any]) -> str:
    base = re.sub(r"[^a-z0-9_]", "_", cls.__name__.lower())
    parts = [base] + [f"{re.sub(r'[^a-z0-9_]', '_', k.lower())}_{_enc(v)}" for k, v in sorted(attrs.items())]
    name = "_".join(parts)
    if len(name) > 45:  # the operator adds "hub_" (and "_" and 8 for a reversed one) within 63 characters
        digest = hashlib.sha256(f"{cls.__module__}.{cls.__qualname__}{sorted(attrs.items())}".encode()).hexdigest()
        name = f"{base[:40]}_{digest[:12]}"
    return name


def _scalars(m) -> Dict[str, Any]:
    return {k: v for k, v in vars(m).items()
            if not k.startswith("_") and k != "training" and type(v) in (int, float, bool)}


def _hub_forward(m):
    """The forward kernelize installed on m, as a function, or None."""
    f = m.__dict__.get("forward")
    if isinstance(f, types.MethodType) and f.__self__ is m and f.__func__ is not type(m).forward:
        if getattr(f.__func__, "_understudy_lifted", False):
            return None
        return f.__func__
    return None


def _variant_digest(folder: pathlib.Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(folder)).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


def attribute(fn, repo=None) -> dict:
    """Where a hub layer's forward comes from: the kernel it was loaded with
    (kernels.get_loaded_kernels()), its repository and revision. A local
    repository has no revision of its own: its build variant's files are
    hashed instead ("sha256:...")."""
    mod = getattr(fn, "__module__", "") or ""
    out: Dict[str, Any] = {"kind": "hub", "layer": getattr(fn, "__qualname__", "?").rsplit(".", 1)[0]}
    try:
        import kernels
        loaded = kernels.get_loaded_kernels()
    except Exception:
        loaded = []
    hit = None
    for lk in loaded:
        name = getattr(lk.module, "__name__", "")
        if mod == name or mod.startswith(name + "."):
            hit = lk
            break
    if hit is not None:
        md = hit.metadata
        out.update({"kernel_id": md.id, "kernel": str(md.name), "version": md.version})
        ops = _ops_of(md.id)
        if ops:
            out["ops"] = ops  # the dispatcher ops the kernel registered: its layer's calls reach them
        file = getattr(hit.module, "__file__", None)
        variant = pathlib.Path(file).parent if file else None
        if variant is not None:
            out["variant"] = variant.name
        if hit.repo_info is not None:
            out["repo"] = hit.repo_info.repo_id
            out["revision"] = str(hit.repo_info.revision)
        elif variant is not None:
            out["repo"] = str(variant.parent.parent if variant.parent.name == "build" else variant.parent)
            out["revision"] = "sha256:" + _variant_digest(variant)
        digest = getattr(md, "digest", None)
        if digest is not None:
            out["digest"] = str(digest)
    if "repo" not in out and repo is not None:
        out["repo"] = str(getattr(repo, "_repo_path", None) or getattr(repo, "repo_id", None) or repo)
        rev = getattr(repo, "revision", None) or getattr(repo, "_revision", None)
        if rev is not None:
            out["revision"] = str(rev)
    out.setdefault("repo", mod or "?")
    out.setdefault("revision", "unknown")
    short = out["revision"][:19] if out["revision"].startswith("sha256:") else out["revision"][:12]
    out["label"] = f"hub {out['repo']}@{short} {out['layer']}"
    return out


def _ops_of(kernel_id: str) -> List[str]:
    """The dispatcher ops a hub kernel registered: kernel-builder names
    their namespace after the kernel's id (`_<name>_<backend>_<hash>`)."""
    try:
        import torch
        names = torch._C._dispatch_get_all_op_names()
    except Exception:
        return []
    ns = kernel_id if kernel_id.startswith("_") else f"_{kernel_id}"
    return sorted(n for n in names if n.split("::", 1)[0] in (kernel_id, ns))


def attribute_op(name: str) -> Optional[dict]:
    """The hub kernel a dispatcher op ("_activation_cuda_0a1b2c::silu_and_mul")
    belongs to, through kernels.get_loaded_kernels(): its repo, revision,
    kernel id, name and version; None when no loaded kernel registered
    its namespace."""
    ns = name.split("::", 1)[0]
    try:
        import kernels
        loaded = kernels.get_loaded_kernels()
    except Exception:
        return None
    for lk in loaded:
        kid = lk.metadata.id
        if ns in (kid, f"_{kid}"):
            out = {"op": name, "kernel_id": kid, "kernel": str(lk.metadata.name), "version": lk.metadata.version}
            if lk.repo_info is not None:
                out.update(repo=lk.repo_info.repo_id, revision=str(lk.repo_info.revision))
            else:
                file = getattr(lk.module, "__file__", None)
                if file:
                    variant = pathlib.Path(file).parent
                    out.update(repo=str(variant.parent.parent if variant.parent.name == "build" else variant.parent),
                               revision="sha256:" + _variant_digest(variant))
            return out
    return None


def _stand_in(module, overrides: Dict[str, Any]):
    """module with its parameters and buffers replaced by overrides, as a
    new object of its class (the module itself is left untouched, so that
    threads calling it meanwhile see it whole)."""
    if all(module._parameters.get(k, module._buffers.get(k)) is v for k, v in overrides.items()):
        return module
    stand = object.__new__(type(module))
    d = dict(module.__dict__)
    d.pop("forward", None)
    params, bufs = dict(module._parameters), dict(module._buffers)
    for k, v in overrides.items():
        (params if k in params else bufs)[k] = v
    d["_parameters"], d["_buffers"] = params, bufs
    stand.__dict__.update(d)
    return stand


def _impl(rec: Lifted, fn):
    n = len(rec.acts)
    cls = rec.cls

    def impl(*args):
        module = getattr(_calling, "module", None)
        if module is None or type(module) is not cls:
            module = next((m() for r in lifted() if r.cls is cls for m in r.modules if m() is not None), None)
            if module is None:
                raise RuntimeError(f"{rec.production_op}: no module of {cls.__name__} is alive")
        stand = _stand_in(module, dict(zip(rec.params, args[n:])))
        out = fn(stand, *args[:n])
        import torch
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{rec.cls.__name__}.forward returned {type(out).__name__}, not a tensor")
        return out

    return impl


def _defined(qualname: str) -> bool:
    import torch

    try:
        torch._C._get_schema(qualname, "")
        return True
    except RuntimeError:
        return False


def _define(rec: Lifted, original, hub_fn) -> None:
    """The production op and the candidate op, with one schema: the
    original forward and the hub layer's (the other way round reversed)."""
    from .candidates import _define as define

    sig = "(" + ", ".join([f"Tensor {a}" for a in rec.acts] + [f"Tensor {p}" for p in rec.params]) + ") -> Tensor"
    prod, cand = (hub_fn, original) if rec.reverse else (original, hub_fn)
    for op, fn in ((rec.production_op, prod), (rec.candidate_op, cand)):
        if not _defined(op):
            define(NAMESPACE, op.split("::", 1)[1], _impl(rec, fn), signature=sig)


class _Running:
    """What the running config makes of lifted ops: set by the config side
    (understudy.sources) when it enables one that names hub candidates."""
    pending = False   # ops lifted since the running config was made: read at each call of a lifted module
    on_lifted = None  # callable(now=...): new ops were lifted
    refresh = None    # callable(): enable again, with the ops lifted since


running = _Running()


def _lifted_forward(rec: Lifted, serving, module):
    """The forward installed on a lifted module: its op, or the forward
    that serves it for a call the op cannot take."""
    import torch

    names = rec.params
    checked = rec.checked
    op = getattr(getattr(torch.ops, NAMESPACE), rec.production_op.split("::", 1)[1]).default

    def forward(self, *acts, **kw):
        if kw or len(acts) != len(rec.acts):
            return serving(self, *acts, **kw)
        tensors = [getattr(self, p) for p in names]
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*acts, *tensors) if isinstance(t, torch.Tensor)):
            return serving(self, *acts)
        if not all(isinstance(a, torch.Tensor) for a in acts):
            return serving(self, *acts)
        if checked["ok"] is None:
            out = serving(self, *acts)  # the first call tells whether the forward returns one tensor
            checked["ok"] = isinstance(out, torch.Tensor)
            return out
        if not checked["ok"]:
            return serving(self, *acts)
        if running.pending and running.refresh is not None:
            running.refresh()  # operators lifted since understudy was enabled: enabled again with them
        prev = getattr(_calling, "module", None)
        _calling.module = self
        try:
            return op(*acts, *tensors)
        finally:
            _calling.module = prev

    forward._understudy_lifted = True
    return types.MethodType(forward, module)


def _describe(m):
    """(activations, params) of a kernelized module, or raise HubError."""
    cls = type(m)
    for name, child in m.named_children():
        if any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            raise HubError(f"{cls.__name__}: its child '{name}' holds parameters; only modules whose parameters "
                           "and buffers are their own are lifted")
    params = [k for k, v in m._parameters.items() if v is not None] + \
             [k for k, v in m._buffers.items() if v is not None]
    try:
        sig = inspect.signature(cls.forward)
    except (TypeError, ValueError) as e:
        raise HubError(f"{cls.__name__}.forward: its signature cannot be read ({e})") from None
    acts = []
    for p in list(sig.parameters.values())[1:]:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not inspect.Parameter.empty:
            raise HubError(f"{cls.__name__}.forward takes '{p.name}' with a default or by keyword; only forwards "
                           "of tensors without defaults are lifted")
        acts.append(p.name)
    if not acts:
        raise HubError(f"{cls.__name__}.forward takes no activation")
    for n in acts + params:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) or n in ("self", "out"):
            raise HubError(f"{cls.__name__}: '{n}' cannot name an argument of the lifted op")
    return acts, params


def guard_kernelized(model, *, reverse: bool = False, now: bool = True) -> List[dict]:
    """Lift every module of model whose forward `kernels.kernelize` replaced
    (its class has kernel_layer_name) into a production op and a candidate
    op, and install a forward that calls the production op.

    reverse: production is the hub layer and the candidate the original
    forward. Returns one entry per module: its path in the model, its
    operator and op, or why it was left as it is. When understudy is
    enabled with a config that names hub candidates, new operators take
    effect at once (now=False: at the first call of a lifted module): it is
    enabled again with the same config, and its counts start afresh."""
    import torch  # noqa: F401  (the ops need it)

    out, new = [], False
    with _lock:
        for path, m in model.named_modules():
            cls = type(m)
            if not hasattr(cls, "kernel_layer_name"):
                continue
            hub_fn = _hub_forward(m)
            if hub_fn is None:
                state = "lifted already" if getattr(m.__dict__.get("forward"), "__func__", None) is not None and \
                    getattr(m.__dict__["forward"].__func__, "_understudy_lifted", False) else "not kernelized"
                out.append({"module": path, "class": cls.__name__, "lifted": False, "why": state})
                continue
            try:
                acts, params = _describe(m)
            except HubError as e:
                out.append({"module": path, "class": cls.__name__, "lifted": False, "why": str(e)})
                continue
            attrs = _scalars(m)
            name = _op_name(cls, attrs)
            source = attribute(hub_fn, m.__dict__.get("_kernel_repo"))
            hub_id = hashlib.sha256(f"{hub_fn.__module__}.{hub_fn.__qualname__}@{source['revision']}"
                                    f"{'/reverse' if reverse else ''}".encode()).hexdigest()[:8]
            key = (name, hub_id)
            rec = _lifted.get(key)
            if rec is None:
                rec = Lifted(name, str(cls.kernel_layer_name), cls, attrs, acts, params, reverse, source, hub_id)
                _define(rec, cls.forward, hub_fn)
                _lifted[key] = rec
                new = True
            elif rec.acts != acts or rec.params != params:
                out.append({"module": path, "class": cls.__name__, "lifted": False,
                            "why": f"{rec.production_op} was lifted with another schema"})
                continue
            if not rec.alive():
                new = True  # its operator was left out of the running config while none was alive
            rec.modules.append(weakref.ref(m))
            serving = hub_fn if reverse else cls.forward
            m.forward = _lifted_forward(rec, serving, m)
            out.append({"module": path, "class": cls.__name__, "lifted": True, "operator": rec.operator,
                        "op": rec.production_op, "candidate": rec.source["label"]})
    if new and running.on_lifted is not None:
        running.on_lifted(now=now)
    return out


# ---- definitions and config ------------------------------------------------------------

def expand(name: str, entry: dict, path: str) -> Dict[str, dict]:
    """operators.<name> with candidate {"hub": {...}}: one operator per
    lifted op of the layer it names (every layer when it names none)."""
    hub = entry["candidate"]["hub"]
    if not isinstance(hub, dict):
        raise HubError(f"config: '{path}.hub' must be an object ({{\"layer\": NAME}})")
    unknown = set(hub) - {"layer", "reverse"}
    if unknown:
        raise HubError(f"config: '{path}.hub' has no field '{sorted(unknown)[0]}' (it takes 'layer', 'reverse')")
    layer = hub.get("layer")
    reverse = hub.get("reverse", False)
    if not isinstance(reverse, bool):
        raise HubError(f"config: '{path}.hub.reverse' must be true or false")
    rest = {k: v for k, v in entry.items() if k != "candidate"}
    cand_rest = {k: v for k, v in entry["candidate"].items() if k != "hub"}
    ops = {}
    for rec in lifted():
        if not rec.alive():
            continue
        if layer is None or rec.layer == layer or rec.cls.__name__ == layer:
            if rec.reverse != reverse:
                raise HubError(f"config: '{path}.hub.reverse' is {str(reverse).lower()}, but {rec.production_op} "
                               f"was lifted with reverse={rec.reverse}")
            ops[rec.operator] = {**rest, "candidate": {**rec.candidate(), **cand_rest}}
    return ops


def reverse_for(config_text: str, layer: str) -> bool:
    """Whether the running config's hub entry for layer asks for reverse."""
    try:
        ops = json.loads(config_text).get("operators") or {}
    except (ValueError, AttributeError, RecursionError):
        return False
    for e in ops.values():
        hub = e.get("candidate", {}).get("hub") if isinstance(e, dict) and isinstance(e.get("candidate"), dict) \
            else None
        if isinstance(hub, dict) and hub.get("layer") in (None, layer):
            return bool(hub.get("reverse", False))
    return False


def write_definitions(base: pathlib.Path, recs: List[Lifted]) -> pathlib.Path:
    """A folder of definitions: base's, and one per lifted op. Made per
    process under the temporary folder; the same content gives the same
    folder."""
    import tempfile

    defs = {f"{r.operator}.json": json.dumps(r.definition(), indent=1, sort_keys=True) for r in recs}
    h = hashlib.sha256(str(base.resolve()).encode() + json.dumps(defs, sort_keys=True).encode()).hexdigest()[:16]
    folder = pathlib.Path(tempfile.gettempdir()) / f"understudy-defs-{os.getpid()}-{h}"
    if folder.is_dir():
        return folder
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"understudy-defs-{os.getpid()}-"))
    for p in base.iterdir():
        os.symlink(p.resolve(), tmp / p.name)
    for fname, text in defs.items():
        (tmp / fname).write_text(text)
    try:
        os.rename(tmp, folder)
    except OSError:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
