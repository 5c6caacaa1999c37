"""Differential check of the rms_norm example candidates, without understudy.

Loads each candidate .so with ctypes, builds the ust_candidate_call view by
hand (the layouts of include/understudy/candidate.h and dlpack.h), runs it on
float32 / bfloat16 / float16 inputs of several shapes and layouts, and
compares against a float64 torch reference and against vLLM's own arithmetic
(float32, rounded to the element type before the weight multiply). It then
checks that each deliberately wrong variant is wrong exactly where it says,
and that bad arguments get a negative status and a message.

    python examples/candidates/check_rms_norm.py --dir build/candidates            # CPU
    python examples/candidates/check_rms_norm.py --dir build/candidates --cuda     # GPU

Exits non-zero when a check fails.
"""
from __future__ import annotations

import argparse
import ctypes as C
import pathlib
import sys

import torch

K_DL_CPU, K_DL_CUDA = 1, 2
K_DL_INT, K_DL_FLOAT, K_DL_BFLOAT = 0, 2, 4
UST_VALUE_TENSOR, UST_VALUE_INT, UST_VALUE_DOUBLE = 1, 2, 3


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class UstValue(C.Structure):
    _fields_ = [("kind", C.c_int32), ("writable", C.c_int32), ("tensor", DLTensor),
                ("i", C.c_int64), ("f", C.c_double), ("name", C.c_char_p)]


class UstCall(C.Structure):
    _fields_ = [("size", C.c_uint32), ("n_args", C.c_int32), ("args", C.POINTER(UstValue)),
                ("n_outputs", C.c_int32), ("outputs", C.POINTER(DLTensor)),
                ("device", DLDevice), ("stream", C.c_void_p)]


RUN_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(UstCall), C.c_char_p, C.c_size_t)


class UstCandidate(C.Structure):
    _fields_ = [("size", C.c_uint32), ("abi_version", C.c_uint32), ("name", C.c_char_p),
                ("target", C.c_char_p), ("run", RUN_FN), ("ctx", C.c_void_p)]


DTYPES = {torch.float32: (K_DL_FLOAT, 32), torch.float16: (K_DL_FLOAT, 16),
          torch.bfloat16: (K_DL_BFLOAT, 16), torch.int32: (K_DL_INT, 32)}

FAILURES: list[str] = []


def check(cond: bool, what: str) -> None:
    print(("  ok    " if cond else "  FAIL  ") + what)
    if not cond:
        FAILURES.append(what)


class Candidate:
    def __init__(self, path: pathlib.Path):
        self.lib = C.CDLL(str(path))
        get = self.lib.ust_candidate_get
        get.restype = C.POINTER(UstCandidate)
        self.desc = get().contents
        self.name = self.desc.name.decode()
        self.target = self.desc.target.decode()

    def run(self, args: list[UstValue], device: DLDevice, stream: int | None = None,
            msg_cap: int = 256) -> tuple[int, str]:
        arr = (UstValue * max(1, len(args)))(*args)
        call = UstCall(size=C.sizeof(UstCall), n_args=len(args), args=arr, n_outputs=0,
                       outputs=None, device=device, stream=stream)
        buf = C.create_string_buffer(msg_cap) if msg_cap else None
        rc = self.desc.run(self.desc.ctx, C.byref(call), buf, msg_cap)
        return rc, (buf.value.decode() if buf is not None else "")


class View:
    """A DLTensor for a torch tensor; keeps the shape/stride arrays alive."""

    def __init__(self, t: torch.Tensor, null_strides: bool = False, via_byte_offset: bool = False):
        self.t = t
        self.shape = (C.c_int64 * max(1, t.dim()))(*t.shape)
        self.strides = (C.c_int64 * max(1, t.dim()))(*t.stride())
        code, bits = DTYPES[t.dtype]
        dev = DLDevice(K_DL_CUDA if t.is_cuda else K_DL_CPU, t.device.index or 0)
        data, off = t.data_ptr(), 0
        if via_byte_offset:
            base = t.untyped_storage().data_ptr()
            data, off = base, t.data_ptr() - base
        self.dl = DLTensor(data=data, device=dev, ndim=t.dim(), dtype=DLDataType(code, bits, 1),
                           shape=self.shape, strides=None if null_strides else self.strides,
                           byte_offset=off)


