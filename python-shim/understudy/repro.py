"""Failing calls kept in a report, replayed and exported.

When a route's candidate first fails a verification and the call's tensor
arguments fit `guard.repro_bytes`, the report keeps the call whole under the
route's `shadow.repro`: the op and its schema, every argument (a tensor's
dtype, shape, strides, storage offset and the values of the storage it
spans; any other argument's value), both sides' values at the failing
output's worst elements, the verdict, and the candidate's identity.

replay() runs that call again in this process, under understudy with the
route's operator in shadow on every call, and returns the guard's verdict
beside the kept one: the same code judges it, so a candidate that is wrong
on those inputs fails again, for the same reason on the same output.

export_workload() writes the call as a FlashInfer-Bench Workload: a dataset
folder (definitions/, workloads/, blob/) that flashinfer_bench's TraceSet and
load_safetensors read.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
from typing import Dict, List, Optional, Tuple


class ReproError(ValueError):
    """A report without a kept call, or one that cannot be replayed here."""


_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "float8_e4m3fn", "float8_e5m2")
# An offset into a storage larger than this is replayed at 0 (the span's values
# are what the op reads; a replay need not allocate what lies before them).
_MAX_OFFSET_BYTES = 1 << 26


def kept(report: dict) -> List[dict]:
    """Every kept call of a report: dicts with the route's key, operator,
    mode, candidate (the operator's entry), rollback evidence and the repro
    (candidate identity and call)."""
    out = []
    for op in report.get("operators") or []:
        for s in op.get("shapes") or []:
            sh = s.get("shadow") or {}
            if sh.get("repro"):
                out.append({"key": s.get("key"), "operator": op.get("name"), "definition": op.get("definition"),
                            "candidate": op.get("candidate") or {}, "rollback": sh.get("rollback"),
                            "repro": sh["repro"]})
    return out


def load(path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ReproError(f"cannot read the report '{path}': {e}") from None


def pick(report: dict, key: Optional[str] = None) -> dict:
    calls = kept(report)
    if not calls:
        raise ReproError("the report keeps no failing call (a route keeps its first failing verification when the "
                         "call's tensors fit guard.repro_bytes)")
    if key is None:
        return calls[0]
    for c in calls:
        if c["key"] == key:
            return c
    raise ReproError(f"no kept call on route '{key}' (kept: {', '.join(c['key'] for c in calls)})")


def _dtype(name):
    import torch

    if name not in _DTYPES or not hasattr(torch, name):
        raise ReproError(f"a kept tensor has dtype '{name}', which this torch does not have")
    return getattr(torch, name)


def tensor(spec: dict, device=None):
    """A kept tensor, rebuilt with its dtype, shape, strides and (where it is
    small enough) storage offset, on device (default: its own)."""
    import torch

    dt = _dtype(spec["dtype"])
    raw = base64.b64decode(spec["data"])
    span = int(spec["span"])
    esize = torch.empty((), dtype=dt).element_size()
    if len(raw) != span * esize:
        raise ReproError(f"a kept tensor holds {len(raw)} bytes, not the {span * esize} its span needs")
    offset = int(spec["storage_offset"])
    if offset * esize > _MAX_OFFSET_BYTES:
        offset = 0
    dev = torch.device(device if device is not None else spec.get("device", "cpu"))
    base = torch.empty(offset + span, dtype=dt, device=dev)
    if span:
        vals = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt)
        base[offset:].copy_(vals)
    return base.as_strided(spec["shape"], spec["stride"], offset)


def _value(v, typ: str):
    """A kept non-tensor argument as the op takes it (its schema type)."""
    import torch

    if v is None:
        return None
    base = typ.rstrip("?")
    if base == "ScalarType":
        return _scalar_type(v)
    if base == "Layout":
        return [torch.strided, torch.sparse_coo][v] if v in (0, 1) else v
    if base == "MemoryFormat":
        return [torch.contiguous_format, torch.preserve_format, torch.channels_last,
                torch.channels_last_3d][v] if 0 <= v < 4 else v
    if base == "Device":
        return torch.device(v)
    if isinstance(v, str) and v in ("nan", "inf", "-inf") and base in ("float", "Scalar"):
        return float(v)
    if isinstance(v, list):
        return [float(x) if isinstance(x, str) and x in ("nan", "inf", "-inf") else x for x in v]
    return v


def _scalar_type(v):
    """torch's dtype by its number in c10's ScalarType enum."""
    import torch

    order = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
             torch.float64, None, None, None, torch.bool, None, None, None, torch.bfloat16]
    if not isinstance(v, int) or not 0 <= v < len(order) or order[v] is None:
        raise ReproError(f"a kept dtype argument is {v!r}, which a replay does not map")
    return order[v]


def arguments(call: dict, device=None) -> Tuple[list, dict]:
    """The kept call's arguments: (positional, keyword) as the op takes them."""
    op = _op(call)
    schema = op._schema.arguments
    if len(schema) != len(call["args"]):
        raise ReproError(f"{call['op']} takes {len(schema)} arguments here; the kept call has "
                         f"{len(call['args'])} (another torch or another definition of the op)")
    pos, kw = [], {}
    for a, s in zip(call["args"], schema):
        if a.get("unsupported"):
            raise ReproError(f"argument '{a['name']}' ({a['type']}) was not kept: a replay cannot supply it")
        if "tensor" in a:
            v = tensor(a["tensor"], device)
        elif "tensors" in a:
            v = [tensor(t, device) if t is not None else None for t in a["tensors"]]
        else:
            v = _value(a.get("value"), a.get("type", ""))
        if s.kwarg_only:
            kw[s.name] = v
        else:
            pos.append(v)
    return pos, kw


def _op(call: dict):
    import torch

    ns, _, name = call["op"].partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, call.get("overload") or "default")
    except (AttributeError, RuntimeError):
        raise ReproError(f"the op {call['op']}{'.' + call['overload'] if call.get('overload') else ''} is not "
                         "defined in this process (import the module that defines it)") from None


