"""Building blocks shared by the model families: the staged-backbone frame, token stages, heads, blocks, MLPs, stems."""

from linvit.layers.arguments import check_creation_arguments, take_feature_indices
from linvit.layers.backbone import Backbone, StagedBackbone, init_linear_weights, no_weight_decay_names
from linvit.layers.block import PreNormBlock, TransformerBlock
from linvit.layers.downsample import ConvDownsample
from linvit.layers.heads import ClassifierHeadMixin, LinearHeadMixin
from linvit.layers.image_input import check_image_batch, min_size_pair
from linvit.layers.mlp import Mlp
from linvit.layers.position import ConvPosEnc, map_to_tokens, tokens_to_map
from linvit.layers.stage import (
    TokenStage,
    conv_grids,
    drop_path_rates,
    family_attention_options,
    stage_attention_kwargs,
)
from linvit.layers.stem import ConvStem

__all__ = [
    "Backbone",
    "ClassifierHeadMixin",
    "ConvDownsample",
    "ConvPosEnc",
    "ConvStem",
    "LinearHeadMixin",
    "Mlp",
    "PreNormBlock",
    "StagedBackbone",
    "TokenStage",
    "TransformerBlock",
    "check_creation_arguments",
    "check_image_batch",
    "conv_grids",
    "drop_path_rates",
    "family_attention_options",
    "init_linear_weights",
    "map_to_tokens",
    "min_size_pair",
    "no_weight_decay_names",
    "stage_attention_kwargs",
    "take_feature_indices",
    "tokens_to_map",
]
