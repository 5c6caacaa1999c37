"""A torch-op candidate for aten::mm on CUDA: a tiled Triton GEMM.

    import triton_mm
    name = triton_mm.register()   # "understudy_examples::mm_triton"

then, in the understudy config,

    "candidate": {"torch_op": "understudy_examples::mm_triton", "target": "aten::mm"}

The kernel computes C = A @ B for float16, bfloat16 and float32 matrices of
any strides, accumulates in float32 and writes C in the inputs' dtype. For
float32 it uses TF32 tensor cores only when torch does
(torch.backends.cuda.matmul.allow_tf32), so that it is compared like for like
with production; in that mode its error on an H200 was about 2.5 times
cuBLAS's (still within TF32's 2^-10), so give such a route a TF32 tolerance.

Importing this module does nothing beyond defining functions: triton is
imported, and the kernel compiled, on first use.
"""
from __future__ import annotations

import torch

OP_NAME = "understudy_examples::mm_triton"
TARGET = "aten::mm"

# Bound by _get_kernel on first use; _mm_kernel reads `tl` from these globals.
triton = None
tl = None
_kernel = None  # triton.jit(_mm_kernel)


def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
               stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # Program ids are grouped GROUP_M tiles down a column of C, so that tiles
    # running together share rows of A and columns of B in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # 64-bit offsets: row * stride overflows 32 bits for large operands.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


def _get_kernel():
    """Imports triton and wraps _mm_kernel with triton.jit, once."""
    global _kernel, triton, tl
    if _kernel is None:
        import triton
        import triton.language as tl
        _kernel = triton.jit(_mm_kernel)
    return _kernel


# Tile shapes per input dtype: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages).
# float32 tiles are smaller: their operands take twice the shared memory.
_CONFIGS = {
    torch.float16: (128, 128, 32, 8, 8, 3),
    torch.bfloat16: (128, 128, 32, 8, 8, 3),
    torch.float32: (64, 64, 32, 8, 4, 3),
}


def mm_triton(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten::mm(Tensor self, Tensor mat2) -> Tensor, on CUDA tensors."""
    if self.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(f"mm_triton: both arguments must be matrices, got {self.dim()}-D and {mat2.dim()}-D")
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mm_triton: shapes {tuple(self.shape)} and {tuple(mat2.shape)} cannot be multiplied")
    if self.dtype != mat2.dtype:
        raise RuntimeError(f"mm_triton: dtypes differ ({self.dtype} and {mat2.dtype})")
    if self.dtype not in _CONFIGS:
        raise RuntimeError(f"mm_triton: dtype {self.dtype} is not float16, bfloat16 or float32")
    if not (self.is_cuda and mat2.is_cuda) or self.device != mat2.device:
        raise RuntimeError(f"mm_triton: both arguments must be on one CUDA device, got {self.device} and {mat2.device}")

    M, K = self.shape
    N = mat2.shape[1]
    out = torch.empty((M, N), dtype=self.dtype, device=self.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()

    block_m, block_n, block_k, group_m, num_warps, num_stages = _CONFIGS[self.dtype]
    precision = "tf32" if self.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"
    kernel = _get_kernel()
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    with torch.cuda.device(self.device):  # triton launches on this device's current stream
        kernel[grid](self, mat2, out, M, N, K,
                     self.stride(0), self.stride(1), mat2.stride(0), mat2.stride(1), out.stride(0), out.stride(1),
                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                     INPUT_PRECISION=precision, num_warps=num_warps, num_stages=num_stages)
    return out


def register() -> str:
    """Defines the dispatcher op understudy_examples::mm_triton with aten::mm's
    schema, implemented by mm_triton, and returns its qualified name."""
    _get_kernel()  # fail here, not at the first shadowed call, when triton is missing
    import understudy
    return understudy.register_candidate(OP_NAME, mm_triton, like=TARGET)
