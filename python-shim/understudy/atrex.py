"""Export the observed workload in Atrex-Bench's layout, so the benchmark can be
refreshed from live traffic:

    python -m understudy export-atrex OUT_DIR REPORT.json [--problems-dir DIR]

writes OUT_DIR/<operator>/shapes.json (the observed shape keys as the
benchmark's kwargs, busiest first), OUT_DIR/<operator>/observed.json (calls,
device time and phase per exported shape) and OUT_DIR/operator_importance.json
(each exported operator's share of the exported device time). The mapping from
shape-key dimensions to kwargs is the "atrex" block of the operator's
definition, read from the problems directory (not from the report's paths).
Dimensions bucketed in the shape key (pow2) are exported as the
bucket's upper bound.
"""
from __future__ import annotations

import ast
import json
import operator
import os
import re
import time

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.truediv}


def _eval(expr, dims: dict):
    """Numbers, dimension names and + - * / // over them; nothing else."""
    if isinstance(expr, (int, float)) or expr is None:
        return expr
    if isinstance(expr, list):
        return [_eval(e, dims) for e in expr]

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise ValueError(f"'{expr}': '{node.id}' is not a dimension of the shape key ({', '.join(dims)})")
            return dims[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"'{expr}': only numbers, dimension names and + - * / are allowed")

    v = ev(ast.parse(str(expr), mode="eval"))
    return int(v) if isinstance(v, float) and v.is_integer() else v


_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _definitions(problems_dir: str) -> dict:
    """Operator name -> its atrex mapping, from the definitions in problems_dir
    (never from paths a report names: reports come from other machines)."""
    out = {}
    for fn in sorted(os.listdir(problems_dir)):
        if not fn.endswith(".json"):
            continue
        with open(os.path.join(problems_dir, fn)) as f:
            d = json.load(f)
        if isinstance(d, dict) and d.get("atrex"):
            out[d["operator"]] = d["atrex"]
    return out


def export(rep: dict, out_dir: str, problems_dir: str = None) -> dict:
    """Write the files; returns {operator: number of shapes exported}. Raises
    ValueError when nothing of the report can be exported."""
    if problems_dir is None:
        from . import problems_dir as default_dir
        problems_dir = str(default_dir())
    mappings = _definitions(problems_dir)
    out_root = os.path.realpath(out_dir)
    exported, importance, total = {}, {}, 0.0
    for o in rep["operators"]:
        mapping = mappings.get(o["name"])
        if not mapping:
            continue
        name = mapping["operator"]
        if not _SAFE.match(name) or ".." in name:
            raise ValueError(f"operator {o['name']!r}: atrex operator name {name!r} is not a plain directory name")
        rows = {}
        for s in sorted(o["shapes"], key=lambda s: -s["est_device_time_ns"]):
            b = mapping["bindings"].get(s["op"])
            if b is None or s["calls"] == 0:
                continue
            kwargs = {k: _eval(v, s["dims"]) for k, v in b["input_kwargs"].items()}
            ident = json.dumps(kwargs, sort_keys=True)
            row = rows.setdefault(ident, {"init_kwargs": b.get("init_kwargs"), "input_kwargs": kwargs,
                                          "calls": 0, "est_device_time_ns": 0.0, "phases": set(), "keys": []})
            row["calls"] += s["calls"]
            row["est_device_time_ns"] += s["est_device_time_ns"]
            row["phases"].add(s.get("phase", "unknown"))
            row["keys"].append(s["key"])
        if not rows:
            continue
        ordered = sorted(rows.values(), key=lambda r: -r["est_device_time_ns"])
        d = os.path.join(out_root, name)
        if os.path.dirname(os.path.realpath(d)) != out_root:
            raise ValueError(f"{d} is not inside {out_root}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "shapes.json"), "w") as f:
            json.dump({str(i): {"init_kwargs": r["init_kwargs"], "input_kwargs": r["input_kwargs"]}
                       for i, r in enumerate(ordered)}, f, indent=2)
        with open(os.path.join(d, "observed.json"), "w") as f:
            json.dump({str(i): {"calls": r["calls"], "est_device_time_ns": r["est_device_time_ns"],
                                "phases": sorted(r["phases"]), "shape_keys": r["keys"]}
                       for i, r in enumerate(ordered)}, f, indent=2)
        est = sum(r["est_device_time_ns"] for r in ordered)
        phases = sorted({p for r in ordered for p in r["phases"]} - {"unknown"})
        importance[name] = {"est_device_time_ns": est, "phase": "/".join(phases) or "unknown",
                            "num_profiles": len(ordered)}
        total += est
        exported[name] = len(ordered)
    if not exported:
        raise ValueError("no operator of the report has an atrex mapping in " + problems_dir
                         + " (or none of its shape keys was called)")
    for v in importance.values():
        v["importance_score"] = v["est_device_time_ns"] / total if total > 0 else 0.0
    with open(os.path.join(out_dir, "operator_importance.json"), "w") as f:
        json.dump({"metadata": {"num_profiles": sum(v["num_profiles"] for v in importance.values()),
                                "frameworks": ["understudy live traffic"],
                                "generated_unix_ms": int(time.time() * 1000),
                                "note": "importance = share of the exported operators' observed device time; "
                                        "pow2-bucketed dimensions are the bucket's upper bound"},
                   "operators": {k: {kk: v[kk] for kk in ("importance_score", "phase", "num_profiles")}
                                 for k, v in sorted(importance.items(), key=lambda kv: -kv[1]["importance_score"])}},
                  f, indent=2)
    return exported