def _candidate_entry(c: dict, config: Optional[dict]) -> dict:
    """The candidate as the replay's config names it: the given config's
    entry for the operator, else what the report says of it."""
    if config is not None:
        entry = ((config.get("operators") or {}).get(c["operator"]) or {})
        if isinstance(entry, dict) and entry.get("candidate"):
            return entry["candidate"]
        raise ReproError(f"the config has no candidate for operator '{c['operator']}'")
    cand = c["candidate"]
    if cand.get("kind") == "native":
        return {"native": cand["path"], "sha256": cand["sha256"]}
    return {"torch_op": cand["name"], "target": cand["target"]}


def replay(report, *, key: Optional[str] = None, config=None, device=None) -> dict:
    """Replays a kept failing call of report (a dict or a path) in this
    process, where understudy must not be enabled: its operator in shadow on
    every call with the same candidate (config: the config that named it,
    as a dict or path, for candidates from files, Solutions or hub layers;
    else the report's own: a native candidate's path and digest, or a torch
    op this process defines). Returns a dict: key, kept (the kept verdict:
    reason, output), replayed (the guard's: reason, output, verified,
    failed, evidence) and same (whether they agree)."""
    import torch

    import understudy

    rep = load(report) if isinstance(report, (str, os.PathLike)) else report
    c = pick(rep, key)
    call = c["repro"]["call"]
    if isinstance(config, (str, os.PathLike)):
        config = load(config)
    if understudy.is_enabled():
        raise ReproError("understudy is enabled in this process: replay a kept call in a process of its own "
                         "(`understudy repro REPORT`)")
    cand = _candidate_entry(c, config)
    ev = c.get("rollback") or {}
    guard = {}
    for k in ("atol", "rtol"):
        if (c["candidate"] or {}).get(k) is not None:
            guard[k] = c["candidate"][k]
    entry = {"mode": "shadow", "sample": 1.0, "candidate": cand, "guard": {"max_slowdown": 1e9, **guard}}
    if (c["candidate"] or {}).get("compare"):
        entry["guard"]["compare"] = c["candidate"]["compare"]
    cfg = {"operators": {c["operator"]: entry}, "defaults": {"key_every": 1}, "report": {"interval_s": 0}}
    if config is not None and config.get("problems"):
        cfg["problems"] = config["problems"]
    dev = device if device is not None else call.get("device")
    if dev and dev.startswith("cuda") and not torch.cuda.is_available():
        raise ReproError(f"the call ran on {dev}; this process has no CUDA device (--device cpu replays it on the "
                         "CPU, with the CPU's kernels)")
    args, kwargs = arguments(call, dev)
    op = _op(call)
    understudy.enable(cfg)
    try:
        op(*args, **kwargs)
        if dev and dev.startswith("cuda"):
            torch.cuda.synchronize()
        out = understudy.report()
    finally:
        understudy.disable()
    routes = [s for o in out.get("operators") or [] for s in o.get("shapes") or []
              if o.get("name") == c["operator"] and (s.get("shadow") or {}).get("calls")]
    if not routes:
        raise ReproError(f"the replayed call of {call['op']} was not shadowed (its route took no shadow call: "
                         "a candidate whose torch op is not defined here, or whose 'when' excludes the shape)")
    sh = routes[0]["shadow"]
    got = sh.get("rollback") or {}
    replayed = {"reason": got.get("reason"), "output": got.get("output"), "verified": sh.get("verified"),
                "failed": sh.get("failed"), "evidence": got or None, "key": routes[0].get("key")}
    kept_v = {"reason": call.get("reason") or ev.get("reason"), "output": call.get("output") or ev.get("output")}
    same = sh.get("failed", 0) > 0 and replayed["reason"] == kept_v["reason"] and \
        (replayed["output"] or "") == (kept_v["output"] or "")
    return {"key": c["key"], "operator": c["operator"], "candidate": c["repro"]["candidate"], "kept": kept_v,
            "replayed": replayed, "same": same, "device": dev}


