"""Kernel feature maps φ for linear attention as modules, so that exp(q·k) or a similarity is replaced by φ(q)·φ(k).

The functions are in :mod:`linvit.ops.linear_attention.feature_maps` (re-exported here). The modules share one call
signature (`FeatureMap`), `forward(x, is_query) -> features`, on token tensors (B, N, heads, d) -> (B, N, heads, m),
so that an attention module can hold any of them. The focused map's learnable temperature `scale` lives on
`FocusedLinearAttention` itself (it is a checkpoint key there), so the focused module here is the temperature-free map.
"""

import math

import torch
from torch import Tensor, nn

from linvit.ops.linear_attention.feature_maps import (
    elu_feature_map,
    favor_feature_map,
    focused_feature_map,
    focused_feature_parts,
    orthogonal_random_projection,
    relu_feature_map,
    taylor_feature_map,
)

__all__ = [
    "KERNEL_NAMES",
    "relu_feature_map",
    "elu_feature_map",
    "focused_feature_map",
    "focused_feature_parts",
    "taylor_feature_map",
    "favor_feature_map",
    "orthogonal_random_projection",
    "FeatureMap",
    "ReLUFeatureMap",
    "ELUFeatureMap",
    "FocusedFeatureMap",
    "TaylorFeatureMap",
    "FavorFeatureMap",
    "create_feature_map",
]

KERNEL_NAMES = ("focused", "relu", "elu", "favor", "taylor")


class FeatureMap(nn.Module):
    """A feature map φ as a module: `forward(x, is_query)` on (B, N, heads, d) tokens, and `random_features()`, the
    state an attention core needs besides the map's name (FAVOR+'s projection; None for the others)."""

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        raise NotImplementedError

    def random_features(self) -> Tensor | None:
        return None


class ReLUFeatureMap(FeatureMap):
    """φ(x) = relu(x) elementwise; (B, N, heads, d) -> same shape."""

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        return relu_feature_map(x)


class ELUFeatureMap(FeatureMap):
    """φ(x) = elu(x) + 1 elementwise; (B, N, heads, d) -> same shape."""

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        return elu_feature_map(x)


class FocusedFeatureMap(FeatureMap):
    """Temperature-free focused map on (B, N, heads, d): norms over all heads·d channels of a token.

    `FocusedLinearAttention` does not use this module (it holds the learnable `scale` and runs a fused path); it is
    here for users who want the focused kernel elsewhere.
    """

    def __init__(self, focusing_factor: float = 3.0, eps: float = 1e-6):
        super().__init__()
        self.focusing_factor = float(focusing_factor)
        self.eps = eps

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        flat = x.flatten(-2)
        return focused_feature_map(flat, None, self.focusing_factor, self.eps).view_as(x)


class TaylorFeatureMap(FeatureMap):
    """Second-order Taylor features of x·d**-0.25: φ(q)·φ(k) = 1 + s + s²/2 with s = q·k/√d.

    (B, N, heads, d) -> (B, N, heads, 1 + d + d²). Costly for large d (d = 32 gives 1057 features).
    """

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.input_scale = head_dim**-0.25

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        return taylor_feature_map(x * self.input_scale)


class FavorFeatureMap(FeatureMap):
    """FAVOR+ positive orthogonal random features approximating softmax attention exp(q·k/√d).

    Holds the (num_features, head_dim) projection as a buffer `projection` (saved in the state dict so a trained
    model keeps its features). Call `redraw_features()` to draw new ones (e.g. every few hundred steps during
    training, as Performer does); redrawing is never done implicitly in `forward`, so forward is deterministic and
    scriptable.

    Args:
        head_dim: d.
        num_features: m; default round(d · ln d) as in Performer (at least d).
        seed: seed of the initial draw (None = from the global generator).
    """

    def __init__(
        self,
        head_dim: int,
        num_features: int | None = None,
        seed: int | None = 0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if num_features is None:
            num_features = max(head_dim, int(round(head_dim * math.log(max(head_dim, 2)))))
        self.head_dim = head_dim
        self.num_features = num_features
        self.input_scale = head_dim**-0.25
        self.register_buffer("projection", torch.empty(num_features, head_dim, device=device, dtype=dtype))
        generator = None
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
        self.redraw_features(generator)

    @torch.jit.unused
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draw a new orthogonal random projection in place (a no-op on the meta device)."""
        if self.projection.device.type == "meta":
            return
        fresh = orthogonal_random_projection(self.num_features, self.head_dim, generator)
        with torch.no_grad():
            self.projection.copy_(fresh.to(self.projection.device, self.projection.dtype))

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        return favor_feature_map(x * self.input_scale, self.projection, is_query)

    def random_features(self) -> Tensor | None:
        """The (m, d) projection: the state an attention core needs besides the map's name."""
        return self.projection

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_features={self.num_features}"


def create_feature_map(
    kernel: str,
    head_dim: int,
    focusing_factor: float = 3.0,
    num_features: int | None = None,
    device=None,
    dtype=None,
) -> FeatureMap:
    """Feature-map module by name: one of `KERNEL_NAMES`."""
    if kernel == "focused":
        return FocusedFeatureMap(focusing_factor)
    if kernel == "relu":
        return ReLUFeatureMap()
    if kernel == "elu":
        return ELUFeatureMap()
    if kernel == "taylor":
        return TaylorFeatureMap(head_dim)
    if kernel == "favor":
        return FavorFeatureMap(head_dim, num_features, device=device, dtype=dtype)
    raise ValueError(f"Unknown kernel {kernel!r}; valid kernels are {', '.join(KERNEL_NAMES)}.")


def feature_dim(kernel: str, head_dim: int, num_features: int | None = None) -> int:
    """Width m of φ for one head."""
    if kernel == "taylor":
        return 1 + head_dim + head_dim * head_dim
    if kernel == "favor":
        if num_features is None:
            return max(head_dim, int(round(head_dim * math.log(max(head_dim, 2)))))
        return num_features
    return head_dim
