"""Building blocks shared by the model families."""

from linvit.layers.block import PreNormBlock, TransformerBlock
from linvit.layers.downsample import ConvDownsample
from linvit.layers.position import ConvPosEnc, map_to_tokens, tokens_to_map
from linvit.layers.stem import ConvStem

__all__ = [
    "ConvDownsample",
    "ConvPosEnc",
    "ConvStem",
    "PreNormBlock",
    "TransformerBlock",
    "map_to_tokens",
    "tokens_to_map",
]
