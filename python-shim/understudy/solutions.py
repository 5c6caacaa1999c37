"""FlashInfer-Bench Solutions as candidates for the serving op that computes
their Definition.

A Definition names a kernel's inputs and outputs over symbolic axes, some
constant (hidden_size = 4096); a Solution implements it (its sources and an
entry point "main.py::run", destination-passing or value-returning). This
module makes a Python or Triton Solution a torch op with the schema of the
serving op (vLLM's `_C::rms_norm`, a lifted hub layer) through an argument
adapter: the Definition's inputs and outputs are mapped by name (or `args`)
onto the op's arguments, outputs the op does not hand over are allocated
as the Definition lays them out, and the results are written where the op
writes them.

The Solution is pinned by its content hash (flashinfer_bench's
Solution.hash(): its name, Definition, language, entry point, dependencies
and every source). Its constant axes constrain the routes it runs on: where
an axis is a key dimension of the operator (`N = input[-1]`), the candidate
gets `when` and other routes are production's alone; any other constant
axis, and the Definition's dtypes, are checked per call, and a call outside
them fails the candidate on that route (its evidence says which axis).

Parsing and hashing use flashinfer_bench's own models (pip install
flashinfer-bench); building is understudy's: the sources are written to a
folder of their own and imported as a package.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import pathlib
import re
import sys
import tempfile
import threading
from typing import Dict, Optional

from . import adapt

NAMESPACE = "understudy_solution"
_lock = threading.RLock()
_registered: Dict[str, dict] = {}


class SolutionError(ValueError):
    """A Solution cannot be made a candidate: the message names what is wrong."""


def _models():
    try:
        from flashinfer_bench.data import Definition, Solution
    except ImportError as e:
        raise SolutionError(f"flashinfer_bench cannot be imported ({e}): pip install flashinfer-bench") from None
    return Definition, Solution


def _load_json(x, what: str):
    if isinstance(x, (str, os.PathLike)):
        try:
            with open(x) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise SolutionError(f"the {what} '{x}' cannot be read: {e}") from None
    return x


def load(solution, definition=None):
    """(Definition, Solution) from paths, dicts or models; one JSON file may
    hold both ({"definition": {...}, "solution": {...}})."""
    Definition, Solution = _models()
    sol = _load_json(solution, "Solution")
    if isinstance(sol, dict) and "solution" in sol and definition is None:
        definition, sol = sol.get("definition"), sol["solution"]
    if definition is None:
        raise SolutionError("a Solution needs its Definition (definition=...)")
    d = _load_json(definition, "Definition")
    try:
        d = d if isinstance(d, Definition) else Definition.model_validate(d)
    except Exception as e:
        raise SolutionError(f"the Definition is not valid: {e}") from None
    try:
        s = sol if isinstance(sol, Solution) else Solution.model_validate(sol)
    except Exception as e:
        raise SolutionError(f"the Solution is not valid: {e}") from None
    if s.definition != d.name:
        raise SolutionError(f"Solution '{s.name}' solves Definition '{s.definition}', not '{d.name}'")
    return d, s


def _materialize(s) -> pathlib.Path:
    """The Solution's sources written under a folder of its own (named by
    its hash, so that the same content is written once per process)."""
    root = pathlib.Path(tempfile.gettempdir()) / f"understudy-solution-{os.getpid()}-{s.hash()[:16]}"
    pkg = root / f"_ust_sol_{s.hash()[:16]}"
    if not pkg.is_dir():
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="understudy-solution-"))
        tpkg = tmp / pkg.name
        tpkg.mkdir()
        for src in s.sources:
            p = (tpkg / src.path).resolve()
            if tpkg.resolve() not in p.parents:
                raise SolutionError(f"Solution '{s.name}': source path '{src.path}' leaves its folder")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(src.content)
        for d in [tpkg, *[p for p in tpkg.rglob("*") if p.is_dir()]]:
            (d / "__init__.py").touch(exist_ok=True)
        try:
            os.rename(tmp, root)
        except OSError:
            pass
    return root


def _check_language(s) -> None:
    lang = str(getattr(s.spec.language, "value", s.spec.language))
    if lang not in ("python", "triton"):
        raise SolutionError(f"Solution '{s.name}' is written in {lang}: only python and triton Solutions are "
                            "imported (build others into a native candidate)")
    file, _, _ = s.spec.entry_point.partition("::")
    if not file.endswith(".py"):
        raise SolutionError(f"Solution '{s.name}': entry point '{s.spec.entry_point}' is not a Python file")


def _entry(s):
    _check_language(s)
    file, symbol = s.spec.entry_point.split("::")
    root = _materialize(s)
    pkg = f"_ust_sol_{s.hash()[:16]}"
    modname = pkg + "." + ".".join(pathlib.PurePosixPath(file).with_suffix("").parts)
    added = str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        mod = importlib.import_module(modname)
    except Exception as e:
        raise SolutionError(f"Solution '{s.name}': importing {file} raised {type(e).__name__}: {e}") from None
    finally:
        if added and str(root) in sys.path:
            sys.path.remove(str(root))
    fn = getattr(mod, symbol, None)
    if not callable(fn):
        raise SolutionError(f"Solution '{s.name}': {file} defines no function '{symbol}'")
    return fn


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "int64": torch.int64,
            "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "bool": torch.bool}.get(name)


def _value_form(d, s, fn):
    """The Solution as a value-returning function of the Definition's
    inputs, checking each call against the Definition (constant axes,
    ranks, dtypes); a destination-passing entry gets its outputs allocated
    as the Definition lays them out."""
    import torch

    inputs = list(d.inputs.items())
    outputs = list(d.outputs.items())
    const = d.const_axes
    dps = s.spec.destination_passing_style

    def check(vals):
        axes: Dict[str, int] = {}
        for (name, spec), v in zip(inputs, vals):
            if spec.shape is None:
                continue
            if not isinstance(v, torch.Tensor) or v.dim() != len(spec.shape):
                got = f"rank {v.dim()}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise ValueError(f"outside Definition '{d.name}': '{name}' is {got}, it defines rank "
                                 f"{len(spec.shape)} {list(spec.shape)}")
            want = _dtype(str(getattr(spec.dtype, "value", spec.dtype)))
            if want is not None and v.dtype != want:
                raise ValueError(f"outside Definition '{d.name}': '{name}' is {v.dtype}, it defines {want}")
            for axis, size in zip(spec.shape, v.shape):
                if axis in const and size != const[axis]:
                    raise ValueError(f"outside Definition '{d.name}': axis '{axis}' is {size} in '{name}', the "
                                     f"Definition fixes it at {const[axis]}")
                if axes.setdefault(axis, size) != size:
                    raise ValueError(f"outside Definition '{d.name}': axis '{axis}' is {axes[axis]} and {size}")
        return axes

    def run(*vals):
        axes = check(vals)
        if not dps:
            return fn(*vals)
        ref = next((v for v in vals if isinstance(v, torch.Tensor)), None)
        outs = []
        with torch.profiler.record_function("understudy::adapter"):  # understudy's allocations, not the Solution's
            outs = _alloc(outputs, axes, const, ref)
        fn(*vals, *outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _alloc(outputs, axes, const, ref):
        outs = []
        for name, spec in outputs:
            shape = [axes.get(a, const.get(a)) for a in (spec.shape or [])]
            if any(x is None for x in shape):
                raise ValueError(f"Definition '{d.name}': output '{name}' has an axis no input gives")
            outs.append(torch.empty(shape, dtype=_dtype(str(getattr(spec.dtype, "value", spec.dtype))),
                                    device=ref.device if ref is not None else None))
        return outs

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n, _ in inputs]
    run.__signature__ = inspect.Signature(params)
    run.__name__ = s.name
    return run


def _when(d, adapter: adapt.Adapter, target: str, problems) -> Dict[str, int]:
    """The Definition's constant axes that are key dimensions of the
    operator binding target ("N": "input[-1]"), as candidate.when."""
    from . import problems_dir

    folder = pathlib.Path(problems or problems_dir())
    qual, _, overload = target.partition(".")
    keys: Dict[str, str] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for b in doc.get("bindings", []) if isinstance(doc, dict) else []:
            if b.get("op") == qual and overload in b.get("overloads", [""]) and isinstance(b.get("key"), dict):
                keys = b["key"]
    by_arg = {p: adapter.target.args[i].name for p, i in adapter.mapping.items()}
    when = {}
    for name, spec in d.inputs.items():
        if spec.shape is None or name not in by_arg:
            continue
        rank = len(spec.shape)
        for k, axis in enumerate(spec.shape):
            if axis not in d.const_axes:
                continue
            for dim, expr in keys.items():
                m = re.fullmatch(r"([A-Za-z_]\w*)\[(-?\d+)\]", expr.replace(" ", ""))
                if m and m.group(1) == by_arg[name] and (int(m.group(2)) % rank) == k:
                    when[dim] = d.const_axes[axis]
    return when


def _adapted(d, s, tgt: adapt.Target, args: Optional[Dict[str, str]], fn=None):
    """The Solution's value form (_value_form) adapted to tgt: (impl, adapter).
    fn None: the Solution's code is not imported, and impl must not be
    called (the adapter alone is wanted: its mapping, what it describes)."""
    run = _value_form(d, s, fn)
    try:
        a = adapt.build(tgt, run, entry_name=f"Solution '{s.name}'", args=args, style="value")
    except adapt.AdaptError as e:
        raise SolutionError(str(e)) from None
    missing = [n for n in d.inputs if n not in a.mapping]
    if missing:
        raise SolutionError(f"Solution '{s.name}': Definition input '{missing[0]}' maps to no argument of "
                            f"{tgt.schema}; map it with args")
    n_out = len(tgt.written) + sum(1 for x in tgt.return_aliases if x is None)
    if n_out != len(d.outputs):
        raise SolutionError(f"Definition '{d.name}' has {len(d.outputs)} output(s) ({', '.join(d.outputs)}); "
                            f"{tgt.name} writes or returns {n_out}")
    return a.wrap(run), a


def _pinned(solution, definition, pin: Optional[str]):
    d, s = load(solution, definition)
    h = s.hash()
    if pin is not None and pin.lower() != h:
        raise SolutionError(f"Solution '{s.name}' has content hash {h}, not the pinned {pin}: its sources, entry "
                            "point or Definition changed")
    return d, s, h


def build_impl(solution, definition, tgt: adapt.Target, args: Optional[Dict[str, str]] = None,
               pin: Optional[str] = None):
    """The Solution imported and adapted to tgt, here: (impl, info)."""
    d, s, h = _pinned(solution, definition, pin)
    _check_language(s)
    impl, a = _adapted(d, s, tgt, args, _entry(s))
    return impl, {"solution": s.name, "hash": h, **a.describe()}


def register(solution, *, definition=None, target: str, args: Optional[Dict[str, str]] = None,
             pin: Optional[str] = None, problems=None, qualify: str = "process", qualify_calls: int = 3,
             deadline_ms: float = 10000.0) -> dict:
    """Make a Solution a torch op with target's schema; returns the config's
    candidate entry. pin: the Solution's content hash it must have.
    qualify "process" (the default): this process does not import the
    Solution at first; the op's overload `qualify` runs it in a process of
    its own (understudy.filehost) until a route qualified it, as a file
    candidate's (understudy.files). "here": imported here now."""
    from .candidates import _define
    from .files import ChildRunner, lazy

    if qualify not in ("here", "process"):
        raise SolutionError(f"qualify must be 'here' or 'process', not {qualify!r}")
    d, s, h = _pinned(solution, definition, pin)
    try:
        tgt = adapt.target_named(target)
    except ValueError as e:
        raise SolutionError(f"Solution '{s.name}': target {e}") from None
    key = f"{h}|{target}|{sorted((args or {}).items())}|{qualify}"
    with _lock:
        if key in _registered:  # the same op; how many calls qualify a route is the entry's own
            out = dict(_registered[key])
            if "qualify_calls" in out:
                out["qualify_calls"] = int(qualify_calls)
            return out
        _check_language(s)
        child = None
        if qualify == "process":
            _, a = _adapted(d, s, tgt, args)  # the mapping, checked here without importing the Solution
            hello = {"kind": "solution", "solution": s.model_dump(mode="json"),
                     "definition": d.model_dump(mode="json"), "hash": h, "args": dict(args or {})}
            child = ChildRunner(f"solution {s.name}", hello, tgt, deadline_ms=deadline_ms, error=SolutionError)
            impl = lazy(lambda: _adapted(d, s, tgt, args, _entry(s))[0])  # imported here once qualified
        else:
            impl, a = _adapted(d, s, tgt, args, _entry(s))
        base = re.sub(r"[^a-z0-9_]", "_", s.name.lower())[:40]
        op = f"{base}_{h[:10]}" + ("_q" if child is not None else "")
        _define(NAMESPACE, op, impl, target)
        if child is not None:
            _define(NAMESPACE, op + ".qualify", child, target)
        when = _when(d, a, target, problems)
        lang = str(getattr(s.spec.language, "value", s.spec.language))
        source = {"kind": "solution", "label": f"solution {s.name} sha1:{h[:12]}", "solution": s.name,
                  "definition": d.name, "op_type": d.op_type, "author": s.author, "language": lang,
                  "entry_point": s.spec.entry_point, "hash": h,
                  "destination_passing": bool(s.spec.destination_passing_style), "const_axes": dict(d.const_axes),
                  **{k: v for k, v in a.describe().items() if k != "style"}}
        entry = {"torch_op": f"{NAMESPACE}::{op}", "target": target, "source": source}
        if child is not None:
            entry["qualify"] = "process"
            entry["qualify_calls"] = int(qualify_calls)
        if when:
            entry["when"] = when
        _registered[key] = entry
        return dict(entry)


