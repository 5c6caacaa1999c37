"""Deliberately broken torch-op candidates for aten::silu (CPU and CUDA).

They exist to show that understudy catches a candidate that is wrong in one
element, and one that fails outright:

    understudy_examples::silu_wrong_tail   silu, except the last element of the
                                           flattened output, which is off by at
                                           least 1 + |y|
    understudy_examples::silu_raises       raises RuntimeError("deliberate failure: ...")
    understudy_examples::silu_goes_wrong   silu, bit-identical to production for its
                                           first GOES_WRONG_AFTER calls, then wrong in
                                           the last element (a candidate that breaks
                                           in production, for canary and live)

    import wrong_silu
    wrong_silu.register()   # both; or register_wrong_tail() / register_raises()

Importing this module registers nothing.
"""
from __future__ import annotations

import torch

TARGET = "aten::silu"
WRONG_TAIL_NAME = "understudy_examples::silu_wrong_tail"
RAISES_NAME = "understudy_examples::silu_raises"
GOES_WRONG_NAME = "understudy_examples::silu_goes_wrong"
GOES_WRONG_AFTER = 40
_runs = {"n": 0}


def silu_wrong_tail(self: torch.Tensor) -> torch.Tensor:
    """aten::silu(Tensor self) -> Tensor, wrong in the last element only."""
    # aten::silu itself, so that every other element is bit-identical to
    # production. understudy runs candidates with its interceptors stood
    # aside, so this call is not shadowed again.
    out = torch.ops.aten.silu.default(self)
    if out.numel() > 0:
        # The last element in row-major order (out keeps the input's strides,
        # as torch's silu does, so index it rather than view it flat). Off by
        # at least 1 + |y| whatever y is, so no tolerance passes it; a NaN or
        # an infinity becomes 0.
        last = (-1,) * out.dim()
        y = out[last]
        out[last] = torch.where(torch.isfinite(y), 1.0 + 2.0 * y.abs(), torch.zeros_like(y))
    return out


def silu_goes_wrong(self: torch.Tensor) -> torch.Tensor:
    """aten::silu(Tensor self) -> Tensor: right for GOES_WRONG_AFTER calls, then wrong in the tail."""
    _runs["n"] += 1
    if _runs["n"] <= GOES_WRONG_AFTER:
        return torch.ops.aten.silu.default(self)
    return silu_wrong_tail(self)


def raising_silu(self: torch.Tensor) -> torch.Tensor:
    """aten::silu(Tensor self) -> Tensor, that always raises."""
    raise RuntimeError("deliberate failure: understudy_examples::silu_raises never computes")


def register_wrong_tail() -> str:
    import understudy
    return understudy.register_candidate(WRONG_TAIL_NAME, silu_wrong_tail, like=TARGET)


def register_raises() -> str:
    import understudy
    return understudy.register_candidate(RAISES_NAME, raising_silu, like=TARGET)


def register_goes_wrong() -> str:
    import understudy
    return understudy.register_candidate(GOES_WRONG_NAME, silu_goes_wrong, like=TARGET)


def register() -> tuple[str, str]:
    """Registers both candidates; returns their qualified op names."""
    return register_wrong_tail(), register_raises()
