"""Argument adapters: a kernel written against its own signature, called as
the op it stands in for.

Kernels from files, FlashInfer-Bench Solutions and agents name their
arguments as they like (`x`, `hidden_states`, `eps`) and most return their
results, where a serving op often writes them into an argument it was given
(vLLM's `_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float
epsilon) -> ()`). An Adapter is built once from the target's schema and the
entry's parameters: it maps each parameter to one of the target's arguments,
decides whether the entry passes destinations or returns values, and turns
a call of the target into a call of the entry and back:

- destination-passing: the entry receives the written arguments (mapped by
  name) and writes them; what the target returns (the written arguments it
  aliases, or nothing) is returned for it;
- value-returning: the entry's results fill the written arguments in schema
  order (each copied in, of exactly that shape and dtype), then the target's
  own returns.

Nothing here imports torch at module level: the Python package imports
without it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

# Names the same argument goes by in different code bases, compared in lower case.
_ALIASES = [
    {"input", "x", "inp", "hidden_states", "hidden", "self", "a", "input_tensor", "tensor", "inputs", "act"},
    {"weight", "w", "gamma", "scale", "norm_weight"},
    {"bias", "beta", "b_bias"},
    {"eps", "epsilon", "variance_epsilon", "rms_eps", "norm_eps"},
    {"out", "output", "result", "y", "o", "dst", "res"},
    {"mat2", "b", "other", "rhs"},
    {"residual", "resid", "skip"},
]


@dataclass
class TargetArg:
    name: str
    type: str
    written: bool
    kwarg_only: bool
    has_default: bool
    default: Any = None


@dataclass
class Target:
    """What an adapter needs of an op's schema."""

    name: str                      # "ns::op" or "ns::op.overload"
    schema: str                    # the schema, in a form torch parses again
    args: List[TargetArg]
    returns: List[str]             # return types
    return_aliases: List[Optional[int]]  # per return: the index of the written argument it aliases, or None

    @property
    def written(self) -> List[int]:
        return [i for i, a in enumerate(self.args) if a.written]

    def arg(self, name: str) -> Optional[int]:
        for i, a in enumerate(self.args):
            if a.name == name:
                return i
        return None


def target_of(schema) -> Target:
    """A Target from a torch FunctionSchema (or its printed form)."""
    import torch

    if isinstance(schema, str):
        schema = torch._C.parse_schema(schema)
    name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    args = []
    for a in schema.arguments:
        written = a.alias_info is not None and a.alias_info.is_write
        args.append(TargetArg(a.name, str(a.type), written, a.kwarg_only, a.has_default_value(),
                              a.default_value if a.has_default_value() else None))
    from .candidates import _definable_signature

    text = schema.name + (f".{schema.overload_name}" if schema.overload_name else "") + \
        _definable_signature(str(schema))
    returns, aliases = [], []
    for r in schema.returns:
        returns.append(str(r.type))
        alias = None
        if r.alias_info is not None and r.alias_info.is_write:
            sets = set(r.alias_info.before_set)
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write and set(a.alias_info.before_set) & sets:
                    alias = i
                    break
        aliases.append(alias)
    return Target(name, text, args, returns, aliases)


def target_named(op: str) -> Target:
    """The Target of a dispatcher op defined in this process ("aten::mm",
    "_C::rms_norm", "aten::mm.out"); ValueError naming it otherwise."""
    import torch

    qual, _, overload = op.partition(".")
    try:
        return target_of(torch._C._get_schema(qual, overload))
    except RuntimeError:
        raise ValueError(f"'{op}' is not a dispatcher op defined in this process") from None


class AdaptError(ValueError):
    """The entry cannot stand in for the target: the message names the parameter or argument."""


