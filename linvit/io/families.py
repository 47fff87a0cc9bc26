"""Which registered timm models belong together: the module that registered a name (timm's "family"), through
timm's public registry functions. A checkpoint that does not fit one model is compared with the others of its family
(:mod:`linvit.io.pretrained`, ``linvit convert``)."""

from __future__ import annotations

__all__ = ["family_models", "model_family"]


def model_family(model_name: str) -> str | None:
    """The timm module that registered ``model_name`` (``linvit``, ``flatten_swin``, ``convnext``), else None."""
    import timm
    from timm.models import is_model_in_modules

    return next((module for module in timm.list_modules() if is_model_in_modules(model_name, [module])), None)


def family_models(model_name: str) -> list[str]:
    """Every model registered by the module that registered ``model_name``, sorted (empty for an unknown name)."""
    import timm

    family = model_family(model_name)
    return sorted(timm.list_models(module=family)) if family is not None else []
