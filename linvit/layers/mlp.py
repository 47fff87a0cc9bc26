"""The blocks' MLP: timm's ``Mlp`` (same arguments, same state dict), with fc1 and its GELU fused for inference.

Without autograd, fc1 and the GELU run as one oneDNN GEMM on the CPU (`linvit.ops.onednn`: the bias and the
GELU applied as each tile is stored, where eager ``addmm`` writes the bias into a new output and GELU rereads it),
and fc2 with its bias inside the GEMM. Where that op is not ready (another device or dtype, oneDNN off), GELU runs
in place on fc1's output, a tensor that nothing else holds: one 4C-wide buffer fewer to allocate and first touch.
``linvit_tiny`` at 1024², eager, batch 1, on a 2-core Intel Xeon (2026-12-06, interleaved runs): in place 1,042 ->
981 ms, the same output to the bit; with every linear layer and the stem fused (`linvit.ops.onednn`), fp32 1,050 ->
972 ms and bf16 autocast 519 -> 458 ms.

With autograd on (training, or anything that asks for gradients), under ``torch.compile`` / ``torch.export``
(which make their own choices), in TorchScript, with another activation, and while a hook watches ``fc1``, ``fc2``
or the activation (which must see what timm's ``Mlp`` shows them, and the activation called), it is timm's ``Mlp``.
"""

from __future__ import annotations

import torch
from timm.layers import Mlp as TimmMlp
from torch import nn

from linvit.ops.onednn import linear_gelu, linear_layer, onednn_linear_ready, plain_linear, watched

__all__ = ["Mlp"]


class Mlp(TimmMlp):
    """timm's ``Mlp`` with fc1 + GELU fused, or the GELU in place, where nothing needs fc1's output (module
    docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # timm's Mlp.forward, written out (TorchScript has no super()), fc1 + activation and fc2 fused where they may
        x = self._fc1_activation(x)
        x = self.drop1(x)
        x = self.norm(x)
        if not torch.jit.is_scripting():  # TorchScript compiles only the other branch
            x = linear_layer(self.fc2, x)
        else:
            x = self.fc2(x)
        return self.drop2(x)

    def _fc1_activation(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
            if self._gelu_unwatched():
                if onednn_linear_ready(x, self.fc1.weight, self.fc1.bias):
                    return linear_gelu(x, self.fc1.weight, self.fc1.bias, self.act.approximate)
                return torch.ops.aten.gelu_(self.fc1(x), approximate=self.act.approximate)
        return self.act(self.fc1(x))

    @torch.jit.unused
    def _gelu_unwatched(self) -> bool:
        """fc1 then GELU, with nothing watching fc1's output: autograd off, no compiler, no hook on fc1 or the act."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or not isinstance(self.act, nn.GELU):
            return False
        return plain_linear(self.fc1) and not watched(self.act)