def tensor_arg(v: View, writable: bool, name: bytes) -> UstValue:
    return UstValue(kind=UST_VALUE_TENSOR, writable=int(writable), tensor=v.dl, name=name)


def eps_arg(eps: float) -> UstValue:
    return UstValue(kind=UST_VALUE_DOUBLE, f=eps, name=b"eps")


class Device:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.torch = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.dl = DLDevice(K_DL_CUDA if cuda else K_DL_CPU, self.torch.index or 0)

    def stream(self):
        return torch.cuda.current_stream().cuda_stream if self.cuda else None

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


SENTINEL = -12345.0  # exactly representable in all three types


def make_case(shape, dtype, layout, dev: Device, seed: int):
    """input, weight and an `out` that is a view into a sentinel-filled buffer
    with the same layout class as the input."""
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x64 = torch.randn(*shape, generator=g, dtype=torch.float64) * 3.0 + 0.5
    w64 = torch.rand(n, generator=g, dtype=torch.float64) * 2.0 - 0.5
    x = x64.to(dtype).to(dev.torch)
    w = w64.to(dtype).to(dev.torch)

    def place(t: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
        if layout == "contiguous":
            buf = torch.full((t.numel() + 64,), fill, dtype=dtype, device=dev.torch)
            view = buf[32:32 + t.numel()].view(t.shape)
        elif layout == "padded_rows":  # row stride > N: a slice of wider rows
            buf = torch.full((*t.shape[:-1], n + 7), fill, dtype=dtype, device=dev.torch)
            view = buf[..., 3:3 + n]
        elif layout == "permuted":  # leading dims swapped, last dim still unit-stride
            assert t.dim() >= 3
            perm_shape = (t.shape[1], t.shape[0], *t.shape[2:])
            buf = torch.full(perm_shape, fill, dtype=dtype, device=dev.torch)
            view = buf.transpose(0, 1)
        else:
            raise ValueError(layout)
        return buf, view

    xbuf, xv = place(x, 0.0)
    xv.copy_(x)
    obuf, ov = place(x, SENTINEL)
    return xv, w, obuf, ov


def reference(x: torch.Tensor, w: torch.Tensor, eps: float):
    """(float64 math, vLLM's float32 arithmetic in the element type)"""
    x64, w64 = x.double().cpu(), w.double().cpu()
    ref64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    xf = x.float().cpu()
    vllm = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w.cpu()
    return ref64, vllm


TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2 ** -7, 2 ** -7), torch.float16: (2 ** -10, 2 ** -9)}


def run_case(cand: Candidate, dev: Device, shape, dtype, layout, eps=1e-6, seed=0,
             null_strides=False, via_byte_offset=False):
    x, w, obuf, ov = make_case(shape, dtype, layout, dev, seed)
    before = obuf.clone()
    vx = View(x, null_strides=null_strides, via_byte_offset=via_byte_offset)
    vo = View(ov, null_strides=null_strides, via_byte_offset=via_byte_offset)
    vw = View(w)
    rc, msg = cand.run([tensor_arg(vo, True, b"out"), tensor_arg(vx, False, b"input"),
                        tensor_arg(vw, False, b"weight"), eps_arg(eps)], dev.dl, dev.stream())
    dev.sync()
    written = torch.zeros_like(obuf, dtype=torch.bool)
    written_view = written[32:32 + ov.numel()].view(ov.shape) if layout == "contiguous" else (
        written[..., 3:3 + shape[-1]] if layout == "padded_rows" else written.transpose(0, 1))
    written_view.fill_(True)
    untouched = bool(torch.equal(obuf[~written], before[~written]))
    return rc, msg, x, w, ov.clone(), untouched


