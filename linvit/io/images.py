"""Opening an image file that nobody vouched for: one policy for training, ``linvit check-data`` and ``linvit predict``.

Before a single pixel is decoded, :func:`open_image`

- looks at the path with ``stat`` and opens only a regular file (a FIFO, socket, device or folder named ``x.jpg`` is
  never opened, so nothing hangs), with ``O_NONBLOCK`` and the type checked again on the open handle;
- names a link that never reaches a file (two links pointing at each other: ``ELOOP``), a missing file, an empty one;
- reads the header only (PIL's ``Image.open``) and refuses a size of 0, more than :attr:`ImageLimits.max_pixels`
  pixels (default PIL's own 89.5 M, about 0.25 GiB as 8-bit RGB) or a long side more than
  :attr:`ImageLimits.max_aspect` times the short side (default 100: a 1 x 1,000,000 PNG of 2 KB would be resized to
  224 x 224,000,000 pixels).

:func:`decode_image` then decodes it and refuses float pixels (PIL mode ``F``, e.g. a float TIFF) that are NaN, infinite
or beyond +-:data:`MAX_FLOAT_PIXEL` (fill values such as 1e30 or -3.4e38 "no data", not intensities). Every refusal
and every error of a decoder is one :class:`ImageInputError` line naming the file (and the option that raises a
limit); what a caller does with it is its own policy (training skips and counts, check-data lists, predict stops).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import numbers
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from linvit.io.errors import OneLineError

__all__ = [
    "DEFAULT_MAX_ASPECT",
    "DEFAULT_MAX_PIXELS",
    "MAX_FLOAT_PIXEL",
    "ImageInputError",
    "ImageLimits",
    "as_mode",
    "decode_image",
    "image_sha256",
    "load_image",
    "open_image",
]

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's Image.MAX_IMAGE_PIXELS: 2**28 bytes of 24-bit pixels
DEFAULT_MAX_ASPECT = 100.0
MAX_FLOAT_PIXEL = 65535.0  # the widest integer range (16 bits) a float image's intensities plausibly come from
_CHUNK = 1 << 20


class ImageInputError(OneLineError):
    """An image file that is refused (not a regular file, too large, non-finite pixels) or cannot be decoded."""


def _positive(value: object, name: str) -> float:
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (real and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class ImageLimits:
    """The largest image that is decoded: ``max_pixels`` (width x height) and ``max_aspect`` (long side / short).

    ``pixels_option`` / ``aspect_option`` are how the user raises them where the image is read (``--max-pixels``,
    ``data.max_pixels``): the refusal names them.
    """

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_aspect: float = DEFAULT_MAX_ASPECT
    pixels_option: str = "--max-pixels"
    aspect_option: str = "--max-aspect"

    def __post_init__(self) -> None:
        pixels = _positive(self.max_pixels, self.pixels_option)
        if not float(pixels).is_integer():
            raise ValueError(f"{self.pixels_option} must be a whole number of pixels, got {self.max_pixels!r}")
        object.__setattr__(self, "max_pixels", int(pixels))
        if _positive(self.max_aspect, self.aspect_option) < 1:
            raise ValueError(f"{self.aspect_option} is long side / short side: at least 1, got {self.max_aspect!r}")
        object.__setattr__(self, "max_aspect", float(self.max_aspect))

    def check_size(self, path: str | os.PathLike, size: tuple[int, int]) -> None:
        """:class:`ImageInputError` unless ``size`` (width, height) is within the limits and not empty."""
        width, height = size
        if width <= 0 or height <= 0:
            raise ImageInputError(f"image '{path}' is {width} x {height} pixels: it holds no pixels")
        if width * height > self.max_pixels:
            raise ImageInputError(
                f"image '{path}' is {width} x {height} = {width * height:,} pixels, over the limit of "
                f"{self.max_pixels:,}: not decoded (raise it with {self.pixels_option} if you trust the file)"
            )
        aspect = max(width, height) / min(width, height)
        if aspect > self.max_aspect:
            raise ImageInputError(
                f"image '{path}' is {width} x {height} pixels, a side {aspect:,.0f} times the other (the limit is "
                f"{self.max_aspect:g}): not decoded (raise it with {self.aspect_option} if you trust the file)"
            )


def _open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading if it is a regular file that is not empty; :class:`ImageInputError` otherwise."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise ImageInputError(_stat_failure(path, error)) from None
    if not stat.S_ISREG(info.st_mode):
        raise ImageInputError(f"image '{path}' is {_kind(info.st_mode)}, not a regular file: not opened")
    if info.st_size == 0:
        raise ImageInputError(f"image '{path}' is empty (0 bytes)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise ImageInputError(_stat_failure(path, error)) from None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced by something else between the two looks
        handle.close()
        raise ImageInputError(f"image '{path}' is not a regular file: not opened")
    return handle


def _stat_failure(path: str | os.PathLike, error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return f"image '{path}' is a symlink loop (links that point at each other never reach a file): remove the link"
    if error.errno == errno.ENOENT:
        broken = os.path.islink(path)
        return f"image '{path}' does not exist" + (" (a broken symlink)" if broken else "")
    return f"cannot open image '{path}': {error.strerror or error}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def _raise_pil_bound(limits: ImageLimits) -> None:
    """PIL refuses more than twice its MAX_IMAGE_PIXELS on its own: a user's higher limit raises PIL's with it."""
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is not None and limits.max_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = limits.max_pixels


@contextlib.contextmanager
def open_image(path: str | os.PathLike, limits: ImageLimits | None = None) -> Iterator[Any]:
    """The PIL image at ``path`` with its header read and checked against ``limits``, not yet decoded.

    Decode it inside the ``with`` block (the file closes after it); :class:`ImageInputError` names what is wrong.
    """
    from PIL import Image

    limits = limits or ImageLimits()
    _raise_pil_bound(limits)
    with _open_regular(path) as handle:
        try:
            image = Image.open(handle)
        except Image.DecompressionBombError as error:  # over twice PIL's own bound: still this policy's refusal
            raise ImageInputError(
                f"image '{path}' is too large to decode ({error}): raise the limit with {limits.pixels_option} "
                "if you trust the file"
            ) from None
        except Exception as error:  # noqa: BLE001 - any header a plugin cannot read is this file's problem
            raise ImageInputError(f"cannot read image '{path}': {_reason(error)}") from None
        with image:
            limits.check_size(path, image.size)
            yield image


def _reason(error: BaseException) -> str:
    from PIL import UnidentifiedImageError

    if isinstance(error, UnidentifiedImageError):  # its message names the open handle, not the file
        return "not an image Pillow can identify (UnidentifiedImageError)"
    line = str(error).strip().split("\n")[0]
    line = line if len(line) <= 200 else line[:200] + "..."
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def check_float_pixels(image: Any, path: str | os.PathLike) -> None:
    """:class:`ImageInputError` when a decoded float image (mode ``F``) holds NaN, Inf or values beyond
    +-:data:`MAX_FLOAT_PIXEL`; other modes hold integers and pass."""
    if image.mode != "F":
        return
    import numpy as np

    pixels = np.asarray(image)
    finite = np.isfinite(pixels)
    if not finite.all():
        count = int(pixels.size - finite.sum())
        raise ImageInputError(f"image '{path}' holds {count:,} NaN/Inf float pixel(s): not used")
    largest = float(np.abs(pixels).max()) if pixels.size else 0.0
    if largest > MAX_FLOAT_PIXEL:
        raise ImageInputError(
            f"image '{path}' holds float pixels as large as {largest:.3g} (beyond +-{MAX_FLOAT_PIXEL:g}, a fill value "
            "rather than an intensity): not used"
        )


def decode_image(
    path: str | os.PathLike, limits: ImageLimits | None = None, convert: Callable[[Any], Any] | None = None
) -> Any:
    """The image at ``path`` decoded (within ``limits``, float pixels checked), passed through ``convert`` (e.g. to
    RGB); without ``convert``, a decoded copy. Any failure is one :class:`ImageInputError` naming the file."""
    with open_image(path, limits) as image:
        try:
            image.load()
            check_float_pixels(image, path)
            return convert(image) if convert is not None else image.copy()
        except ImageInputError:
            raise
        except Exception as error:  # noqa: BLE001 - truncated data, a decoder's error: this file's problem
            raise ImageInputError(f"cannot decode image '{path}': {_reason(error)}") from None


def _to_8_bit(image: Any) -> Any:
    """16/32-bit integer greyscale (modes I;16*, I) as 8-bit L: 0..65535 maps to 0..255."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(pixels / 257.0), 0, 255).astype(np.uint8), "L")


def as_mode(image: Any, mode: str) -> Any:
    """``image`` (opened) decoded as ``mode`` (RGB or L) the way linvit trains: transparency composited on white,
    16-bit greyscale rescaled to 8 bits (a bare ``convert`` clips it at 255: nearly all white)."""
    from PIL import Image

    if image.mode.startswith("I;16") or image.mode == "I":
        return _to_8_bit(image).convert(mode)
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        # Composite on white, for RGB and L alike: a bare convert() makes transparent pixels black (RGB) or
        # leaves their hidden colour (L), whatever it was.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert(mode)
    return image.convert(mode)


def load_image(path: str | os.PathLike, mode: str, limits: ImageLimits | None = None) -> Any:
    """The image at ``path`` as ``mode`` (RGB or L; see :func:`as_mode`), decoded under :func:`decode_image`'s rules."""
    return decode_image(path, limits, lambda image: as_mode(image, mode))


def image_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of an image file's bytes (read in chunks), opened under :func:`open_image`'s file rules."""
    digest = hashlib.sha256()
    with _open_regular(path) as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()
