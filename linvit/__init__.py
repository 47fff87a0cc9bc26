"""linvit: high-resolution linear-attention vision transformers, native to timm.

``import linvit`` registers every linvit model with timm, so ``timm.create_model("linvit_tiny")`` works.
"""

from linvit import attention, models  # noqa: F401  (registers the models with timm)

__version__ = "0.1.0"
