"""Every operator definition names arguments its ops really have: key dimensions,
written arguments and roofline variables, checked against the op's schema
(torch's own for aten ops and torch.distributed's c10d ops; for vLLM and
SGLang ops, the schemas they register, kept in tests/data/serving-schemas.json,
since those frameworks are not installed here)."""
import json
import re

import pytest
import torch

from conftest import ROOT

SERVING = json.loads((ROOT / "tests" / "data" / "serving-schemas.json").read_text())["schemas"]


def schema_args(text):
    """Argument names of a schema string 'ns::op(Type name=default, ...) -> ...'."""
    inner = text[text.index("(") + 1:]
    depth, cur, parts = 0, "", []
    for ch in inner:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                parts.append(cur)
                break
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    names = []
    for p in parts:
        p = p.split("=")[0].strip()
        if not p or p == "*":
            continue
        names.append(p.split()[-1])
    return names


def dim_args(expr):
    """The argument names a dimension reads (dispatch/dimexpr.c's grammar)."""
    m = re.match(r"^seq(sum|dot|tri|cdiv)\((.*)\)$", expr)
    if m:  # sequence lengths: sources NAME or diff(NAME), joined by '|'; seqcdiv's divisor NAME[i] or NAME
        return {n for part in m.group(2).split(",") for src in part.split("|")
                for n in dim_args(re.sub(r"^diff\((\w+)\)$", r"\1", src.strip()))}
    m = (re.match(r"^(rows|numel|len|esize|bytes|obytes|nbytes|onbytes|dtsize)\((\w+)\)$", expr)
         or re.match(r"^(\w+)\[-?\d+\]$", expr))
    if m:
        return {m.group(m.lastindex)}
    assert re.match(r"^\w+$", expr), expr
    return {expr}


def bound_ops():
    for f in sorted((ROOT / "problems").glob("*.json")):
        d = json.loads(f.read_text())
        for b in d["bindings"]:
            for ov in b.get("overloads", [""]):
                yield f.name, b["op"] + ("." + ov if ov else ""), b


def schema_of(name):
    if name.split("::")[0] in ("aten", "c10d", "_c10d_functional"):  # defined by torch itself
        qual, _, ov = name.partition(".")
        return str(torch._C._get_schema(qual, ov))
    return SERVING.get(name)


@pytest.mark.parametrize("file, op, binding", list(bound_ops()), ids=lambda x: x if isinstance(x, str) else None)
def test_definition_names_real_arguments(file, op, binding):
    text = schema_of(op)
    assert text is not None, f"{op}: no schema known"
    args = set(schema_args(text))
    for dim, expr in binding["key"].items():
        assert dim_args(expr) <= args, f"{file} {op}: key {dim} = {expr}: no such argument in {text}"
    if "writes" in binding:
        # the curated list covers every overload of the binding (mm.out writes out, mm writes nothing):
        # each name must exist in one of them
        every = set()
        for ov in binding.get("overloads", [""]):
            every |= set(schema_args(schema_of(binding["op"] + ("." + ov if ov else ""))))
        for w in binding["writes"]:
            assert w in every or w in ("out", "result"), f"{file} {op}: written argument {w} in none of its overloads"
        assert every & set(binding["writes"]), f"{file} {op}: none of {binding['writes']} in any overload"
    rl = binding.get("roofline")
    if rl:
        for var, expr in rl["vars"].items():
            assert dim_args(expr) <= args, f"{file} {op}: roofline var {var} = {expr}: no such argument in {text}"
        assert rl["W_dtype"] in args, f"{file} {op}: W_dtype {rl['W_dtype']} not in {text}"
