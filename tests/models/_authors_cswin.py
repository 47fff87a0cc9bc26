"""The FLatten authors' FLatten-CSwin restated line by line (LeapLabTHU/FLatten-Transformer models/flatten_cswin.py,
after CSWin): their key names and their math, square inputs at the build size only, as theirs.

Stripe linear attention (``la_split_size`` narrower than a stage's map, e.g. 56-28-14-7 at 448): their current code
takes B and L from the whole map before cutting the stripes, so with more than one stripe per branch its DWC gets
the wrong channel count and it stops (verified: "expected input ... to have 8 channels, but got 16"); their first
release attended per stripe with sums instead of means (equal up to the 1e-6 in the normaliser). Restated here: the
current code's steps with each stripe as its batch entry (B and L taken after the stripes are cut), identical to
theirs where a branch has one stripe.
"""

from __future__ import annotations

import torch
from torch import nn


def img2windows(img, H_sp, W_sp):
    B, C, H, W = img.shape
    img_reshape = img.view(B, C, H // H_sp, H_sp, W // W_sp, W_sp)
    return img_reshape.permute(0, 2, 4, 3, 5, 1).contiguous().reshape(-1, H_sp * W_sp, C)


def windows2img(img_splits_hw, H_sp, W_sp, H, W):
    B = int(img_splits_hw.shape[0] / (H * W / H_sp / W_sp))
    img = img_splits_hw.view(B, H // H_sp, W // W_sp, H_sp, W_sp, -1)
    return img.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


def _stripe(resolution, idx, split_size):
    if idx == -1:
        return resolution, resolution
    if idx == 0:
        return resolution, split_size
    return split_size, resolution


class AuthorsLePEAttention(nn.Module):
    def __init__(self, dim, resolution, idx, split_size, num_heads):
        super().__init__()
        self.resolution = resolution
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.H_sp, self.W_sp = _stripe(resolution, idx, split_size)
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    def im2cswin(self, x):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        x = img2windows(x, self.H_sp, self.W_sp)
        return x.reshape(-1, self.H_sp * self.W_sp, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)

    def get_lepe(self, x, func):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        x = x.view(B, C, H // self.H_sp, self.H_sp, W // self.W_sp, self.W_sp)
        x = x.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(-1, C, self.H_sp, self.W_sp)
        lepe = func(x)
        lepe = lepe.reshape(-1, self.num_heads, C // self.num_heads, self.H_sp * self.W_sp).permute(0, 1, 3, 2)
        x = x.reshape(-1, self.num_heads, C // self.num_heads, self.H_sp * self.W_sp).permute(0, 1, 3, 2)
        return x, lepe

    def forward(self, qkv):
        q, k, v = qkv[0], qkv[1], qkv[2]
        H = W = self.resolution
        B, L, C = q.shape
        q = self.im2cswin(q)
        k = self.im2cswin(k)
        v, lepe = self.get_lepe(v, self.get_v)
        q = q * self.scale
        attn = nn.functional.softmax(q @ k.transpose(-2, -1), dim=-1, dtype=q.dtype)
        x = (attn @ v) + lepe
        x = x.transpose(1, 2).reshape(-1, self.H_sp * self.W_sp, C)
        return windows2img(x, self.H_sp, self.W_sp, H, W).view(B, -1, C)


class AuthorsFocusedLinearAttention(nn.Module):
    def __init__(self, dim, resolution, idx, split_size, num_heads, focusing_factor=3, kernel_size=5):
        super().__init__()
        self.resolution = resolution
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.H_sp, self.W_sp = _stripe(resolution, idx, split_size)
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)
        self.focusing_factor = focusing_factor
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, groups=head_dim, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.H_sp * self.W_sp, dim))

    def im2cswin(self, x):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        return img2windows(x, self.H_sp, self.W_sp)

    def get_lepe(self, x, func):
        B, N, C = x.shape
        H = W = int(N**0.5)
        x = x.transpose(-2, -1).contiguous().view(B, C, H, W)
        x = x.view(B, C, H // self.H_sp, self.H_sp, W // self.W_sp, self.W_sp)
        x = x.permute(0, 2, 4, 1, 3, 5).contiguous().reshape(-1, C, self.H_sp, self.W_sp)
        lepe = func(x)
        lepe = lepe.reshape(-1, C, self.H_sp * self.W_sp).permute(0, 2, 1).contiguous()
        x = x.reshape(-1, C, self.H_sp * self.W_sp).permute(0, 2, 1).contiguous()
        return x, lepe

    def forward(self, qkv):
        q, k, v = qkv[0], qkv[1], qkv[2]
        H = W = self.resolution
        batch = q.shape[0]
        q = self.im2cswin(q)
        k = self.im2cswin(k)
        v, lepe = self.get_lepe(v, self.get_v)
        B, L, C = q.shape  # per stripe (theirs: before the cut, which is the same with one stripe)
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
        q = q.reshape(B, L, self.num_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(B, L, self.num_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, L, self.num_heads, -1).permute(0, 2, 1, 3)
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (k.transpose(-2, -1) * (L**-0.5)) @ (v * (L**-0.5))
        x = q @ kv * z
        x = x.transpose(1, 2).reshape(B, L, C)
        v = v.reshape(B * self.num_heads, self.H_sp, self.W_sp, -1).permute(0, 3, 1, 2)
        x = x + self.dwc(v).reshape(B, C, L).permute(0, 2, 1) + lepe
        return windows2img(x, self.H_sp, self.W_sp, H, W).view(batch, -1, C)


class AuthorsCSWinBlock(nn.Module):
    def __init__(self, dim, reso, num_heads, split_size, attn_type, last_stage=False):
        super().__init__()
        self.patches_resolution = reso
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.norm1 = nn.LayerNorm(dim)
        if self.patches_resolution == split_size:
            last_stage = True
        self.branch_num = 1 if last_stage else 2
        self.proj = nn.Linear(dim, dim)
        cls = AuthorsFocusedLinearAttention if attn_type == "L" else AuthorsLePEAttention
        if last_stage:
            self.attns = nn.ModuleList([cls(dim, reso, -1, split_size, num_heads)])
        else:
            self.attns = nn.ModuleList([cls(dim // 2, reso, i, split_size, num_heads // 2) for i in range(2)])
        self.mlp = nn.Sequential()
        self.mlp.fc1 = nn.Linear(dim, dim * 4)
        self.mlp.act = nn.GELU()
        self.mlp.fc2 = nn.Linear(dim * 4, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x):
        B, L, C = x.shape
        img = self.norm1(x)
        qkv = self.qkv(img).reshape(B, -1, 3, C).permute(2, 0, 1, 3)
        if self.branch_num == 2:
            x1 = self.attns[0](qkv[:, :, :, : C // 2])
            x2 = self.attns[1](qkv[:, :, :, C // 2 :])
            attened_x = torch.cat([x1, x2], dim=2)
        else:
            attened_x = self.attns[0](qkv)
        x = x + self.proj(attened_x)
        return x + self.mlp(self.norm2(x))


class AuthorsMergeBlock(nn.Module):
    def __init__(self, dim, dim_out):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, 2, 1)
        self.norm = nn.LayerNorm(dim_out)

    def forward(self, x):
        B, new_HW, C = x.shape
        H = W = int(new_HW**0.5)
        x = self.conv(x.transpose(-2, -1).contiguous().view(B, C, H, W))
        B, C = x.shape[:2]
        return self.norm(x.view(B, C, -1).transpose(-2, -1).contiguous())


class Flatten2Tokens(nn.Module):  # their einops Rearrange('b c h w -> b (h w) c')
    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


class AuthorsCSWin(nn.Module):
    def __init__(
        self, img_size, embed_dim, depths, num_heads, split_size, attn_type="LLSS", num_classes=1000, la_split_size=None
    ):
        super().__init__()
        if la_split_size is None:  # the maps: their "56-28-14-7" at 224
            la_split_size = [img_size // 4, img_size // 8, img_size // 16, img_size // 32]
        self.stage1_conv_embed = nn.Sequential(
            nn.Conv2d(3, embed_dim, 7, 4, 2), Flatten2Tokens(), nn.LayerNorm(embed_dim)
        )
        dim = embed_dim
        for s in range(4):
            if s > 0:
                setattr(self, f"merge{s}", AuthorsMergeBlock(dim, dim * 2))
                dim *= 2
            split = la_split_size[s] if attn_type[s] == "L" else split_size[s]
            blocks = [
                AuthorsCSWinBlock(dim, img_size // 2 ** (s + 2), num_heads[s], split, attn_type[s], last_stage=s == 3)
                for _ in range(depths[s])
            ]
            setattr(self, f"stage{s + 1}", nn.ModuleList(blocks))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stage1_conv_embed(x)
        for blk in self.stage1:
            x = blk(x)
        for pre, blocks in zip([self.merge1, self.merge2, self.merge3], [self.stage2, self.stage3, self.stage4]):
            x = pre(x)
            for blk in blocks:
                x = blk(x)
        return self.head(torch.mean(self.norm(x), dim=1))
