"""Deploy a model: an ONNX file or a ``torch.export`` program with dynamic batch, height and width.

Both come from a ``torch.export`` trace of the model in eval mode with symbolic (batch, H, W):

- the attention core runs on the ``torch`` backend (:func:`linvit.ops.use_backend`), so on CUDA the Triton kernels
  leave the graph as the same mathematics in standard ops and the exported file runs anywhere;
- the modules take their branch-free paths while ``torch.export`` traces (:func:`linvit.ops.windows.exporting`):
  windows are min(window, map), maps are always padded to whole windows and padded keys masked, shifts are arithmetic
  on the sizes. One graph therefore computes, at every size, what the eager model computes at that size;
- the example input is larger than the native size (:func:`example_size`), so that every stage has several windows
  in each direction and no size the trace sees is 1 (sizes 0 and 1 would be specialised).

A ``.pt2`` program checks its input against guards that the trace recorded: an op whose result would differ in
layout if a map were 1 token wide (a copy for contiguity, a view) guards that it is not. Those guards set the
smallest height and width the program takes (33 for a model of stride 32: its last map is then 2 tokens wide), and
:func:`export_program` states that range in the program's dynamic shapes (named ``Dim``s, which ``torch.export``
checks against every guard), so that the program runs at every size it claims. A model whose native size lies
below that range (a run trained at 32×32) is exported static at its native size, with a warning
(:class:`StaticSizeWarning`). ONNX files carry no such guards and serve every size.

``export_onnx`` writes an ONNX file (the dynamo exporter, the current default opset unless ``opset`` is given),
``export_program`` returns the ``ExportedProgram`` (``torch.export.save`` it as ``.pt2``; AOTInductor compiles it with
``torch._inductor.aoti_compile_and_package``); :func:`program_sizes` reads the heights and widths a program takes.
ONNX needs the ``onnx`` extra: ``pip install linvit[onnx]``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "FORMATS",
    "ProgramSizes",
    "StaticSizeWarning",
    "dynamic_shapes",
    "example_size",
    "export_onnx",
    "export_program",
    "native_size",
    "onnx_data_file",
    "output_names",
    "program_sizes",
    "save_program",
]

FORMATS = ("onnx", "pt2")
INPUT_NAME = "image"
MAX_BATCH = 65536
# The heights and widths (1 .. SEARCH_LIMIT) whose guards are evaluated to find where a program's dynamic range can
# start: every model here takes any size from 36 up, and torch.export checks the range chosen against every guard.
SEARCH_LIMIT = 160


class StaticSizeWarning(UserWarning):
    """The program is static in height and width at the model's native size, which lies below the smallest size a
    dynamic program of the model takes."""


def native_size(model: nn.Module) -> tuple[int, int]:
    """The (H, W) a model is made for: its pretrained cfg's ``input_size``, else its ``img_size``, else 224²."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    if size is not None and len(size) == 3:
        return int(size[1]), int(size[2])
    img_size = getattr(model, "img_size", None)
    if isinstance(img_size, int):
        return img_size, img_size
    if isinstance(img_size, Sequence) and len(img_size) == 2:
        return int(img_size[0]), int(img_size[1])
    return 224, 224


def input_channels(model: nn.Module) -> int:
    """The channels a model takes (``in_chans``, else its pretrained cfg's ``input_size``, else 3)."""
    channels = getattr(model, "in_chans", None)
    if isinstance(channels, int):
        return channels
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
    return int(size[0]) if size else 3


def example_size(model: nn.Module) -> tuple[int, int]:
    """The (H, W) the trace runs at: twice the native size (at least 224) plus a margin, non-square.

    The export is valid at every size only if no size the trace sees is 0 or 1 and every clamp (min(window, map)) is
    symbolic: at twice the native size every stage's map spans at least two of its windows (the widest linear window,
    FLatten-Swin's 56 at stride 8 for 224, needs more than 448 pixels).
    """
    height, width = native_size(model)
    return 2 * max(height, 224) + 64, 2 * max(width, 224) + 96


def dynamic_shapes(smallest: tuple[int, int] | None = None) -> tuple[dict[int, Any]]:
    """Batch from 1; height and width from ``smallest`` (named ``Dim``s: ``torch.export`` refuses the export if some
    guard holds only on part of the range), or without it as far as the trace allows (``Dim.DYNAMIC``)."""
    from torch.export import Dim

    batch = Dim("batch", min=1, max=MAX_BATCH)
    if smallest is None:
        return ({0: batch, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},)
    return ({0: batch, 2: Dim("height", min=smallest[0]), 3: Dim("width", min=smallest[1])},)