def check_correct(cand: Candidate, dev: Device) -> None:
    print(f"{cand.name} (target {cand.target}) on {dev.torch}: numerics")
    cases = [((7, 4096), "contiguous"), ((1, 1), "contiguous"), ((3, 5), "contiguous"),
             ((33, 1000), "padded_rows"), ((2, 3, 1000), "contiguous"), ((4, 3, 257), "permuted"),
             ((2, 3, 5, 128), "padded_rows"), ((5, 8192), "contiguous"), ((16,), "contiguous")]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        rtol, atol = TOL[dtype]
        for i, (shape, layout) in enumerate(cases):
            for null_strides, via_off in ((False, False), (True, False), (False, True)):
                if null_strides and layout != "contiguous":
                    continue
                rc, msg, x, w, out, untouched = run_case(cand, dev, shape, dtype, layout, seed=i,
                                                         null_strides=null_strides, via_byte_offset=via_off)
                ref64, vllm = reference(x, w, 1e-6)
                o = out.cpu()
                err = (o.double() - ref64).abs()
                bound = atol + rtol * ref64.abs()
                ok = rc == 0 and bool((err <= bound).all()) and untouched and not bool(o.isnan().any())
                exact = (o == vllm).double().mean().item()
                vllm_diff = (o.double() - vllm.double()).abs().max().item()
                tag = f"{str(dtype)[6:]:>8} {str(tuple(shape)):>15} {layout:>11}" + \
                      (" strides=NULL" if null_strides else "") + (" byte_offset" if via_off else "")
                check(ok, f"{tag}: rc={rc} max|err|={err.max().item():.3e} "
                          f"max err/|ref|={(err / ref64.abs().clamp_min(1e-12)).max().item():.2e} "
                          f"== vLLM arithmetic {exact * 100:.2f}% (max diff {vllm_diff:.1e}) "
                          f"sentinels {'intact' if untouched else 'OVERWRITTEN'}" + (f" msg={msg!r}" if rc else ""))


