"""The torch ops an attention module launches around its fused core, found by tracing it, not by listing them.

A module's forward and backward run on fake tensors (shapes and dtypes, no memory, no arithmetic) under a
``TorchDispatchMode`` that records every aten op that reaches the dispatcher. An op launches one CUDA kernel unless
it is a view or an allocation (:data:`NO_LAUNCH`); what it moves is the bytes of the tensors it reads and writes
(:func:`op_bytes`), each counted once. The cores that stand for a kernel of their own are kept out of the torch ops:
linvit's fused forward and backward ops are answered from their launch plans' outputs (their kernels are counted
from the SASS by the cost figure), and a scaled-dot-product attention call is one launch whose bytes and FLOPs are
those of a flash kernel (:func:`flash_attention`). Projections (``F.linear``) are outside the modules compared and
are answered by an allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# ops that launch nothing: allocations (their memory is written by the op that fills it), metadata and aliases
NO_LAUNCH = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "lift_fresh",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "device", "dim", "size",
    }
)  # fmt: skip
# ops that are one dispatch but two CUDA launches: a zero fill of the output, then a copy of the gradient into part
# of it (their bytes: the copy's, plus the fill's write of the whole output)
FILL_AND_COPY = frozenset({"slice_backward", "select_backward", "diagonal_backward", "as_strided_backward"})
FUSED_OPS = ("linvit.linear_attention_qkv_forward", "linvit.linear_attention_qkv_backward")


@dataclasses.dataclass
class TracedOp:
    """One launch: an op's name, the bytes it reads and writes, its tensor-core FLOPs (attention cores only), and
    its kind: "torch" (a launch the figure counts here), "fused" (linvit's op: kernels counted from the SASS) or
    "attention" (a flash kernel)."""

    name: str
    bytes: float
    flops: float = 0.0
    kind: str = "torch"
    launches: int = 1


@dataclasses.dataclass
class Trace:
    """The launches of a module's forward and backward, and the bytes each pass cannot avoid: every input read and
    the output written (forward); the output's gradient and every input read, every input's gradient written
    (backward)."""

    forward: list[TracedOp]
    backward: list[TracedOp]
    floor_forward_bytes: float
    floor_backward_bytes: float


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses: a broadcast (stride 0) dimension counts once."""
    elements = 1
    for size, stride in zip(tensor.shape, tensor.stride()):
        if stride != 0:
            elements *= size
    return elements * tensor.element_size() if tensor.numel() else 0


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def op_bytes(func, args, kwargs, out) -> int:
    """What one op moves: the tensors it reads (arguments it does not write) and the tensors it returns (an in-place
    op's destination is written, counted once)."""
    written = set()
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            written |= {id(tensor) for tensor in _tensors(value)}
    inputs = [tensor for value in (*args, *kwargs.values()) for tensor in _tensors(value) if id(tensor) not in written]
    return sum(tensor_bytes(tensor) for tensor in inputs) + sum(tensor_bytes(tensor) for tensor in _tensors(out))


def launches(func) -> bool:
    """Whether an op launches a kernel: not a view, not an allocation or a question about metadata."""
    return not (func.is_view or func._opname in NO_LAUNCH or func.namespace == "prim")


class OpRecorder(TorchDispatchMode):
    """Records the launches of the ops dispatched under it; ``answers`` maps an op's qualified name to a function that
    returns its outputs instead of running it (and the op is recorded as one "fused" launch)."""

    def __init__(self, answers: dict[str, Callable] | None = None) -> None:
        super().__init__()
        self.answers = answers or {}
        self.ops: list[TracedOp] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.replace("::", ".")
        if name in self.answers:
            self.ops.append(TracedOp(name, 0.0, kind="fused"))
            return self.answers[name](*args, **kwargs)
        out = func(*args, **kwargs)
        if launches(func):
            moved = float(op_bytes(func, args, kwargs, out))
            count = 1
            if func._opname in FILL_AND_COPY:
                moved += sum(tensor_bytes(tensor) for tensor in _tensors(out))
                count = 2
            self.ops.append(TracedOp(f"{name}.{func._overloadname}", moved, launches=count))
        return out


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool) -> TracedOp:
    """A flash attention kernel on (batch, heads, L, d): the forward reads q, k, v and writes the output and the
    softmax's log-sum-exp (fp32 per row), 4·L·S·d FLOPs a head (QKᵀ and PV); the backward reads q, k, v, the output,
    its gradient and the log-sum-exp, writes dq, dk, dv, and does 2.5 times the forward's products (QKᵀ again, dV,
    dP, dQ, dK). Padding to the kernel's tiles is not counted (a lower bound for short windows)."""
    batch_heads = q.shape[:-2].numel()
    length, keys, dim = q.shape[-2], k.shape[-2], q.shape[-1]
    qkv = tensor_bytes(q) + tensor_bytes(k) + tensor_bytes(v)
    out = batch_heads * length * v.shape[-1] * q.element_size()
    lse = batch_heads * length * 4
    flops = 4.0 * batch_heads * length * keys * dim
    if not backward:
        return TracedOp("flash_attention_forward", qkv + out + lse, flops, kind="attention")
    return TracedOp("flash_attention_backward", 2 * qkv + 2 * out + lse, 2.5 * flops, kind="attention")


