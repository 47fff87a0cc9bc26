"""Backbone families, one file each; importing this package registers them with timm."""

from linvit.models import (  # noqa: F401  (each import registers a family)
    flatten_cswin,
    flatten_deit,
    flatten_pvt,
    flatten_pvt_v2,
    flatten_swin,
    linvit,
)