def _same(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a == b or any(a in g and b in g for g in _ALIASES)


@dataclass
class Adapter:
    target: Target
    entry_name: str
    params: List[str]                    # the entry's parameters it passes, in order
    mapping: Dict[str, int]              # parameter -> the target argument's index
    destination: bool                    # the entry writes destinations (else returns values)
    ignored: List[str] = field(default_factory=list)  # target tensor arguments the entry does not read

    def describe(self) -> dict:
        return {"style": "destination" if self.destination else "value",
                "args": {p: self.target.args[i].name for p, i in self.mapping.items()},
                "ignores": list(self.ignored)}

    def wrap(self, fn: Callable) -> Callable:
        """fn (the entry) as an implementation of the target: called with the
        target's arguments, returns what the target returns."""
        target, mapping, params, dest = self.target, self.mapping, self.params, self.destination
        written = target.written
        label = self.entry_name

        def impl(*args, **kwargs):
            vals = positional(target, args, kwargs)
            call = [vals[mapping[p]] for p in params]
            out = fn(*call)
            return _finish(target, vals, written, out, dest, label)

        impl.__name__ = f"adapted_{getattr(fn, '__name__', 'entry')}"
        return impl


def _finish(target: Target, vals: list, written: List[int], out, dest: bool, label: str):
    import torch

    # the copies below are understudy's, not the entry's: under a scope of
    # their own, so that the ops a candidate calls are counted without them
    with torch.profiler.record_function("understudy::adapter"):
        return _finish_in(target, vals, written, out, dest, label)


def _finish_in(target: Target, vals: list, written: List[int], out, dest: bool, label: str):
    import torch

    if not dest:
        results = list(out) if isinstance(out, (tuple, list)) else ([] if out is None else [out])
        functional = [i for i, a in enumerate(target.return_aliases) if a is None]
        want = len(written) + len(functional)
        if len(results) != want:
            parts = []
            if written:
                parts.append(f"{len(written)} written ({', '.join(target.args[i].name for i in written)})")
            if functional:
                parts.append(f"{len(functional)} returned ({', '.join(target.returns[i] for i in functional)})")
            raise AdaptError(f"{label} returned {len(results)} value(s); {target.name} needs {want}: "
                             f"{' and '.join(parts) or 'none'}")
        for i, r in zip(written, results):
            dst = vals[i]
            if not isinstance(r, torch.Tensor) or r.shape != dst.shape:
                got = tuple(r.shape) if isinstance(r, torch.Tensor) else type(r).__name__
                raise AdaptError(f"{label}'s result for '{target.args[i].name}' is {got}; "
                                 f"{target.name} writes it as {tuple(dst.shape)}")
            dst.copy_(r)
        rest = results[len(written):]
    else:
        rest = list(out) if isinstance(out, (tuple, list)) else ([] if out is None else [out])
    returned = []
    k = 0
    for i, alias in enumerate(target.return_aliases):
        if alias is not None:
            returned.append(vals[alias])
        else:
            if k >= len(rest):
                raise AdaptError(f"{label} returned {len(rest)} value(s); {target.name} returns "
                                 f"{len(target.returns)} ({', '.join(target.returns)})")
            returned.append(rest[k])
            k += 1
    if not returned:
        return None
    return returned[0] if len(returned) == 1 else tuple(returned)


def _entry_params(fn: Callable) -> List[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise AdaptError(f"the entry's signature cannot be read: {e}") from None
    out = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise AdaptError(f"the entry takes *{p.name}: name its parameters so that they can be mapped")
        out.append(p)
    return out


def build(target: Target, fn: Callable, *, entry_name: str, args: Optional[Dict[str, str]] = None,
          style: Optional[str] = None, skip_first: bool = False) -> Adapter:
    """Map fn's parameters onto target's arguments.

    args: {parameter: target argument} for names that do not match by name
    or by a common alias. style: "value", "destination" or None (destination
    when a parameter maps to an argument the target writes). skip_first:
    the first parameter is bound already (a method's self)."""
    params = _entry_params(fn)
    if skip_first and params:
        params = params[1:]
    args = dict(args or {})
    for p, t in args.items():
        if all(q.name != p for q in params):
            raise AdaptError(f"args maps '{p}', which {entry_name} does not take "
                             f"(it takes {', '.join(q.name for q in params) or 'nothing'})")
        if target.arg(t) is None:
            raise AdaptError(f"args maps '{p}' to '{t}', which {target.name} does not have "
                             f"({', '.join(a.name for a in target.args)})")
    mapping: Dict[str, int] = {}
    taken = set()
    for p in params:  # explicit, then the same name
        idx = target.arg(args[p.name]) if p.name in args else target.arg(p.name)
        if idx is not None and idx not in taken:
            mapping[p.name] = idx
            taken.add(idx)
    for p in params:  # then a common alias
        if p.name in mapping or p.name in args:
            continue
        idx = next((i for i, a in enumerate(target.args) if i not in taken and _same(p.name, a.name)), None)
        if idx is not None:
            mapping[p.name] = idx
            taken.add(idx)
    dest = style == "destination" or (style is None and any(target.args[i].written for i in mapping.values()))
    if style not in (None, "value", "destination"):
        raise AdaptError(f"style must be 'value' or 'destination', not {style!r}")
    # the rest by position: inputs for a value-returning entry (written arguments are its results)
    free = [i for i, a in enumerate(target.args) if i not in taken and (dest or not a.written)]
    used = []
    for p in params:
        if p.name in mapping:
            used.append(p.name)
            continue
        if p.default is not inspect.Parameter.empty:
            continue  # its own default
        if not free:
            raise AdaptError(f"{entry_name}'s parameter '{p.name}' matches no argument of {target.schema}; "
                             f"map it to one (args={{'{p.name}': ARGUMENT}}, --arg {p.name}=ARGUMENT)")
        mapping[p.name] = free.pop(0)
        used.append(p.name)
    if not dest and any(target.args[mapping[p]].written for p in used):
        raise AdaptError(f"{entry_name} returns its results but takes a written argument of {target.name}: "
                         "give style='destination'")
    ignored = [a.name for i, a in enumerate(target.args)
               if i not in mapping.values() and a.type.startswith("Tensor") and not a.written]
    return Adapter(target, entry_name, used, mapping, dest, ignored)


def adapt(target: Target, fn: Callable, *, entry_name: str, args: Optional[Dict[str, str]] = None,
          style: Optional[str] = None) -> Callable:
    """fn as an implementation of target (build(...).wrap(fn))."""
    return build(target, fn, entry_name=entry_name, args=args, style=style).wrap(fn)


def positional(target: Target, args: Sequence[Any], kwargs: Dict[str, Any]) -> list:
    """A call's arguments in schema order, defaults filled in."""
    names = [a.name for a in target.args]
    vals = list(args) + [None] * (len(names) - len(args))
    for k, v in kwargs.items():
        vals[names.index(k)] = v
    for i in range(len(args), len(names)):
        if names[i] not in kwargs and target.args[i].has_default:
            vals[i] = target.args[i].default
    return vals
