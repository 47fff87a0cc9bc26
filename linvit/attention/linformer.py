"""LinformerAttention: Linformer (Wang et al., 2020) on image tokens, in two forms.

Keys and values are projected along the token axis to k ≪ N tokens, then every query attends to those with softmax,
with x (B, N, C):
    q, k, v = qkv(x)
    k', v' = E k, F v            (E, F: (k, N), shared by the heads)
    o = softmax(q k'ᵀ/√d) v'
    out = proj(o)

- ``projection="learned"``: the paper's E and F, learned for one token grid (``pos_size``, the stage's grid at the
  training resolution). On another grid each row of E and F, a map over the training grid, is resized to the new
  grid like a positional table (bicubic, :func:`linvit.attention.resize_positional_table`) and scaled by N₀/N, so
  that a row that averages a region still averages it (the sums run over N/N₀ times as many tokens); see
  :func:`resize_token_projection`. `set_pos_size` makes a new grid the stored one.
- ``projection="pool"`` (default): resolution-free, no parameter: k' and v' are the means of k and v over a (kh, kw)
  grid of cells on the map (adaptive-pooling cells, so any H×W), the grid clamped to the map.

The computation lives in `linvit.ops.linformer_attention_qkv` ("torch" eager, "naive" reference).
"""

import torch
import torch.fx
from torch import Tensor, nn

from linvit.attention._checks import to_pair
from linvit.attention.positional import resize_positional_table
from linvit.attention.projected import ProjectedAttention
from linvit.ops import linformer_attention_qkv
from linvit.ops._cells import cell_grid
from linvit.ops.linformer import torch as eager
from linvit.ops.windows import check_token_grid

__all__ = ["LINFORMER_PROJECTIONS", "LinformerAttention", "resize_token_projection"]

LINFORMER_PROJECTIONS = ("pool", "learned")

# FX records these as single calls: a size check, the op (its backend choice needs a concrete device).
torch.fx.wrap("check_token_grid")
torch.fx.wrap("linformer_attention_qkv")


