"""Multi-scale feature extraction at native (or any) resolution, saved as safetensors.

Images of different sizes are grouped by size and run in batches per group; every image keeps its own size.
Saved keys are ``<image-stem>/level{i}`` (C, H_i, W_i); the file's metadata holds the model, strides, channels,
and each image's source path, original size and input size (JSON strings: safetensors metadata is str → str).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.dense.backbone import FeatureBackbone

__all__ = [
    "load_image",
    "image_to_tensor",
    "parse_size",
    "unique_stems",
    "extract_features",
    "save_features",
    "load_features",
]

SKIMAGE_PREFIX = "skimage:"


def load_image(source: str | os.PathLike, limits: Any = None) -> np.ndarray:
    """An RGB uint8 (H, W, 3) array from an image file, or ``skimage:<name>`` for scikit-image's bundled photos.

    ``limits``: the :class:`~linvit.io.images.ImageLimits` a file must be within (default: the defaults).

    Raises FileNotFoundError for a missing file and ValueError for a file that is not a readable image.
    """
    source = str(source)
    if source.startswith(SKIMAGE_PREFIX):
        name = source[len(SKIMAGE_PREFIX) :]
        try:
            import skimage.data
        except ImportError as error:
            raise ImportError(
                f"'{source}' needs scikit-image: pip install 'linvit[photos]' (or scikit-image)."
            ) from error
        loader = getattr(skimage.data, name, None)
        if loader is None or not callable(loader):
            raise ValueError(f"scikit-image has no photo {name!r}; try skimage:astronaut, skimage:chelsea, ...")
        array = np.array(loader())
    else:
        path = Path(source)
        if not path.exists() and not path.is_symlink():
            raise FileNotFoundError(f"Image not found: '{path}'.")
        from linvit.io.images import decode_image

        # linvit's image loader: regular files only, size bounded before decoding, NaN/Inf float pixels refused;
        # any failure is one ValueError line naming the file
        array = np.array(decode_image(path, limits, convert=lambda image: image.convert("RGB")))
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.shape[-1] == 4:
        array = array[..., :3]
    if array.dtype != np.uint8:  # float photos in [0, 1], or 16-bit
        array = array.astype(np.float64)
        array = np.clip(array * 255.0 if array.max() <= 1.0 else array, 0, 255).round().astype(np.uint8)
    return np.ascontiguousarray(array)


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"HxW"`` (or ``"S"`` for a square) → (H, W); None stays None."""
    if text is None:
        return None
    parts = text.lower().replace("*", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"Size {text!r} is not HxW with positive integers, e.g. 1024x1024 or 1600x2560.")
    return values[0], values[1]


def image_to_tensor(
    image: np.ndarray, mean: Sequence[float], std: Sequence[float], size: tuple[int, int] | None = None
) -> Tensor:
    """uint8 (H, W, 3) → normalised float (3, H', W'); resized (bilinear, antialiased) when ``size`` is given."""
    tensor = torch.from_numpy(image).permute(2, 0, 1).float().div_(255.0)
    if size is not None and tuple(tensor.shape[-2:]) != tuple(size):
        tensor = F.interpolate(tensor[None], size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    mean_t = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return (tensor - mean_t) / std_t


def unique_stems(sources: Sequence[str]) -> list[str]:
    """File stems, made unique with ``-1``, ``-2`` ... suffixes where two images share a stem."""
    stems: list[str] = []
    seen: dict[str, int] = {}
    for source in sources:
        stem = source[len(SKIMAGE_PREFIX) :] if source.startswith(SKIMAGE_PREFIX) else Path(source).stem
        count = seen.get(stem, 0)
        seen[stem] = count + 1
        stems.append(stem if count == 0 else f"{stem}-{count}")
    return stems


@torch.inference_mode()
def extract_features(
    backbone: FeatureBackbone,
    inputs: Sequence[Tensor],
    batch_size: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> list[list[Tensor]]:
    """Run ``backbone`` on every (3, H, W) input; returns, per input in order, its list of (C, H_i, W_i) maps on CPU.

    Inputs of equal size are batched together (``batch_size`` at most); different sizes never share a batch.
    ``progress`` wraps the iteration over batches (e.g. ``tqdm``). ``dtype`` other than float32 runs under autocast.
    """
    backbone = backbone.eval().to(device)
    groups: OrderedDict[tuple[int, int], list[int]] = OrderedDict()
    for index, tensor in enumerate(inputs):
        groups.setdefault(tuple(tensor.shape[-2:]), []).append(index)
    batches = [ids[i : i + batch_size] for ids in groups.values() for i in range(0, len(ids), batch_size)]
    results: list[list[Tensor] | None] = [None] * len(inputs)
    device_type = torch.device(device).type
    for batch_ids in progress(batches) if progress is not None else batches:
        batch = torch.stack([inputs[i] for i in batch_ids]).to(device)
        with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
            features = backbone(batch)
        for row, index in enumerate(batch_ids):
            results[index] = [f[row].float().cpu() for f in features]
    return [r for r in results if r is not None]


def save_features(
    path: str | os.PathLike,
    features: dict[str, list[Tensor]],
    metadata: dict[str, object],
    dtype: torch.dtype = torch.float32,
    force: bool = False,
) -> Path:
    """Write ``{stem: [level maps]}`` as ``<stem>/level{i}`` tensors with JSON-encoded ``metadata``, through
    :func:`linvit.io.destination.write_file` (a file linvit did not write there: refused unless ``force``)."""
    from safetensors.torch import save_file

    from linvit.io.destination import prepare_folder, write_file

    path = prepare_folder(Path(path).parent) / Path(path).name
    tensors = {
        f"{stem}/level{i}": level.to(dtype).contiguous()
        for stem, levels in features.items()
        for i, level in enumerate(levels)
    }
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    return write_file(path, lambda tmp: save_file(tensors, str(tmp), metadata=encoded), "features", force=force)


def load_features(path: str | os.PathLike) -> tuple[dict[str, list[Tensor]], dict[str, object]]:
    """Read what :func:`save_features` wrote: ``({stem: [level maps]}, metadata with JSON values decoded)``."""
    from safetensors import safe_open

    grouped: dict[str, dict[int, Tensor]] = {}
    with safe_open(str(path), framework="pt") as handle:
        raw_metadata = handle.metadata() or {}
        for key in handle.keys():  # noqa: SIM118  (safe_open is not a dict)
            stem, level = key.rsplit("/level", 1)
            grouped.setdefault(stem, {})[int(level)] = handle.get_tensor(key)
    from linvit.io.bounded import UntrustedFileError, parse_json

    metadata: dict[str, object] = {}
    for key, value in raw_metadata.items():  # bounded in size and nesting; plain data only; else the text itself
        try:
            metadata[key] = parse_json(value, f"'{path}': its metadata's {key}")
        except UntrustedFileError:
            metadata[key] = value
    return {stem: [levels[i] for i in sorted(levels)] for stem, levels in grouped.items()}, metadata
