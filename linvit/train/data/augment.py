"""timm's training transforms, made safe under Pillow 13 and made to name themselves when they fail.

- Posterize with 0 bits: timm's RandAugment/AutoAugment/AugMix reach it (``rand-m9-mstd0.5-inc1`` draws magnitudes up
  to 10, and ``PosterizeIncreasing`` keeps ``4 - int(0.4 * m)`` bits). Pillow up to 12 returned a black image for
  0 bits; Pillow 13 raises ``ValueError: bits must be between or equal to 1 and 8`` (about 4 in 2000 images, inside a
  data-loader worker). :func:`guard_transform` gives every posterize op of a pipeline the old result, so the
  published recipes keep their meaning on every Pillow.
- An error inside a step of the pipeline is raised as :class:`AugmentationError` naming the step (and, inside
  RandAugment and its relatives, the op and its arguments); the dataset adds the file.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AugmentationError", "NamedSteps", "guard_transform", "posterize_any_bits"]

_POSTERIZE_OPS = ("Posterize", "PosterizeIncreasing", "PosterizeOriginal")


class AugmentationError(RuntimeError):
    """A data transform failed; the message names the transform (and the image file, when the dataset knows it)."""


def posterize_any_bits(img: Any, bits_to_keep: int, **_: Any) -> Any:
    """timm's posterize that also takes 0 bits: all bits dropped, a black image (what Pillow <= 12 returned)."""
    from PIL import Image, ImageOps

    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)  # zeros in every band, as Pillow 12's lut of `value & ~255`
    return ImageOps.posterize(img, bits_to_keep)


class _NamedOp:
    """One auto-augment op's function; a failure becomes an :class:`AugmentationError` naming the op and arguments."""

    def __init__(self, name: str, function: Any):
        self.name, self.function = name, function

    def __call__(self, img: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.function(img, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any failure of the op: name it, keep the cause
            arguments = ", ".join(repr(a) for a in args)
            raise AugmentationError(
                f"op {self.name}({arguments}) on a {_describe(img)}: {type(error).__name__}: {error}"
            ) from error


class NamedSteps:
    """A ``Compose``-like pipeline whose failing step is named in the error (a class, so it pickles for workers)."""

    def __init__(self, steps: list[Any]):
        self.steps = list(steps)

    def __call__(self, img: Any) -> Any:
        for number, step in enumerate(self.steps, start=1):
            try:
                img = step(img)
            except Exception as error:  # noqa: BLE001 - any failure of a step: name it, keep the cause
                detail = str(error) if isinstance(error, AugmentationError) else f"{type(error).__name__}: {error}"
                raise AugmentationError(
                    f"transform step {number} of {len(self.steps)} ({type(step).__name__}) failed on a "
                    f"{_describe(img)}: {detail}"
                ) from error
        return img

    def __repr__(self) -> str:
        inner = "".join(f"\n    {step!r}" for step in self.steps)
        return f"{type(self).__name__}({inner}\n)"


def guard_transform(transform: Any) -> NamedSteps:
    """``transform`` (a torchvision ``Compose`` or one callable) with safe posterize ops and named failures."""
    steps = list(getattr(transform, "transforms", [transform]))
    for step in steps:
        for op in _augment_ops(step):
            if isinstance(op.aug_fn, _NamedOp):  # guarded already
                continue
            function = posterize_any_bits if op.name in _POSTERIZE_OPS else op.aug_fn
            op.aug_fn = _NamedOp(op.name, function)
    return NamedSteps(steps)


def _augment_ops(step: Any) -> list[Any]:
    """timm's ``AugmentOp`` objects inside RandAugment (``ops``), AugMix (``ops``) or AutoAugment (``policy``)."""
    candidates = list(getattr(step, "ops", None) or [])
    for sub_policy in getattr(step, "policy", None) or []:
        candidates.extend(sub_policy if isinstance(sub_policy, (list, tuple)) else [sub_policy])
    return [op for op in candidates if hasattr(op, "aug_fn") and hasattr(op, "name")]


def _describe(img: Any) -> str:
    mode, size = getattr(img, "mode", None), getattr(img, "size", None)
    if mode is not None and isinstance(size, tuple):
        return f"{mode} {size[0]}x{size[1]} image"
    shape = getattr(img, "shape", None)
    return f"tensor of shape {tuple(shape)}" if shape is not None else type(img).__name__
