"""Functional operator cores with interchangeable backends: "naive" (reference), "torch" (eager), "triton" (fused).

One folder per operator, each with `naive.py`, `torch.py` and (where fused kernels pay) `triton.py` behind one
keyword-only signature (the layout of flash-linear-attention): `linear_attention` (focused, ReLU, ELU+1), `nystrom`
(Nyströmformer) and `linformer` (Linformer). Modules in :mod:`linvit.attention` hold the parameters and call these.
`focused_linear_attention` is the whole computation of a `FocusedLinearAttention` module (windows, qkv projection,
key positions, the core), and `windows` / `window_masks` the one window path of every windowed attention. Choose the
implementation per module (``backend=``) or for the whole process::

    import linvit.ops

    linvit.ops.set_backend("torch")          # or LINVIT_BACKEND=torch in the environment
    with linvit.ops.use_backend("naive"):    # for a block
        ...

"auto" (the default) runs the Triton kernels on CUDA tensors when Triton imports, eager PyTorch otherwise.
`nystrom` and `linformer` have no Triton kernel: "triton" runs their eager path, whose work is already in PyTorch's
fused attention kernels. (Importing an operator's submodule `torch` binds that name in the operator's package: the
packages' `__init__` files use only names imported from torch, never `torch.` itself.)
"""

from linvit.ops._backend import BACKENDS, get_backend, resolve_backend, set_backend, triton_available, use_backend
from linvit.ops.linear_attention import FEATURE_MAPS, linear_attention_qkv
from linvit.ops.linear_attention.attend import focused_linear_attention
from linvit.ops.linformer import linformer_attention_qkv
from linvit.ops.nystrom import nystrom_attention_qkv

__all__ = [
    "BACKENDS",
    "FEATURE_MAPS",
    "focused_linear_attention",
    "get_backend",
    "linear_attention_qkv",
    "linformer_attention_qkv",
    "nystrom_attention_qkv",
    "resolve_backend",
    "set_backend",
    "triton_available",
    "use_backend",
]