@torch.fx.wrap  # a branch on the sizes: FX records one call
def resize_token_projection(projection: Tensor, size: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """A (k, N₀) projection along the tokens of a ``size`` grid -> (k, N) for ``grid``: every row resized as a map
    (bicubic, as positional tables are) and scaled by N₀ / N. Returns the projection itself when the grids agree."""
    if size[0] == grid[0] and size[1] == grid[1]:
        return projection
    rows = resize_positional_table(projection.t().unsqueeze(0), size, grid)[0].t()  # each row as a channel
    return rows * (size[0] * size[1] / (grid[0] * grid[1]))


class LinformerAttention(ProjectedAttention):
    """Linformer attention over all tokens of an (H, W) map: learned token projections or pooling to k cells.

    State dict: `qkv.*`, `proj.*`, and with ``projection="learned"`` `key_projection` and `value_projection`
    (k, pos_h·pos_w), the paper's E and F.

    Args:
        dim, num_heads, qkv_bias, proj_drop, with_projections: see `ProjectedAttention`.
        attn_drop: dropout on the attention probabilities (training only).
        projection: "pool" (resolution-free: means over a grid of cells) or "learned" (the paper's E, F for the
            ``pos_size`` grid, resized for others).
        projected_size: k, the number of projected tokens, as a (kh, kw) grid or s for s×s (default 16×16 = 256,
            the paper's k). "pool" averages over that grid of cells (clamped to the map); "learned" learns k = kh·kw
            rows.
        pos_size: (h, w) token grid the learned projections are for (the stage's grid at the training resolution);
            required for "learned", unused by "pool".
        backend: "auto", "torch", "triton" (both run the eager path: there is no fused kernel of its own) or
            "naive" (the slow reference).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        projection: str = "pool",
        projected_size=16,
        pos_size=None,
        with_projections: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__(dim, num_heads, qkv_bias, proj_drop, with_projections, backend, device, dtype)
        dd = {"device": device, "dtype": dtype}
        if projection not in LINFORMER_PROJECTIONS:
            raise ValueError(
                f"Unknown projection {projection!r}; valid ones are {', '.join(LINFORMER_PROJECTIONS)} (pooling to a "
                "grid of cells, any resolution; or the paper's learned projections for one token grid)."
            )
        self.projection = projection
        self.projected_size = cell_grid(projected_size, "projected_size")
        self.attn_drop = attn_drop
        self.pos_size: tuple[int, int] | None = None
        if projection == "learned":
            if pos_size is None:
                raise ValueError(
                    "projection='learned' needs pos_size=(h, w), the token grid its (k, h·w) projections are learned "
                    "for (the stage's grid at the training resolution, e.g. (56, 56)); or use projection='pool', "
                    "which has no size."
                )
            self.pos_size = to_pair(pos_size, "pos_size")
            shape = (self.projected_size[0] * self.projected_size[1], self.pos_size[0] * self.pos_size[1])
            self.key_projection = nn.Parameter(torch.empty(shape, **dd))
            self.value_projection = nn.Parameter(torch.empty(shape, **dd))
            if self.key_projection.device.type != "meta":
                # the authors' initialisation: Xavier-uniform with gain 1/√2, variance 1 / (k + N₀)
                nn.init.xavier_uniform_(self.key_projection, gain=2**-0.5)
                nn.init.xavier_uniform_(self.value_projection, gain=2**-0.5)
        else:
            self.register_parameter("key_projection", None)
            self.register_parameter("value_projection", None)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W (or (B, N, 3C) without projections); returns (B, N, C)."""
        x = check_token_grid(x, hw)
        qkv = self.project_in(x)
        key_projection: Tensor | None = None
        value_projection: Tensor | None = None
        pool_grid: tuple[int, int] | None = self.projected_size
        if self.key_projection is not None and self.value_projection is not None and self.pos_size is not None:
            key_projection = resize_token_projection(self.key_projection, self.pos_size, hw)
            value_projection = resize_token_projection(self.value_projection, self.pos_size, hw)
            pool_grid = None
        dropout = self.attn_drop if self.training else 0.0
        if torch.jit.is_scripting():
            out = eager.scriptable_linformer_attention_qkv(
                qkv, hw, self.num_heads, key_projection, value_projection, pool_grid, dropout, None
            )
        else:
            out = self._linformer(qkv, hw, key_projection, value_projection, pool_grid, dropout)
        return self.project_out(out)

    @torch.jit.unused
    def _linformer(
        self,
        qkv: Tensor,
        hw: tuple[int, int],
        key_projection: Tensor | None,
        value_projection: Tensor | None,
        pool_grid: tuple[int, int] | None,
        dropout: float,
    ) -> Tensor:
        """The attention core through the ops layer, on this module's backend."""
        return linformer_attention_qkv(
            qkv, hw=hw, num_heads=self.num_heads, key_projection=key_projection, value_projection=value_projection,
            pool_grid=pool_grid, dropout_p=dropout, backend=self.backend,
        )  # fmt: skip

    @torch.jit.unused
    def set_pos_size(self, pos_size) -> None:
        """Resize the learned projections to an (h, w) grid in place (`resize_token_projection`), `requires_grad`
        kept, like `FocusedLinearAttention.set_pos_size`; the pooled form has nothing to resize."""
        new_size = to_pair(pos_size, "pos_size")
        if self.pos_size is None or self.key_projection is None or self.value_projection is None:
            return
        if new_size == self.pos_size:
            return
        for name in ("key_projection", "value_projection"):
            old = getattr(self, name)
            with torch.no_grad():
                resized = resize_token_projection(old.detach(), self.pos_size, new_size)
            setattr(self, name, nn.Parameter(resized, requires_grad=old.requires_grad))
        self.pos_size = new_size

    def extra_repr(self) -> str:
        size = f", pos_size={self.pos_size}" if self.pos_size is not None else ""
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, projection={self.projection}, "
            f"projected_size={self.projected_size}{size}"
        )
