"""int8 ONNX: an fp32 file of :func:`linvit.utils.deploy.export_onnx` quantized with ONNX Runtime's tools.

- **Static** (:func:`quantize_static_int8`), when calibration images are at hand (``linvit export RUN --quantize
  int8``: images of the run's validation split): QDQ format (``QuantizeLinear``/``DequantizeLinear`` pairs around
  each quantized node, the form ONNX Runtime's CPU execution provider fuses into its fastest int8 kernels), weights
  int8 (7 bits, below) per output channel, activations uint8 per tensor (u8s8, ONNX Runtime's default for x86),
  each activation's range the 99.999th percentile of its magnitudes over the calibration images (ONNX Runtime's
  ``Percentile`` calibration), not their extremes. The products (``MatMul``, ``Gemm``) read int8 and give
  float (:data:`FLOAT_OUTPUT_OP_TYPES`: no ``QuantizeLinear`` after them), which ONNX Runtime runs as
  ``MatMulIntegerToFloat``: their results feed float ops (bias adds, layer norms, GELU, the residual sums), and a
  quantized output put a quantize and a dequantize between each product and those. ``linvit_tiny`` at 1024² on a
  2-core Intel Xeon (AMX, 2026-12-06): 875 -> 684 ms, 1.31x -> 1.68x faster than fp32 (1,150 ms), the largest logit
  error on a random image 8.0% -> 3.7% of the largest logit; the README's digits run 10.0% -> 8.1%, top-1 unchanged.
  The linear layers go to the quantizer as ``Gemm`` (:mod:`linvit.utils.onnx_gemm`; the fp32 file is not changed)
  and come out as ``QGemm``, bias added in the kernel: 735 -> 681 ms more.
  Percentile ranges, and calibration images read as the model sees them deployed (``linvit export`` takes the
  run's validation split, with the evaluation transform, not augmented training images), took a ``linvit_nano`` run on
  a Fashion-MNIST folder (2026-12-06, 2,000 test images) from -0.95 to -0.25 points of top-1 (agreement with fp32
  97.90% -> 98.75%; each change alone: -0.55 and -0.60); the README's digits run kept +0.28.
- **Dynamic** (:func:`quantize_dynamic_int8`), without them (``--model NAME``): weights int8 per channel, activations
  quantized at run time from each input's own range.

Weights are quantized to 7 bits (ONNX Runtime's ``reduce_range``), on every CPU, since a file made on one CPU runs
on others: on x86 CPUs without VNNI (AVX2, and AVX-512 without it) ONNX Runtime's u8s8 kernels add pairs of uint8 ×
int8 products in 16 bits with saturation (``VPMADDUBSW``), which full 8-bit weights can overflow. Measured on an AVX2
AMD EPYC (2026-12-04, the test model of tests/test_quantize.py): the largest logit error 14.4% of the largest logit
with 8-bit weights, 3.1% with 7-bit ones (top-1 agreement 87.5% → 96.9%), the figures an AVX-512 machine gave with 8.

Which nodes: :data:`QUANTIZED_OP_TYPES`, the nodes that hold the arithmetic (``Conv``, the depthwise convolution
included; ``MatMul``; ``Gemm``). Everything else stays float: the focused attention's normalisation (``Pow``,
``ReduceL2``/``ReduceSum``, ``Div``), layer norms, softmax, GELU and the index arithmetic of the windows. Quantizing
those ops too (ONNX Runtime's default list) puts a quantize/dequantize pair on each of their inputs and outputs: the
focused feature map's ``x ** p`` and its norm ratio span orders of magnitude within one tensor, which one uint8 scale
per tensor represents badly, and the ops themselves gain nothing from int8 on the CPU. Measured on the README's
digits run (2026-12-03): top-1 99.44% in fp32 and in int8 either way, but the largest logit error grew from 9.8% to
14.3% of the largest logit with those ops quantized too, so they stay float (the README's Deploy section).

:func:`compare_onnx` runs both files on the same images and reports the top-1 agreement, the largest logit
difference relative to the fp32 logits' largest magnitude, and top-1 accuracies when labels are given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FLOAT_OUTPUT_OP_TYPES",
    "QUANTIZED_OP_TYPES",
    "QUANTIZE_CHOICES",
    "compare_onnx",
    "int8_path",
    "quantize_dynamic_int8",
    "quantize_static_int8",
    "report_path",
]

QUANTIZE_CHOICES = ("int8",)
QUANTIZED_OP_TYPES = ("Conv", "MatMul", "Gemm")
FLOAT_OUTPUT_OP_TYPES = ("MatMul", "Gemm")  # their outputs stay float in the static file
INPUT_NAME = "image"


def int8_path(path: str | os.PathLike) -> Path:
    """Where the int8 file of the fp32 ``path`` goes: ``model.onnx`` -> ``model.int8.onnx``, beside it."""
    path = Path(path)
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
    return path.with_name(f"{stem}.int8.onnx")


def report_path(int8: str | os.PathLike) -> Path:
    """Where the accuracy report of an int8 file goes: ``model.int8.onnx`` -> ``model.int8.json``, beside it."""
    int8 = Path(int8)
    stem = int8.name[: -len(".onnx")] if int8.name.endswith(".onnx") else int8.name
    return int8.with_name(f"{stem}.json")


def _require_quantization() -> Any:
    try:
        from onnxruntime import quantization
    except ImportError as error:
        raise ImportError(
            "--quantize int8 needs onnxruntime (its quantization tools): pip install 'linvit[onnx]'"
        ) from error
    return quantization


class _Batches:
    """ONNX Runtime's ``CalibrationDataReader`` protocol over a list of (B, C, H, W) float32 arrays, one image a call:
    the percentile calibrator stacks each tensor's values over the calls, which needs them all of one shape."""

    def __init__(self, batches: Iterable[np.ndarray]):
        self._images = (image[None] for batch in batches for image in batch)

    def get_next(self) -> dict[str, np.ndarray] | None:
        image = next(self._images, None)
        return None if image is None else {INPUT_NAME: np.ascontiguousarray(image, dtype=np.float32)}