# ---- FlashInfer-Bench Workload -----------------------------------------------------

def _definition(path):
    try:
        from flashinfer_bench.data import Definition
    except ImportError:
        raise ReproError("flashinfer-bench is not installed (pip install flashinfer-bench)") from None
    d = load(path)
    if "definition" in d and isinstance(d["definition"], dict):
        d = d["definition"]
    try:
        return Definition.model_validate(d)
    except Exception as e:
        raise ReproError(f"'{path}' is not a FlashInfer-Bench Definition: {e}") from None


def export_workload(report, out_dir, *, definition, key: Optional[str] = None,
                    args: Optional[Dict[str, str]] = None) -> dict:
    """Writes the kept call as a FlashInfer-Bench workload of definition (a
    Definition JSON path): out_dir/definitions/OP_TYPE/NAME.json,
    out_dir/workloads/OP_TYPE/NAME.jsonl (a workload trace) and its inputs in
    out_dir/blob/workloads/OP_TYPE/NAME/NAME_UUID.safetensors. args maps the
    Definition's input names to the op's argument names where they differ
    (default: the candidate's own mapping, when it came from a Solution,
    else the same names). Returns the workload as a dict."""
    try:
        import safetensors.torch
        from flashinfer_bench.data import Trace, Workload
    except ImportError as e:
        raise ReproError(f"exporting a Workload needs flashinfer-bench and safetensors: {e}") from None
    rep = load(report) if isinstance(report, (str, os.PathLike)) else report
    c = pick(rep, key)
    call = c["repro"]["call"]
    d = _definition(definition)
    src = (c["candidate"] or {}).get("source") or {}
    mapping = dict(args or (src.get("args") if isinstance(src.get("args"), dict) else None) or {})
    by_name = {a["name"]: a for a in call["args"]}
    axes: Dict[str, int] = {}
    inputs, blobs = {}, {}
    for name, spec in d.inputs.items():
        arg = by_name.get(mapping.get(name, name))
        if arg is None:
            raise ReproError(f"Definition '{d.name}' input '{name}' maps to no argument of {call['op']} "
                             f"({', '.join(by_name)}): map it with --arg {name}=ARG")
        if spec.shape is None:  # a scalar
            if "value" not in arg or isinstance(arg.get("value"), (list, dict)) or arg["value"] is None:
                raise ReproError(f"Definition '{d.name}' input '{name}' is a scalar; argument '{arg['name']}' is not")
            inputs[name] = {"type": "scalar", "value": arg["value"]}
            continue
        if "tensor" not in arg:
            raise ReproError(f"Definition '{d.name}' input '{name}' is a tensor; argument '{arg['name']}' is not")
        t = tensor(arg["tensor"], "cpu")
        if t.dim() != len(spec.shape):
            raise ReproError(f"Definition '{d.name}' input '{name}' has rank {len(spec.shape)}; the call's "
                             f"'{arg['name']}' is {list(t.shape)}")
        for axis, size in zip(spec.shape, t.shape):
            if axis in axes and axes[axis] != size:
                raise ReproError(f"axis '{axis}' is {axes[axis]} and {size} in the call's arguments")
            axes[axis] = int(size)
        blobs[name] = t.contiguous()
    const = {n: a.value for n, a in d.axes.items() if getattr(a, "type", None) == "const"}
    for n, v in const.items():
        if n in axes and axes[n] != v:
            raise ReproError(f"Definition '{d.name}' fixes axis '{n}' at {v}; the call has {axes[n]}")
    var_axes = {n: v for n, v in axes.items() if n not in const}
    digest = hashlib.sha256(json.dumps(call, sort_keys=True).encode()).hexdigest()
    uuid = f"understudy-{digest[:16]}"
    out = pathlib.Path(out_dir)
    rel = pathlib.Path("blob") / "workloads" / d.op_type / d.name / f"{d.name}_{uuid}.safetensors"
    for name in blobs:
        inputs[name] = {"type": "safetensors", "path": str(rel), "tensor_key": name}
    workload = Workload.model_validate({"axes": var_axes, "inputs": inputs, "uuid": uuid})
    trace = Trace(definition=d.name, workload=workload)
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(blobs, str(out / rel))
    (out / "definitions" / d.op_type).mkdir(parents=True, exist_ok=True)
    (out / "definitions" / d.op_type / f"{d.name}.json").write_text(d.model_dump_json(indent=2))
    wl = out / "workloads" / d.op_type / f"{d.name}.jsonl"
    wl.parent.mkdir(parents=True, exist_ok=True)
    lines = [ln for ln in (wl.read_text().splitlines() if wl.exists() else []) if ln.strip()]
    lines = [ln for ln in lines if json.loads(ln).get("workload", {}).get("uuid") != uuid]
    lines.append(trace.model_dump_json())
    wl.write_text("\n".join(lines) + "\n")
    return json.loads(trace.model_dump_json())


def summary(r: dict) -> str:
    """One paragraph on a replay, as `understudy repro` prints it."""
    k, g = r["kept"], r["replayed"]
    what = f"{k['reason']}" + (f" in {k['output']}" if k.get("output") else "")
    got = f"{g['reason']}" + (f" in {g['output']}" if g.get("output") else "") if g.get("reason") else \
        f"passed ({g.get('verified', 0)} verified)"
    cand = r["candidate"].get("label") or r["candidate"].get("name")
    line = f"{r['key']}: candidate {cand} on {r['device']}: kept verdict {what}; replayed: {got}"
    ev = g.get("evidence") or {}
    if ev.get("mismatches") is not None:
        line += f" ({ev['mismatches']} of {ev.get('elements')} elements, max abs err {ev.get('max_abs_err'):.4g})"
    return line + ("; reproduced" if r["same"] else "; NOT reproduced")

