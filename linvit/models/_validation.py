"""The image-input check lives in :mod:`linvit.layers.image_input` (the backbone frame calls it); this name stays
for code that imported it from here."""

from linvit.layers.image_input import check_image_batch, min_size_pair

__all__ = ["check_image_batch", "min_size_pair"]
