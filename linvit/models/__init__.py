"""Backbone families, one file each; importing this package registers them with timm."""

import difflib

import timm

from linvit.models import (  # noqa: F401  (each import registers a family)
    flatten_cswin,
    flatten_deit,
    flatten_pvt,
    flatten_pvt_v2,
    flatten_swin,
    linvit,
)

__all__ = ["check_model_name"]


def check_model_name(model_name: str, what: str = "model") -> None:
    """Raise ValueError with the close matches when timm does not know ``model_name`` (before anything is built).

    Names with a source prefix (``hf-hub:``, ``local-dir:``) are left to timm. ``what`` names the setting the name
    came from in the message (e.g. ``model.model_name``).
    """
    if ":" in model_name or timm.is_model(model_name):
        return
    close = difflib.get_close_matches(model_name, timm.list_models(), n=5, cutoff=0.6)
    hint = f"Close matches: {', '.join(close)}." if close else "No close match."
    raise ValueError(
        f"Unknown model name {model_name!r} ({what}): it is not registered with timm. {hint} List the available ones "
        "with timm.list_models('linvit_*') (or 'flatten_*'), after `import linvit`."
    )
