"""The FLatten authors' FLatten-PVT and FLatten-PVTv2 restated line by line (LeapLabTHU/FLatten-Transformer
models/flatten_pvt.py and models/flatten_pvt_v2.py): their key names, their math, their fixed square resolution.

Every option their code has for the focused stages: ``la_sr_ratios`` (keys and values from an s x s strided
convolution of the map, LayerNorm), PVTv2's ``linear`` (from the map average-pooled to 7x7, a 1x1 convolution,
LayerNorm and GELU; a ReLU in the MLP), and the DWC of the values stretched back to every token by a linear
interpolation along the flattened token sequence. Their PVT builds a final ``norm`` it never applies.

Their ``attn_type`` letters: ``L`` stages are the focused attention above, ``S`` stages PVT's softmax ``Attention``
(queries from every token, keys and values from the map reduced by ``sr_ratios[i]``, 8, 4, 2, 1 in every model they
register, or pooled to 7x7 with ``linear``; scale head_dim ** -0.5); ``la_sr_ratios`` applies to ``L`` stages only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AuthorsFocusedLinearAttention(nn.Module):
    def __init__(self, dim, num_patches, num_heads, sr_ratio=1, linear=False, focusing_factor=3, kernel_size=5):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=True)
        self.kv = nn.Linear(dim, dim * 2, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.linear = linear
        self.sr_ratio = sr_ratio
        if not linear:
            if sr_ratio > 1:
                self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
                self.norm = nn.LayerNorm(dim)
        else:
            self.pool = nn.AdaptiveAvgPool2d(7)
            self.sr = nn.Conv2d(dim, dim, kernel_size=1, stride=1)
            self.norm = nn.LayerNorm(dim)
            self.act = nn.GELU()
        self.focusing_factor = focusing_factor
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, groups=head_dim, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, num_patches // (sr_ratio * sr_ratio), dim))

    def forward(self, x, H, W):
        B, N, C = x.shape
        q = self.q(x)
        if not self.linear:
            if self.sr_ratio > 1:
                x_ = x.permute(0, 2, 1).reshape(B, C, H, W)
                x_ = self.sr(x_).reshape(B, C, -1).permute(0, 2, 1)
                x_ = self.norm(x_)
                kv = self.kv(x_).reshape(B, -1, 2, C).permute(2, 0, 1, 3)
            else:
                kv = self.kv(x).reshape(B, -1, 2, C).permute(2, 0, 1, 3)
        else:
            x_ = x.permute(0, 2, 1).reshape(B, C, H, W)
            x_ = self.sr(self.pool(x_)).reshape(B, C, -1).permute(0, 2, 1)
            x_ = self.norm(x_)
            x_ = self.act(x_)
            kv = self.kv(x_).reshape(B, -1, 2, C).permute(2, 0, 1, 3)
        k, v = kv[0], kv[1]
        n = k.shape[1]
        k = k + self.positional_encoding
        scale = nn.Softplus()(self.scale)
        q = nn.ReLU()(q) + 1e-6
        k = nn.ReLU()(k) + 1e-6
        q = q / scale
        k = k / scale
        q_norm = q.norm(dim=-1, keepdim=True)
        k_norm = k.norm(dim=-1, keepdim=True)
        q = q**self.focusing_factor
        k = k**self.focusing_factor
        q = (q / q.norm(dim=-1, keepdim=True)) * q_norm
        k = (k / k.norm(dim=-1, keepdim=True)) * k_norm
        q = q.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(B, n, self.num_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, n, self.num_heads, -1).permute(0, 2, 1, 3)
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (n**-0.5)) @ (v * (n**-0.5))
        x = q @ kv * z
        if self.sr_ratio > 1 or self.linear:
            v = v.transpose(-2, -1).reshape(B * self.num_heads, -1, n)
            v = F.interpolate(v, size=N, mode="linear").reshape(B, self.num_heads, -1, N).transpose(-2, -1)
        x = x.transpose(1, 2).reshape(B, N, C)
        v = v.reshape(B * self.num_heads, H, W, -1).permute(0, 3, 1, 2)
        x = x + self.dwc(v).reshape(B, C, N).permute(0, 2, 1)
        return self.proj(x)


class AuthorsSoftmaxAttention(nn.Module):
    """Their `Attention` (both files): PVT's spatial-reduction softmax attention."""

    def __init__(self, dim, num_heads, sr_ratio=1, linear=False):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=True)
        self.kv = nn.Linear(dim, dim * 2, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.linear = linear
        self.sr_ratio = sr_ratio
        if not linear:
            if sr_ratio > 1:
                self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
                self.norm = nn.LayerNorm(dim)
        else:
            self.pool = nn.AdaptiveAvgPool2d(7)
            self.sr = nn.Conv2d(dim, dim, kernel_size=1, stride=1)
            self.norm = nn.LayerNorm(dim)
            self.act = nn.GELU()

    def forward(self, x, H, W):
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        if not self.linear:
            if self.sr_ratio > 1:
                x_ = x.permute(0, 2, 1).reshape(B, C, H, W)
                x_ = self.norm(self.sr(x_).reshape(B, C, -1).permute(0, 2, 1))
                kv = self.kv(x_).reshape(B, -1, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
            else:
                kv = self.kv(x).reshape(B, -1, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        else:
            x_ = x.permute(0, 2, 1).reshape(B, C, H, W)
            x_ = self.act(self.norm(self.sr(self.pool(x_)).reshape(B, C, -1).permute(0, 2, 1)))
            kv = self.kv(x_).reshape(B, -1, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


def _sr_ratio(attn_type, la_sr_ratios, i, sr_ratios=(8, 4, 2, 1)):
    """Their block's ratio: sr_ratios[i] in an S stage, the la_sr_ratios digit in an L stage."""
    return sr_ratios[i] if attn_type[i] == "S" else int(la_sr_ratios[i])


# ------------------------------------------------------------------------------------------------------ PVT (v1)
class AuthorsMlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x, H=None, W=None):
        return self.fc2(self.act(self.fc1(x)))


class AuthorsBlock(nn.Module):
    def __init__(self, dim, num_patches, num_heads, mlp_ratio, sr_ratio=1, linear=False, mlp=AuthorsMlp, attn_type="L"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        if attn_type == "L":
            self.attn = AuthorsFocusedLinearAttention(dim, num_patches, num_heads, sr_ratio, linear)
        else:
            self.attn = AuthorsSoftmaxAttention(dim, num_heads, sr_ratio, linear)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = mlp(dim, int(dim * mlp_ratio)) if mlp is AuthorsMlp else mlp(dim, int(dim * mlp_ratio), linear)

    def forward(self, x, H, W):
        x = x + self.attn(self.norm1(x), H, W)
        return x + self.mlp(self.norm2(x), H, W)


class AuthorsPatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = patch_size
        self.H = self.W = img_size // patch_size
        self.num_patches = self.H * self.W
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        B, C, H, W = x.shape
        x = self.norm(self.proj(x).flatten(2).transpose(1, 2))
        return x, (H // self.patch_size, W // self.patch_size)


class AuthorsPvt(nn.Module):
    def __init__(
        self,
        img_size,
        embed_dims,
        depths,
        num_heads,
        mlp_ratios,
        num_classes=1000,
        la_sr_ratios="1111",
        attn_type="LLLL",
    ):
        super().__init__()
        for i in range(4):
            patch_embed = AuthorsPatchEmbed(
                img_size if i == 0 else img_size // (2 ** (i + 1)),
                4 if i == 0 else 2,
                3 if i == 0 else embed_dims[i - 1],
                embed_dims[i],
            )
            setattr(self, f"patch_embed{i + 1}", patch_embed)
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, patch_embed.num_patches, embed_dims[i])))
            blocks = [
                AuthorsBlock(
                    embed_dims[i],
                    patch_embed.num_patches,
                    num_heads[i],
                    mlp_ratios[i],
                    _sr_ratio(attn_type, la_sr_ratios, i),
                    attn_type=attn_type[i],
                )
                for _ in range(depths[i])
            ]
            setattr(self, f"block{i + 1}", nn.ModuleList(blocks))
        self.norm = nn.LayerNorm(embed_dims[3], eps=1e-6)  # never used in forward
        self.head = nn.Linear(embed_dims[3], num_classes)

    def _get_pos_embed(self, pos_embed, patch_embed, H, W):
        if self.patch_embed1.num_patches == H * W:
            return pos_embed
        grid = pos_embed.reshape(1, patch_embed.H, patch_embed.W, -1).permute(0, 3, 1, 2)
        return F.interpolate(grid, size=(H, W), mode="bilinear").reshape(1, -1, H * W).permute(0, 2, 1)

    def forward(self, x):
        B = x.shape[0]
        for i in range(4):
            patch_embed = getattr(self, f"patch_embed{i + 1}")
            x, (H, W) = patch_embed(x)
            x = x + self._get_pos_embed(getattr(self, f"pos_embed{i + 1}"), patch_embed, H, W)
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, H, W)
            if i != 3:
                x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        return self.head(x.mean(dim=1))


# ------------------------------------------------------------------------------------------------------ PVTv2
class AuthorsDWConv(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, bias=True, groups=dim)

    def forward(self, x, H, W):
        B, N, C = x.shape
        x = x.transpose(1, 2).view(B, C, H, W)
        return self.dwconv(x).flatten(2).transpose(1, 2)


class AuthorsMlpV2(nn.Module):
    def __init__(self, in_features, hidden_features, linear=False):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.dwconv = AuthorsDWConv(hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.linear = linear
        if self.linear:
            self.relu = nn.ReLU(inplace=True)

    def forward(self, x, H, W):
        x = self.fc1(x)
        if self.linear:
            x = self.relu(x)
        return self.fc2(self.act(self.dwconv(x, H, W)))


class AuthorsOverlapPatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, stride, in_chans, embed_dim):
        super().__init__()
        self.num_patches = (img_size // stride) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        x = self.proj(x)
        _, _, H, W = x.shape
        return self.norm(x.flatten(2).transpose(1, 2)), H, W


class AuthorsPvtV2(nn.Module):
    def __init__(
        self,
        img_size,
        embed_dims,
        depths,
        num_heads,
        mlp_ratios,
        num_classes=1000,
        la_sr_ratios="1111",
        linear=False,
        attn_type="LLLL",
    ):
        super().__init__()
        for i in range(4):
            patch_embed = AuthorsOverlapPatchEmbed(
                img_size if i == 0 else img_size // (2 ** (i + 1)),
                7 if i == 0 else 3,
                4 if i == 0 else 2,
                3 if i == 0 else embed_dims[i - 1],
                embed_dims[i],
            )
            block = nn.ModuleList(
                [
                    AuthorsBlock(
                        embed_dims[i],
                        patch_embed.num_patches,
                        num_heads[i],
                        mlp_ratios[i],
                        _sr_ratio(attn_type, la_sr_ratios, i),
                        linear,
                        AuthorsMlpV2,
                        attn_type[i],
                    )
                    for _ in range(depths[i])
                ]
            )
            setattr(self, f"patch_embed{i + 1}", patch_embed)
            setattr(self, f"block{i + 1}", block)
            setattr(self, f"norm{i + 1}", nn.LayerNorm(embed_dims[i], eps=1e-6))
        self.head = nn.Linear(embed_dims[3], num_classes)

    def forward(self, x):
        B = x.shape[0]
        for i in range(4):
            x, H, W = getattr(self, f"patch_embed{i + 1}")(x)
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, H, W)
            x = getattr(self, f"norm{i + 1}")(x)
            if i != 3:
                x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        return self.head(x.mean(dim=1))