@contextlib.contextmanager
def _export_settings() -> Iterator[None]:
    """The torch backend, and size-oblivious reasoning on backed sizes (no guards on sizes being 1)."""
    import torch.fx.experimental._config as fx_config

    import linvit.ops

    with linvit.ops.use_backend("torch"), fx_config.patch(backed_size_oblivious=True):
        yield


def _example_input(model: nn.Module, size: tuple[int, int] | None, batch: int = 2) -> torch.Tensor:
    height, width = size or example_size(model)
    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch, input_channels(model), height, width, generator=generator).to(device=device, dtype=dtype)


def export_program(model: nn.Module, size: tuple[int, int] | None = None) -> torch.export.ExportedProgram:
    """``torch.export`` the model (put in eval mode) with dynamic batch, height and width: a program that runs at the
    model's native size and at every size of its dynamic shapes (:func:`program_sizes`).

    ``size``: the (H, W) of the example input (default :func:`example_size`). The attention runs on the ``torch``
    backend (standard ops only, so the program runs on any device, CUDA or not, with or without Triton).

    Two traces: the first, with height and width ``Dim.DYNAMIC``, records the guards that set the smallest size the
    program takes; the second states that range (named ``Dim``s, which ``torch.export`` checks against every guard).
    Where the native size lies below it, the second trace is static at the native size, the batch dynamic where the
    program's guards allow a batch of 1 and else 1 too (a third trace), and a :class:`StaticSizeWarning` says so.
    """
    import warnings

    from torch._dynamo.exc import UserError

    probe = _trace(model, size, dynamic_shapes())
    smallest = _smallest_dynamic_size(probe)
    native = native_size(model)
    if smallest is None:  # guards this torch does not expose: the probe's own range
        return probe
    if native[0] >= smallest[0] and native[1] >= smallest[1]:
        try:
            program = _trace(model, size, dynamic_shapes(smallest))
        except UserError as error:  # a guard the search did not see refuses part of the range
            reason = f"torch.export refused the range from {_size_text(smallest)} up ({str(error).splitlines()[0]})"
        else:
            sizes = [native, smallest, (smallest[0] + 7, smallest[1] + 20)]
            if all(_guards_pass(program, batch, *side) for batch in (1, 2) for side in sizes):
                return program
            reason = f"its guards refuse part of the range from {_size_text(smallest)} up"
    else:
        reason = f"a program of {type(model).__name__} is dynamic from {_size_text(smallest)} up only"
    batch = dynamic_shapes()[0][0]
    program = _trace(model, native, ({0: batch},), static=True)
    if not _guards_pass(program, 1, *native):  # a map of one token makes ops ask whether the batch is 1
        program = _trace(model, native, ({},), static=True, batch=1)
    sides = "batch 1, height and width" if _input_shape(program)[0] == 1 else "height and width"
    warnings.warn(f"{sides} static at the native size {_size_text(native)}: {reason}", StaticSizeWarning, stacklevel=2)
    return program


def _trace(
    model: nn.Module,
    size: tuple[int, int] | None,
    shapes: tuple[dict[int, Any]],
    static: bool = False,
    batch: int = 2,
) -> torch.export.ExportedProgram:
    model.eval()
    example = _example_input(model, size, batch)
    # A convolution of a channels-last (or other strided) input makes torch.export specialise the batch size (its
    # memory-format choice asks whether the batch is 1): convolutions see dense inputs while it traces.
    dense = _standard_strides_input if static else _dense_input
    hooks = [m.register_forward_pre_hook(dense) for m in model.modules() if isinstance(m, nn.Conv2d)]
    try:
        with _export_settings():
            return torch.export.export(model, (example,), dynamic_shapes=shapes)
    finally:
        for hook in hooks:
            hook.remove()