def quantize_static_int8(
    fp32: str | os.PathLike,
    out: str | os.PathLike,
    calibration: Sequence[np.ndarray],
    *,
    force: bool = False,
) -> Path:
    """Write ``out``: ``fp32`` statically quantized (QDQ, per-channel int8 weights, uint8 activations calibrated on
    ``calibration``, a sequence of (B, C, H, W) float32 batches) on :data:`QUANTIZED_OP_TYPES`.

    Written under a temporary name and renamed into place, recorded as ``onnx`` (:func:`linvit.io.destination.
    write_file`: an existing ``out`` linvit did not write is refused unless ``force``). Returns ``out``.
    """
    from linvit.io.destination import write_file

    quantization = _require_quantization()
    if not calibration:
        raise ValueError("static quantization needs at least one calibration batch")

    def write(temporary: Path) -> None:
        quantization.quantize_static(
            _linear_layers_as_gemm(fp32),
            str(temporary),
            _Batches(calibration),
            quant_format=quantization.QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            per_channel=True,
            reduce_range=True,  # 7-bit weights: no saturation in u8s8 kernels without VNNI (module docstring)
            activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8,
            # each activation's range: its magnitudes' 99.999th percentile over the calibration images, not the
            # extremes, which a few outlying values set (module docstring)
            calibrate_method=quantization.CalibrationMethod.Percentile,
            # int8 products that give float: ONNX Runtime fuses them into MatMulIntegerToFloat (module docstring)
            extra_options={"OpTypesToExcludeOutputQuantization": list(FLOAT_OUTPUT_OP_TYPES)},
        )

    return write_file(out, write, "onnx", force=force)


def _linear_layers_as_gemm(fp32: str | os.PathLike) -> Any:
    """The fp32 file with its linear layers as ``Gemm`` (:mod:`linvit.utils.onnx_gemm`), which quantizes into
    ``QGemm``, bias included; a file whose weights lie in a ``.data`` file beside it (past 2 GB) is quantized as it
    is, from its path."""
    import onnx

    from linvit.utils.deploy import onnx_data_file
    from linvit.utils.onnx_gemm import linear_layers_as_gemm

    if onnx_data_file(fp32) is not None:
        return str(fp32)
    model = onnx.load(str(fp32))
    linear_layers_as_gemm(model)
    return model


def quantize_dynamic_int8(fp32: str | os.PathLike, out: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``out``: ``fp32`` dynamically quantized (per-channel int8 weights, activations quantized at run time) on
    :data:`QUANTIZED_OP_TYPES`; written as :func:`quantize_static_int8` writes. Returns ``out``."""
    from linvit.io.destination import write_file

    quantization = _require_quantization()

    def write(temporary: Path) -> None:
        quantization.quantize_dynamic(
            str(fp32),
            str(temporary),
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            per_channel=True,
            reduce_range=True,
            weight_type=quantization.QuantType.QInt8,
        )

    return write_file(out, write, "onnx", force=force)


def session(path: str | os.PathLike, threads: int = 0) -> Any:
    """An ONNX Runtime session on the CPU execution provider (``threads`` intra-op threads, 0: its default)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def compare_onnx(
    fp32: str | os.PathLike,
    int8: str | os.PathLike,
    batches: Iterable[np.ndarray | tuple[np.ndarray, np.ndarray]],
) -> dict[str, Any]:
    """Run the fp32 and the int8 file on the same images and compare what they predict.

    ``batches``: (B, C, H, W) float32 arrays, or (images, labels) pairs. Returns ``images``, ``top1_agreement`` (the
    share of images where both files predict the same class), ``max_relative_logit_difference`` (the largest
    absolute difference of a logit over the largest absolute fp32 logit, over all images) and, with labels,
    ``fp32_top1``, ``int8_top1`` (shares of correct predictions) and ``top1_change_points`` (int8 minus fp32, in
    percentage points).
    """
    fp32_session, int8_session = session(fp32), session(int8)
    images = agree = fp32_correct = int8_correct = 0
    labelled = True
    largest_difference = largest_logit = 0.0
    for batch in batches:
        labels = None
        if isinstance(batch, tuple):
            batch, labels = batch
        else:
            labelled = False
        feed = {INPUT_NAME: np.ascontiguousarray(batch, dtype=np.float32)}
        reference = fp32_session.run(None, feed)[0]
        quantized = int8_session.run(None, feed)[0]
        largest_difference = max(largest_difference, float(np.abs(quantized - reference).max()))
        largest_logit = max(largest_logit, float(np.abs(reference).max()))
        fp32_top1, int8_top1 = reference.argmax(1), quantized.argmax(1)
        images += len(batch)
        agree += int((fp32_top1 == int8_top1).sum())
        if labels is not None:
            labels = np.asarray(labels)
            fp32_correct += int((fp32_top1 == labels).sum())
            int8_correct += int((int8_top1 == labels).sum())
    if images == 0:
        raise ValueError("no images to compare the fp32 and int8 files on")
    result: dict[str, Any] = {
        "images": images,
        "top1_agreement": agree / images,
        "max_relative_logit_difference": largest_difference / largest_logit if largest_logit > 0 else 0.0,
    }
    if labelled:
        result["fp32_top1"] = fp32_correct / images
        result["int8_top1"] = int8_correct / images
        result["top1_change_points"] = 100.0 * (int8_correct - fp32_correct) / images
    return result
