"""A positional table at another grid: the one resize every table of positions goes through."""

import torch.nn.functional as F
from torch import Tensor

from linvit.ops._numerics import at_least_float32
from linvit.ops.windows import exporting

__all__ = ["resize_positional_table"]


def resize_positional_table(
    table: Tensor, table_size: tuple[int, int], size: tuple[int, int], mode: str = "bicubic"
) -> Tensor:
    """(1, th*tw, C) positional table for a (th, tw) grid -> (1, h*w, C) for an (h, w) grid.

    Interpolates in at least float32 with align_corners=False: bicubic (timm's convention and that of the FLatten
    checkpoints' resolution changes) or bilinear (PVT's absolute position embeddings). Returns the table itself when
    the sizes agree.
    """
    if exporting():  # sizes may be symbolic: always resample (bicubic and bilinear at the same size are exact)
        pass
    elif table_size[0] == size[0] and table_size[1] == size[1]:
        return table
    channels = table.shape[-1]
    image = at_least_float32(table.reshape(1, table_size[0], table_size[1], channels).permute(0, 3, 1, 2))
    image = F.interpolate(image, size=(size[0], size[1]), mode=mode, align_corners=False)
    return image.permute(0, 2, 3, 1).reshape(1, size[0] * size[1], channels).to(table.dtype)
