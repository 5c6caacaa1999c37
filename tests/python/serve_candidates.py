"""The torch-op candidate of the serving tests, registered when this module
is imported: the server process imports it through
$UNDERSTUDY_CANDIDATE_MODULES (a path to this file), so the server's own
code is untouched.

    understudy_serve::silu_sigmoid   aten::silu as x * sigmoid(x): two ops of
                                     its own where production calls one kernel
                                     (close to production, not bit-identical:
                                     the guard's tolerance judges it)
"""
import torch

import understudy

SILU = "understudy_serve::silu_sigmoid"


def silu_sigmoid(self: torch.Tensor) -> torch.Tensor:
    """aten::silu(Tensor self) -> Tensor."""
    return self * torch.sigmoid(self)


understudy.register_candidate(SILU, silu_sigmoid, like="aten::silu")
