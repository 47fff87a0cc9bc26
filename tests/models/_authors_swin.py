"""The FLatten authors' FLatten-Swin restated line by line (LeapLabTHU/FLatten-Transformer models/flatten_swin.py):
their key names, their math, their layout with patch merging at the END of a stage, their fixed square resolution.

Slow and obviously faithful: the reference the tests compare linvit's FlattenSwin with. As in their code, a block's
window and shift come from its stage's map at the build size: a map not larger than the window makes the window the
map and drops the shift (the relative position table shrinks with it), and every second block of a stage whose map
is larger shifts by half the window, linear blocks too (the mask reaches the linear attention, which ignores it).

Their ``attn_type``: a letter per stage, then a count for the mixed stages (``"LLMS4"``): an ``M`` stage's first
``count`` blocks are ``L`` (the linear window), the rest ``S`` (the softmax window); a block's shift follows its index
in the stage (half its own window at odd indices), whatever its kind.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _ref_window_partition(x, w):
    B, H, W, C = x.shape
    return x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, w, w, C)


def _ref_window_reverse(windows, w, H, W):
    B = windows.shape[0] // ((H // w) * (W // w))
    x = windows.view(B, H // w, W // w, w, w, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, H, W, -1)


class RefMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class RefWindowAttention(nn.Module):
    def __init__(self, dim, window, heads):
        super().__init__()
        self.window, self.heads = window, heads
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("relative_position_index", rel[..., 0] * (2 * window - 1) + rel[..., 1])
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (C // self.heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = (attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)).view(
                -1, self.heads, N, N
            )
        attn = attn.softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


class RefFocusedLinearAttention(nn.Module):
    def __init__(self, dim, window, heads, focusing_factor=3, kernel_size=5):
        super().__init__()
        self.heads, self.focusing_factor = heads, focusing_factor
        head_dim = dim // heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, groups=head_dim, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, window * window, dim))

    def forward(self, x, mask=None):  # the shift mask is ignored, as in the authors' code
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, C).permute(2, 0, 1, 3).unbind(0)
        k = k + self.positional_encoding
        q, k = F.relu(q) + 1e-6, F.relu(k) + 1e-6
        scale = F.softplus(self.scale)
        q, k = q / scale, k / scale
        q_norm, k_norm = q.norm(dim=-1, keepdim=True), k.norm(dim=-1, keepdim=True)
        q, k = q**self.focusing_factor, k**self.focusing_factor
        q = (q / q.norm(dim=-1, keepdim=True)) * q_norm
        k = (k / k.norm(dim=-1, keepdim=True)) * k_norm
        q, k, v = (t.reshape(B, N, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (N**-0.5)) @ (v * (N**-0.5))
        x = q @ kv * z
        H = W = int(N**0.5)
        x = x.transpose(1, 2).reshape(B, N, C)
        v = v.reshape(B * self.heads, H, W, -1).permute(0, 3, 1, 2)
        x = x + self.dwc(v).reshape(B, C, N).permute(0, 2, 1)
        return self.proj(x)


class RefBlock(nn.Module):
    def __init__(self, dim, res, heads, window, shift, attn_type):
        super().__init__()
        self.res, self.window, self.shift = res, window, shift
        if res <= window:
            self.shift, self.window = 0, res
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if attn_type == "L":
            self.attn = RefFocusedLinearAttention(dim, self.window, heads)
        else:
            self.attn = RefWindowAttention(dim, self.window, heads)
        self.mlp = RefMlp(dim, 4 * dim)
        attn_mask = None
        if self.shift > 0:
            img = torch.zeros(1, res, res, 1)
            w, s = self.window, self.shift
            cnt = 0
            for h in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                for ww in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                    img[:, h, ww, :] = cnt
                    cnt += 1
            mw = _ref_window_partition(img, w).view(-1, w * w)
            attn_mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H = W = self.res
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift > 0:
            x = torch.roll(x, (-self.shift, -self.shift), (1, 2))
        windows = _ref_window_partition(x, self.window).view(-1, self.window * self.window, C)
        windows = self.attn(windows, mask=self.attn_mask)
        x = _ref_window_reverse(windows.view(-1, self.window, self.window, C), self.window, H, W)
        if self.shift > 0:
            x = torch.roll(x, (self.shift, self.shift), (1, 2))
        x = shortcut + x.reshape(B, L, C)
        return x + self.mlp(self.norm2(x))


class RefPatchMerging(nn.Module):
    def __init__(self, res, dim):
        super().__init__()
        self.res = res
        self.reduction, self.norm = nn.Linear(4 * dim, 2 * dim, bias=False), nn.LayerNorm(4 * dim)

    def forward(self, x):
        B, L, C = x.shape
        x = x.view(B, self.res, self.res, C)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x.view(B, -1, 4 * C)))


class RefLayer(nn.Module):
    def __init__(self, dim, res, depth, heads, windows, attn_type, downsample):
        super().__init__()
        # their BasicLayer: "M<k>" makes blocks i < k linear and the rest softmax; windows = (linear, softmax)
        types = [attn_type if attn_type[0] != "M" else ("L" if i < int(attn_type[1:]) else "S") for i in range(depth)]
        sizes = [windows[0] if t == "L" else windows[1] for t in types]
        self.blocks = nn.ModuleList(
            [RefBlock(dim, res, heads, sizes[i], 0 if i % 2 == 0 else sizes[i] // 2, types[i]) for i in range(depth)]
        )
        self.downsample = RefPatchMerging(res, dim) if downsample else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class RefPatchEmbed(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj, self.norm = nn.Conv2d(3, dim, 4, 4), nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class RefFLattenSwin(nn.Module):
    def __init__(
        self, img_size, embed_dim, depths, num_heads, linear_window, window, num_classes, types="LLSS", ape=False
    ):
        super().__init__()
        self.patch_embed = RefPatchEmbed(embed_dim)
        res = img_size // 4
        self.ape = ape
        if ape:  # the authors' absolute position embedding, added to the patch tokens
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, res * res, embed_dim))
        self.layers = nn.ModuleList()
        stages = len(depths)
        for i, depth in enumerate(depths):
            self.layers.append(
                RefLayer(
                    embed_dim * 2**i,
                    res // 2**i,
                    depth,
                    num_heads[i],
                    (linear_window, window),
                    types[i] + (types[stages:] if types[i] == "M" else ""),
                    downsample=i < len(depths) - 1,
                )
            )
        self.norm = nn.LayerNorm(embed_dim * 2 ** (len(depths) - 1))
        self.head = nn.Linear(embed_dim * 2 ** (len(depths) - 1), num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        if self.ape:
            x = x + self.absolute_pos_embed
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(1))
