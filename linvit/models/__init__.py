"""Backbone families, one file each; importing this package registers them with timm."""
from linvit.models import linvit  # noqa: F401