class _ProjectionStandIn(torch.autograd.Function):
    """``F.linear`` answered by an allocation (projections are outside the modules compared)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.shape = x.shape
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        return grad.new_empty(ctx.shape), None, None


class _AttentionStandIn(torch.autograd.Function):
    """Scaled-dot-product attention answered as a flash kernel: recorded, its output an allocation."""

    @staticmethod
    def forward(ctx, recorder, q, k, v, bias):
        ctx.recorder, ctx.shapes = recorder, (q, k, v, bias)
        recorder.ops.append(flash_attention(q, k, v, backward=False))
        return q.new_empty(*q.shape[:-1], v.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        q, k, v, bias = ctx.shapes
        ctx.recorder.ops.append(flash_attention(q, k, v, backward=True))
        grad_bias = None if bias is None else grad.new_empty(bias.shape)
        return None, grad.new_empty(q.shape), grad.new_empty(k.shape), grad.new_empty(v.shape), grad_bias


class _StandIns(TorchFunctionMode):
    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            return _ProjectionStandIn.apply(x, weight, rest[0] if rest else kwargs.get("bias"))
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            return _AttentionStandIn.apply(self.recorder, q, k, v, kwargs.get("attn_mask"))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _triton_backend_on_cpu() -> Iterator[None]:
    """linvit picks its Triton backend for CPU tensors under the interpreter: fake CPU tensors then take the fused
    ops' path (which the recorder answers, so nothing is compiled or interpreted)."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def trace(
    build: Callable[[], tuple[Callable[..., torch.Tensor], dict]], answers: dict[str, Callable] | None = None
) -> Trace:
    """The launches of ``module(**inputs)`` and of the backward of its output, where ``build()`` makes the module and
    its inputs (called on fake tensors: parameters and inputs take no memory; the inputs that require grad get
    one)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    recorder = OpRecorder(answers)
    with FakeTensorMode(), _triton_backend_on_cpu():
        module, inputs = build()
        with _StandIns(recorder), recorder:
            out = module(**inputs)
        forward, recorder.ops = recorder.ops, []
        grad = torch.empty_like(out)
        with _StandIns(recorder), recorder:
            out.backward(grad)
    leaves = [tensor for tensor in inputs.values() if isinstance(tensor, torch.Tensor)]
    read = sum(tensor_bytes(tensor) for tensor in leaves)
    written = sum(tensor_bytes(tensor) for tensor in leaves if tensor.requires_grad)
    return Trace(forward, recorder.ops, read + tensor_bytes(out), tensor_bytes(grad) + read + written)


def focused_answers(multiprocessors: int) -> dict[str, Callable]:
    """The fused ops answered by their launch plans' outputs (shapes only: the plans allocate, nothing runs)."""
    from linvit.ops.linear_attention import triton_launch, triton_launch_backward
    from linvit.ops.linear_attention.triton_geometry import KernelOptions

    def forward(qkv, inverse, position, weight, bias, mask, *scalars):
        *options, prescaled = scalars
        mask = None if mask is None else mask.view(torch.uint8)
        _, out, partials = triton_launch.forward_plan(qkv, inverse, position, weight, bias, mask,
                                                      KernelOptions(*options), prescaled, multiprocessors)  # fmt: skip
        return (out, *partials)

    def backward(grad_out, qkv, partial_s, partial_z, partial_count, norms, inverse, position, weight, mask, *scalars):
        *options, position_grad = scalars
        mask = None if mask is None else mask.view(torch.uint8)
        partials = (partial_s, partial_z, partial_count, norms)
        _, grad_qkv, small, grad_position = triton_launch_backward.backward_plan(
            grad_out, qkv, partials, inverse, position, weight, mask, KernelOptions(*options), multiprocessors,
            position_grad,
        )  # fmt: skip
        return grad_qkv, small, qkv.new_empty(0) if grad_position is None else grad_position

    return dict(zip(FUSED_OPS, (forward, backward)))


def focused_module(
    batch: int, heads: int, head_dim: int, hw: tuple[int, int], window: tuple[int, int] | None, kernel_size: int,
    dtype: torch.dtype, multiprocessors: int = 132,
) -> Trace:  # fmt: skip
    """FocusedLinearAttention's computation between its qkv projection and its output projection, in training: the
    projected q|k|v in ``dtype`` (autocast's), fp32 parameters (temperature, positional table, DWC)."""
    from linvit.ops.linear_attention.attend import focused_linear_attention

    channels = heads * head_dim
    table = hw if window is None else window

    def build():
        def parameter(*shape):
            return torch.zeros(*shape, requires_grad=True)

        inputs = {
            "x": torch.empty(batch, hw[0] * hw[1], 3 * channels, dtype=dtype).requires_grad_(),
            "scale": parameter(1, 1, channels),
            "position_table": parameter(1, table[0] * table[1], channels),
            "dwc_weight": parameter(head_dim, 1, kernel_size, kernel_size),
            "dwc_bias": parameter(head_dim),
        }

        def module(**tensors):
            return focused_linear_attention(hw=hw, num_heads=heads, window_size=window, position_table_size=table,
                                            backend="triton", **tensors)  # fmt: skip

        return module, inputs

    return trace(build, focused_answers(multiprocessors))


def window_module(batch: int, heads: int, head_dim: int, hw: tuple[int, int], window: int, dtype: torch.dtype) -> Trace:
    """timm's Swin window attention (an unshifted block's ``_attn``: pad, partition, attention with the relative
    position bias, reverse, crop) between its qkv projection and its output projection, in training, in ``dtype``."""
    from timm.models.swin_transformer import SwinTransformerBlock

    def build():
        block = SwinTransformerBlock(
            heads * head_dim, hw, num_heads=heads, window_size=window, shift_size=0, dtype=dtype
        )
        block.train()
        block.attn.fused_attn = True  # scaled_dot_product_attention, as timm runs it on a GPU
        inputs = {"x": torch.empty(batch, hw[0], hw[1], heads * head_dim, dtype=dtype).requires_grad_()}
        return block._attn, inputs

    return trace(build)
