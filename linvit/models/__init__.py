"""Backbone families, one file each; importing this package registers them with timm."""
from linvit.models import linvit  # noqa: F401
from linvit.models import flatten_cswin, flatten_pvt, flatten_pvt_v2  # noqa: F401
from linvit.models import flatten_swin  # noqa: F401
from linvit.models import flatten_deit  # noqa: F401
