"""Candidates from Python: torch-op candidates, native pins, and the guard's comparison.

A torch-op candidate is any dispatcher op with the schema of the op it stands
in for; understudy calls it with the same arguments. register_candidate turns
a Python function (plain torch, Triton, any DSL that launches on torch's
current stream) into such an op.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import threading
from typing import Callable, Optional, Union

_libraries: dict = {}  # namespace -> torch.library.Library; kept alive while the process runs
_lock = threading.Lock()


def register_candidate(name: str, fn: Callable, like: str, *,
                       dispatch_key: str = "CompositeExplicitAutograd") -> str:
    """Define the dispatcher op `name` ("ns::op") with the schema of `like`
    ("aten::mm", "_C::rms_norm", "aten::mm.out"), implemented by fn, and
    return its name for the config's candidate.torch_op.

    fn receives the arguments production receives; ops that write an argument
    (Tensor(a!)) must write it in place, as production does, and return what
    production returns.
    """
    ns, sep, op = name.partition("::")
    if not sep or not ns or not op or "." in op:
        raise ValueError(f"candidate name '{name}' must look like 'namespace::op'")
    _define(ns, op, fn, like, dispatch_key)
    return name


def _define(ns: str, op: str, fn: Callable, like: Optional[str] = None, dispatch_key: str = "CompositeExplicitAutograd",
            *, signature: Optional[str] = None) -> None:
    """Define ns::op (op may carry an overload: "name.qualify") with like's
    schema, or with signature ("(Tensor x) -> Tensor"), implemented by fn."""
    import torch

    if signature is None:
        qual, _, overload = like.partition(".")
        try:
            schema = torch._C._get_schema(qual, overload)
        except RuntimeError:
            raise ValueError(f"'{like}' is not a dispatcher op defined in this process") from None
        signature = _definable_signature(str(schema))
    with _lock:
        lib = _libraries.get(ns)
        if lib is None:
            lib = _libraries[ns] = torch.library.Library(ns, "FRAGMENT")
        lib.define(op + signature)
        lib.impl(op, fn, dispatch_key)


def _definable_signature(schema_text: str) -> str:
    """The argument and return list of a printed schema, in a form torch's
    schema parser accepts again. An argument declared `Tensor!` (vLLM's
    `_C::rms_norm(Tensor! result, ...)`, SGLang's ops) is written to an
    alias set without a name, which torch prints as `Tensor($0! -> )` and
    then refuses to parse ("expected a valid token but found '$'"): each
    such set gets a name of its own, unused in the schema, so the candidate's
    op writes the same arguments as the op it stands in for."""
    signature = schema_text[schema_text.index("("):]
    taken = set(re.findall(r"Tensor(?:\[\])?\(([A-Za-z_]\w*)", signature))  # the named alias sets
    prefix = "w"
    while any(t.startswith(prefix) for t in taken):
        prefix += "w"
    return re.sub(r"\(\$(\d+)(!?)(?:\s*->\s*)?\)", lambda m: f"({prefix}{m.group(1)}{m.group(2)})", signature)


def sha256_of(path: Union[str, os.PathLike]) -> str:
    """The SHA-256 of a file, as the config's candidate.sha256 pin wants it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def native(path: Union[str, os.PathLike], *, target: Optional[str] = None) -> dict:
    """A config candidate entry for the native shared object at path, pinned
    to its current SHA-256. Pin in the config by hand where the file is not
    trusted at the moment the config is written."""
    entry = {"native": os.fspath(path), "sha256": sha256_of(path)}
    if target:
        entry["target"] = target
    return entry


class CompareResult(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("elements", ctypes.c_uint64), ("mismatches", ctypes.c_uint64),
                ("nonfinite_production", ctypes.c_uint64), ("nonfinite_candidate", ctypes.c_uint64),
                ("nonfinite_bad", ctypes.c_uint64), ("first_mismatch", ctypes.c_int64),
                ("max_abs_err", ctypes.c_double), ("max_rel_err", ctypes.c_double),
                ("sum_sq_diff", ctypes.c_double), ("sum_sq_production", ctypes.c_double),
                ("device_time_ns", ctypes.c_double)]

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name, _ in self._fields_ if name != "size"}


def _dltensor_ptr(capsule) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, b"dltensor")  # DLManagedTensor*, whose first member is the DLTensor


def compare(production, candidate, *, exact: bool = False, atol: float = -1.0, rtol: float = -1.0) -> dict:
    """Compare two tensors exactly as the guard judges a candidate (one pass of
    the host loop or the GPU kernel); atol/rtol < 0 take the guard's defaults
    for the dtype. Synchronises the current stream on a GPU."""
    import torch
    from torch.utils.dlpack import to_dlpack

    from . import _check, _load

    lib = _load()
    fn = lib.ust_compare_sync
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                   ctypes.c_void_p, ctypes.POINTER(CompareResult)]
    p, c = production.contiguous(), candidate.contiguous()
    cp, cc = to_dlpack(p), to_dlpack(c)
    stream = torch.cuda.current_stream(p.device).cuda_stream if p.is_cuda else None
    out = CompareResult(size=ctypes.sizeof(CompareResult))
    _check(fn(_dltensor_ptr(cp), _dltensor_ptr(cc), 1 if exact else 0, atol, rtol, stream, ctypes.byref(out)))
    del cp, cc
    return out.as_dict()