def from_solution(solution, *, definition=None, like: str, args: Optional[Dict[str, str]] = None,
                  pin: Optional[str] = None, qualify: str = "process", qualify_calls: int = 3) -> dict:
    """A FlashInfer-Bench Solution as a candidate for the op `like` (defined
    in this process): its config entry. solution: a Solution JSON path (or
    one holding "definition" and "solution"), dict or model; definition: the
    Definition likewise. args: {Definition name: target argument} where
    names differ beyond the common aliases. pin: its content hash (default:
    the hash it has now). qualify: "process" (runs in a process of its own
    until a route qualified it) or "here"."""
    return register(solution, definition=definition, target=like, args=args, pin=pin, qualify=qualify,
                    qualify_calls=int(qualify_calls))


_KEYS = {"solution", "definition", "hash", "target", "args", "when", "qualify", "qualify_calls"}


def from_config(cand: dict, path: str, deadline_ms: float = 10000.0) -> dict:
    unknown = set(cand) - _KEYS
    if unknown:
        raise SolutionError(f"config: '{path}' has no field '{sorted(unknown)[0]}' with 'solution' "
                            f"(it takes {', '.join(sorted(_KEYS))})")
    pin = cand.get("hash")
    if not isinstance(pin, str) or not re.fullmatch(r"[0-9a-fA-F]{40}", pin):
        raise SolutionError(f"config: '{path}.hash' must be the Solution's content hash (40 hex digits, "
                            "flashinfer_bench's Solution.hash())")
    target = cand.get("target")
    if not isinstance(target, str) or "::" not in target:
        raise SolutionError(f"config: '{path}.target' must name the serving op that computes the Definition")
    qualify = cand.get("qualify", "process")
    if qualify not in ("here", "process"):
        raise SolutionError(f"config: '{path}.qualify' must be \"process\" (the Solution qualifies in a process of "
                            "its own before this one imports it) or \"here\"")
    calls = cand.get("qualify_calls", 3)
    if qualify != "process" and "qualify_calls" in cand:
        raise SolutionError(f"config: '{path}.qualify_calls' applies only with \"qualify\": \"process\"")
    if not isinstance(calls, int) or isinstance(calls, bool) or not 1 <= calls <= 1000000:
        raise SolutionError(f"config: '{path}.qualify_calls' must be a whole number of calls from 1 to 1000000")
    out = register(cand["solution"], definition=cand.get("definition"), target=target, args=cand.get("args"),
                   pin=pin, qualify=qualify, qualify_calls=calls, deadline_ms=deadline_ms)
    if "when" in cand:
        out["when"] = cand["when"]
    return out