def _size_text(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


class _Sizes:
    """An input as the guards see it: only its sizes."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def size(self) -> tuple[int, ...]:
        return self.shape


class _AnyInput(dict):
    """The guards' ``L[name]``: every input name is the one input."""

    def __init__(self, value: _Sizes) -> None:
        super().__init__()
        self.value = value

    def __missing__(self, key: str) -> _Sizes:
        return self.value


def _guards_pass(program: torch.export.ExportedProgram, batch: int, height: int, width: int) -> bool:
    """Whether an input of (batch, C, height, width) passes the guards the program checks (True where this torch
    exposes none)."""
    import math

    guards = getattr(program, "_guards_code", None)
    if not guards:
        return True
    sizes = _Sizes((batch, _input_shape(program)[1], height, width))
    names = {"L": _AnyInput(sizes), "torch": torch, "math": math}
    return all(eval(guard, names) for guard in guards)  # noqa: S307  (the guards torch.export wrote, not input)


def _smallest_dynamic_size(program: torch.export.ExportedProgram) -> tuple[int, int] | None:
    """The smallest (H, W) from which every (h, w) up to :data:`SEARCH_LIMIT` passes the program's guards (the second
    trace checks the whole range), or None where the program keeps no guards this torch exposes or none passes.

    The range is square, from (s, s) up: a guard that fails at (h, w) rules out every s up to min(h, w), so s is one
    above the largest min(h, w) of a failing (h, w).
    """
    import math

    guards = getattr(program, "_guards_code", None)
    if guards is None:
        return None
    if not guards:
        return 1, 1
    check = compile(" and ".join(f"({guard})" for guard in guards), "<guards>", "eval")
    channels = _input_shape(program)[1]

    def passes(height: int, width: int) -> bool:
        names = {"L": _AnyInput(_Sizes((1, channels, height, width))), "torch": torch, "math": math}
        return bool(eval(check, names))  # noqa: S307  (the guards torch.export wrote, not input)

    limit = SEARCH_LIMIT
    failing = [(h, w) for h in range(1, limit + 1) for w in range(1, limit + 1) if not passes(h, w)]
    side = 1 + max((min(h, w) for h, w in failing), default=0)
    if side > limit // 2:  # no range that the search can vouch for
        return None
    return side, side


def _input_shape(program: torch.export.ExportedProgram) -> tuple[Any, ...]:
    """The shape of the program's image input (ints where static, SymInts where dynamic)."""
    names = set(program.graph_signature.user_inputs)
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name in names)
    return tuple(node.meta["val"].shape)


class ProgramSizes(tuple):
    """(smallest height, largest height, smallest width, largest width) a program takes; ``None`` for no bound."""

    __slots__ = ()

    def __new__(cls, heights: tuple[int, int | None], widths: tuple[int, int | None]) -> ProgramSizes:
        return super().__new__(cls, (*heights, *widths))

    @property
    def static(self) -> bool:
        """One height and one width."""
        return self[0] == self[1] and self[2] == self[3]

    def describe(self) -> str:
        """``height 33.. and width 33.. px`` / ``height and width static at 32x32``."""
        if self.static:
            return f"height and width static at {self[0]}x{self[2]}"

        def one(low: int, high: int | None) -> str:
            return f"{low}..{'' if high is None else high}"

        return f"height {one(self[0], self[1])} and width {one(self[2], self[3])} px"


def program_sizes(program: torch.export.ExportedProgram) -> ProgramSizes:
    """The heights and widths an exported program takes: its input's static sides, or the range constraints of its
    dynamic ones (a range without a lower bound that torch.export recorded starts at 1)."""
    bounds = []
    for side in _input_shape(program)[2:4]:
        if isinstance(side, int):
            bounds.append((side, side))
            continue
        value_range = program.range_constraints.get(side.node.expr)
        low = max(int(value_range.lower), 1) if value_range is not None else 1
        upper = value_range.upper if value_range is not None else None
        high = int(upper) if upper is not None and upper.is_Integer else None  # not int_oo
        bounds.append((low, high))
    return ProgramSizes(bounds[0], bounds[1])


def _dense_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0].contiguous(), *args[1:])


def _standard_strides_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """For a static trace: a map of 1x1 tokens in channels-last memory counts as contiguous (its strides along the
    size-1 sides do not matter), so ``contiguous()`` keeps its strides, and the convolution's memory-format choice
    then asks whether the batch is 1. A copy in the standard strides asks nothing."""
    return (args[0].clone(memory_format=torch.contiguous_format), *args[1:])