def check_wrong(correct: Candidate, wrong: Candidate, dev: Device) -> None:
    kind = wrong.name.rsplit("wrong_", 1)[-1]
    print(f"{wrong.name} on {dev.torch}: wrong exactly as intended ({kind})")
    for dtype in (torch.float32, torch.bfloat16):
        for shape, layout in (((7, 4096), "contiguous"), ((2, 3, 1000), "contiguous"), ((4, 3, 257), "permuted")):
            _, _, x, w, good, _ = run_case(correct, dev, shape, dtype, layout, seed=5)
            rc, msg, x2, w2, bad, untouched = run_case(wrong, dev, shape, dtype, layout, seed=5)
            good, bad = good.cpu(), bad.cpu()
            tag = f"{str(dtype)[6:]:>8} {str(tuple(shape)):>15} {layout:>11}"
            n = shape[-1]
            last_row = (-1,) * (len(shape) - 1)
            if kind == "error":
                all_sentinel = bool((bad == SENTINEL).all())
                check(rc == -1 and msg.startswith("deliberate failure:") and all_sentinel and untouched,
                      f"{tag}: rc={rc} msg={msg!r} out untouched={all_sentinel}")
                continue
            diff = ~((bad == good) | (bad.isnan() & good.isnan()))
            where = [tuple(i) for i in diff.nonzero().tolist()]
            if kind == "tail":
                expect = [tuple(d % s for d, s in zip(last_row + (n - 1,), shape))]
                delta = (bad[last_row + (n - 1,)].double() - good[last_row + (n - 1,)].double()).abs().item()
                ok = rc == 0 and where == expect and delta >= 1.0 and untouched
                check(ok, f"{tag}: rc={rc} differing elements {where} (expected {expect}), |delta|={delta:.3f}")
            elif kind == "nan":
                expect = [tuple(d % s for d, s in zip(last_row + (n // 2,), shape))]
                nans = [tuple(i) for i in bad.isnan().nonzero().tolist()]
                ok = rc == 0 and where == expect and nans == expect and untouched
                check(ok, f"{tag}: rc={rc} differing elements {where}, NaNs at {nans} (expected {expect})")


def check_rejects(cand: Candidate, dev: Device) -> None:
    print(f"{cand.name} on {dev.torch}: bad arguments are refused with a message")
    t = dev.torch
    x = torch.randn(4, 16, device=t)
    out = torch.full_like(x, SENTINEL)
    w = torch.ones(16, device=t)
    vx, vo, vw = View(x), View(out), View(w)

    def args(o=vo, i=vx, ww=vw, eps=None, writable=True):
        return [tensor_arg(o, writable, b"out"), tensor_arg(i, False, b"input"),
                tensor_arg(ww, False, b"weight"), eps if eps is not None else eps_arg(1e-6)]

    bf_in = View(x.to(torch.bfloat16))
    bf_out = View(out.to(torch.bfloat16))
    int_in, int_out, int_w = View(x.to(torch.int32)), View(out.to(torch.int32)), View(w.to(torch.int32))
    strided_in = View(torch.randn(4, 32, device=t)[:, ::2])
    w_short = View(torch.ones(15, device=t))
    w_2d = View(torch.ones(1, 16, device=t))
    out_other = View(torch.empty(4, 17, device=t))
    other_dev = DLDevice(K_DL_CPU if dev.cuda else K_DL_CUDA, 0)
    cases = {
        "3 arguments": (args()[:3], dev.dl),
        "eps as an int": (args(eps=UstValue(kind=UST_VALUE_INT, i=1, name=b"eps")), dev.dl),
        "out not writable": (args(writable=False), dev.dl),
        "weight float32, input bfloat16": (args(o=bf_out, i=bf_in), dev.dl),
        "int32 tensors": (args(o=int_out, i=int_in, ww=int_w), dev.dl),
        "input last dim strided": (args(i=strided_in), dev.dl),
        "weight length 15": (args(ww=w_short), dev.dl),
        "weight 2-D": (args(ww=w_2d), dev.dl),
        "out shape differs": (args(o=out_other), dev.dl),
        "call on the other device type": (args(), other_dev),
    }
    for what, (a, d) in cases.items():
        rc, msg = cand.run(a, d, dev.stream())
        dev.sync()
        check(rc < 0 and len(msg) > 0 and bool((out == SENTINEL).all()), f"{what}: rc={rc} msg={msg!r}")
    rc, _ = cand.run(args()[:3], dev.dl, dev.stream(), msg_cap=0)
    check(rc < 0, f"msg NULL / capacity 0 is tolerated: rc={rc}")
    rc, msg = cand.run(args()[:3], dev.dl, dev.stream(), msg_cap=8)
    check(rc < 0 and len(msg) == 7, f"message truncated to the capacity: {msg!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=pathlib.Path, required=True, help="folder with librms_norm_*.so")
    ap.add_argument("--cuda", action="store_true", help="check the CUDA candidates on the current GPU")
    opts = ap.parse_args()
    dev = Device(opts.cuda)
    stem = "librms_norm_cuda" if opts.cuda else "librms_norm_cpu"
    correct = Candidate(opts.dir / f"{stem}.so")
    check(correct.target == "_C::rms_norm" and correct.desc.abi_version == 1
          and correct.desc.size == C.sizeof(UstCandidate), f"descriptor: name={correct.name!r} target={correct.target!r}")
    check_correct(correct, dev)
    check_rejects(correct, dev)
    for kind in ("tail", "nan", "error"):
        path = opts.dir / f"{stem}_wrong_{kind}.so"
        if path.exists():
            check_wrong(correct, Candidate(path), dev)
    print(f"{len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
