"""Attention operators: tensors in, tensors out (functional cores and thin modules).

Every module has `forward(x, hw)` with tokens x (B, N, C), hw = (H, W), N == H * W, and returns (B, N, C); any H and
W work (non-square, odd, not a multiple of the window). `create_attention(name, dim, num_heads, **kwargs)` builds
any of them by a name from `ATTENTION_NAMES`; `ATTENTIONS` holds each name's traits (see `linvit.attention.registry`).
"""

from timm.layers import register_notrace_module

from linvit.attention import feature_maps, registry
from linvit.attention.feature_maps import *  # noqa: F403 (the feature maps' names are this package's)
from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.hybrid import GLOBAL_BRANCHES, HybridAttention
from linvit.attention.linear import linear_attention, linear_attention_tokens
from linvit.attention.linformer import LINFORMER_PROJECTIONS, LinformerAttention, resize_token_projection
from linvit.attention.nystrom import NystromAttention
from linvit.attention.positional import resize_positional_table, resize_relative_position_bias, square_grid
from linvit.attention.projected import ProjectedAttention
from linvit.attention.registry import *  # noqa: F403 (the registry's names are this package's: registry.__all__)
from linvit.attention.softmax import GlobalAttention
from linvit.attention.stripe import (
    FocusedLinearLePEAttention,
    LePEAttention,
    StripeAttention,
    StripeBranches,
    stripe_attention_reference,
    stripe_branches,
)
from linvit.attention.window import WindowAttention

# timm's FX feature extraction (features_only / create_feature_extractor) traces backbones whose (H, W) come from
# traced shapes; the attentions branch on those sizes (window clamping, padding), so timm keeps them as leaves.
# With concrete sizes they also trace through (torch.fx.symbolic_trace), see tests/attention.
for _module in (
    FocusedLinearAttention,
    WindowAttention,
    GlobalAttention,
    HybridAttention,
    LePEAttention,
    FocusedLinearLePEAttention,
    StripeAttention,
    NystromAttention,
    LinformerAttention,
):
    register_notrace_module(_module)
del _module

__all__ = [
    *registry.__all__,
    *feature_maps.__all__,
    "GLOBAL_BRANCHES",
    "LINFORMER_PROJECTIONS",
    "linear_attention",
    "linear_attention_tokens",
    "FocusedLinearAttention",
    "FocusedLinearLePEAttention",
    "ProjectedAttention",
    "LePEAttention",
    "StripeAttention",
    "StripeBranches",
    "WindowAttention",
    "GlobalAttention",
    "HybridAttention",
    "NystromAttention",
    "LinformerAttention",
    "resize_positional_table",
    "resize_relative_position_bias",
    "resize_token_projection",
    "square_grid",
    "stripe_attention_reference",
    "stripe_branches",
]