def save_program(
    program: torch.export.ExportedProgram,
    path: str | os.PathLike,
    *,
    force: bool = False,
    inputs: Sequence[str | os.PathLike | None] = (),
) -> Path:
    """Write an exported program as a ``.pt2`` archive (``torch.export.load`` reads it back).

    Through :func:`linvit.io.destination.write_file`: a temporary file in ``path``'s folder renamed into place (a kill
    leaves the old file or the new one); an existing ``path`` that linvit did not write as ``pt2`` is refused unless
    ``force``, and one of ``inputs`` (the files the model came from) always (:class:`DestinationError`).
    """
    from linvit.io.destination import check_not_input, refuse_os_error, write_file

    path = Path(path)
    check_not_input(path, *inputs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise refuse_os_error(path, error) from None

    def save(temporary: Path) -> None:
        with open(temporary, "wb") as file:  # a file object: torch wants a path ending in .pt2 or a buffer
            torch.export.save(program, file)

    return write_file(path, save, "pt2", force=force)


def output_names(model: nn.Module, outputs: Any) -> list[str]:
    """ONNX output names: ``feature_0`` … for a ``features_only`` model's list of maps, ``logits`` for a classifier,
    ``features`` for a model without one (``num_classes=0``)."""
    if isinstance(outputs, (list, tuple)):
        return [f"feature_{index}" for index in range(len(outputs))]
    return ["logits" if getattr(model, "num_classes", 0) else "features"]


def _require_onnx() -> None:
    missing = [name for name in ("onnx", "onnxscript") if _missing(name)]
    if missing:
        raise ImportError(
            f"ONNX export needs {' and '.join(missing)}: install the onnx extra, pip install 'linvit[onnx]' "
            "(onnx, onnxscript, and onnxruntime to run the file)."
        )


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    opset: int | None = None,
    size: tuple[int, int] | None = None,
    program: torch.export.ExportedProgram | None = None,
    *,
    force: bool = False,
    inputs: Sequence[str | os.PathLike | None] = (),
) -> Path:
    """Write the model as ONNX with dynamic batch, height and width (input ``image``, outputs named by
    :func:`output_names`); returns the path.

    ``opset``: the ONNX opset (default: the exporter's current default). ``size``: see :func:`export_program`.
    ``program``: an already exported program of this model (saves tracing again). ``force`` and ``inputs``: as for
    :func:`save_program`.

    A model whose weights fit in ONNX's 2 GB is one file, written under a temporary name and renamed into place. A
    larger one needs its weights in ``<name>.data`` beside it: both are written in a hidden staging folder beside
    ``path`` and moved out, the data first and the ``.onnx`` last, so the ``.onnx`` under its final name is always a
    complete file (a kill between the two moves leaves the old ``.onnx`` beside the new data).
    """
    from linvit.io.destination import check_destination, check_not_input, refuse_os_error

    _require_onnx()
    path = Path(path)
    check_not_input(path, *inputs)
    check_destination(path, "onnx", force=force)  # before the export's minutes, not after
    if program is None:  # one trace: an ONNX file keeps no guards, so the probe's range is the file's
        program = _trace(model, size, dynamic_shapes())
    example = _example_input(model, size)
    outputs = output_names(model, _output_structure(program))
    options: dict[str, Any] = {"dynamo": True, "verbose": False, "input_names": [INPUT_NAME], "output_names": outputs}
    if opset is not None:
        options["opset_version"] = opset
    with _export_settings(), _quiet():
        onnx_program = torch.onnx.export(program, (example,), None, **options)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise refuse_os_error(path, error) from None
    _save_onnx(onnx_program, path, force)
    return path


def _save_onnx(onnx_program: Any, path: Path, force: bool) -> None:
    """Save an ``ONNXProgram`` in one file (or with ``<name>.data`` when over 2 GB) without a partial final file."""
    import shutil

    from linvit.io.destination import move_into_place, refuse_os_error, staging_folder

    staging = staging_folder(path)
    try:
        staged = staging / path.name
        try:
            onnx_program.save(staged, external_data=False)  # one file unless the weights pass 2 GB
        except OSError as error:
            raise refuse_os_error(path, error) from None
        data = staging / f"{path.name}.data"
        if data.exists():
            move_into_place(data, path.with_name(data.name), "onnx-data", force=force)
        move_into_place(staged, path, "onnx", force=force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def onnx_data_file(path: str | os.PathLike) -> Path | None:
    """The ``<name>.data`` file that holds an ONNX file's weights (written when they pass ONNX's 2 GB), or None when
    the file holds them itself. A ``.data`` file beside a one-file export (left by an earlier, larger one) is not
    the file's: only a weight stored outside the file names it."""
    path = Path(path)
    data = path.with_name(f"{path.name}.data")
    if not data.is_file():
        return None
    import onnx
    from onnx.external_data_helper import uses_external_data

    graph = onnx.load(str(path), load_external_data=False).graph
    return data if any(uses_external_data(tensor) for tensor in graph.initializer) else None


def _output_structure(program: torch.export.ExportedProgram) -> Any:
    """The program's outputs as a placeholder structure (a list for ``features_only`` models, else one tensor)."""
    spec = program.call_spec.out_spec
    if spec is None:
        return None
    return spec.unflatten([None] * spec.num_leaves)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The ONNX exporter prints its progress to stdout: send it to stderr (a command's stdout is its result)."""
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        yield
