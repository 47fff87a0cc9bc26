"""Fitting a checkpoint's weights to a registered model, and what their shapes determine of its creation arguments:
the family filter applied, the classifier and stem read from the weights, positional and stripe tables resized only
when asked (`fit_checkpoint`), the options the shapes fix (PVT/PVTv2 ``la_sr_ratios`` and ``linear``, CSwin
``la_split_size``, and those a family filter's advice names: ``attn_layers``, ``sr_ratios``, ``ape``) and the
training size (`infer_creation`). Used by ``linvit convert``.
"""

from __future__ import annotations

import re
import sys
from typing import Any


def family_filter(model: Any):
    module = sys.modules[type(model).__module__]
    return getattr(module, "checkpoint_filter_fn", None)


class MissingOption(ValueError):
    """The weights fit model ``model`` only with an option their shapes do not settle: a non-square training size
    (a flattened table does not tell height from width, nor one factorisation of its positions from another).
    ``sizes`` are the (H, W) at which every table fits as it is (H < W; each transposed fits too), or empty when
    none was found. The message says to pass ``--img-size H W`` (`advice`)."""

    def __init__(self, model: str, positions: int, sizes: list[tuple[int, int]]):
        self.model, self.positions, self.sizes = model, positions, list(sizes)
        super().__init__(self.advice())

    def advice(self, model_option: bool = False) -> str:
        """The message; with ``model_option``, the options to pass include ``--model``."""
        model = f"--model {self.model} " if model_option else ""
        reason = f"a table of {self.positions} positions is no square grid"
        if not self.sizes:
            return (
                f"the weights fit {self.model} trained at a non-square size ({reason}, and no size up to "
                f"{_MAX_ASPECT}:1 fits every table): pass {model}--img-size H W with the size it was trained at"
            )
        fits = " or ".join(f"{height} {width}" for height, width in self.sizes)
        return (
            f"the weights fit {self.model} trained at a non-square size ({reason}): pass {model}--img-size H W "
            f"with that size; every table fits --img-size {fits} (or H and W swapped: the tables do not tell)"
        )


class Misfit(ValueError):
    """The weights do not fit a model; ``differences`` counts the keys that differ (to name the nearest model)."""

    def __init__(self, message: str, differences: int):
        super().__init__(message)
        self.differences = differences


def _layer_names(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


def _class_and_channel_args(model: Any, filtered: dict[str, Any]) -> dict[str, int]:
    """``num_classes`` / ``in_chans`` the weights were saved with, where they differ from ``model``'s.

    Read from the layers the pretrained cfg names: the classifier's rows (no classifier keys: 0 classes) and the
    first convolution's input channels.
    """
    target = model.state_dict()
    args: dict[str, int] = {}
    heads = _layer_names(model.pretrained_cfg.get("classifier"))
    head_weights = [f"{head}.weight" for head in heads if f"{head}.weight" in target]
    if head_weights:
        weight = head_weights[0]
        if weight in filtered and filtered[weight].shape[0] != target[weight].shape[0]:
            args["num_classes"] = int(filtered[weight].shape[0])
        elif not any(key.startswith(tuple(f"{head}." for head in heads)) for key in filtered):
            args["num_classes"] = 0
    for conv in _layer_names(model.pretrained_cfg.get("first_conv")):
        weight = f"{conv}.weight"
        both = weight in filtered and weight in target and filtered[weight].ndim == target[weight].ndim == 4
        if both and filtered[weight].shape[1] != target[weight].shape[1]:
            args["in_chans"] = int(filtered[weight].shape[1])
    return args


# positional tables whose token count follows the input size (not ``scale``: (1, 1, C) too)
TABLE_NAMES = ("positional_encoding", "pos_embed", "absolute_pos_embed", "relative_position_bias_table")
_SIZEDTABLE_NAMES = ("positional_encoding", "pos_embed", "absolute_pos_embed")
# the smallest and largest square sizes tried for a checkpoint's training size
_SIZE_RANGE = (16, 8192)
_MAX_SIZE_CANDIDATES = 8


def is_table(key: str, names: tuple[str, ...] = TABLE_NAMES) -> bool:
    """Whether ``key`` names a table, in linvit's or the authors' layout (their PVT's ``pos_embed1`` ...)."""
    return re.sub(r"\d+$", "", key.rsplit(".", 1)[-1]) in names


def _resized_tables(state_dict: dict[str, Any], filtered: dict[str, Any]) -> int:
    """How many tables of ``filtered`` have a shape that no table of ``state_dict`` has: the ones a filter resized.

    Only tables count: a filter that fuses ``q``/``kv`` into ``qkv`` or splits a LePE convolution changes shapes
    without resizing anything."""
    source = {tuple(v.shape) for v in state_dict.values() if hasattr(v, "shape")}
    return sum(1 for k, v in filtered.items() if is_table(k) and tuple(v.shape) not in source)


def _fit(
    name: str, state_dict: dict[str, Any], creation: dict[str, Any], built: Any = None
) -> tuple[dict[str, Any], int, dict[str, int]]:
    """Filtered state dict for model ``name`` built with ``creation`` (on the meta device), how many tables its
    filter resized, and the ``num_classes`` / ``in_chans`` to create the model with when the weights have another
    classifier or stem.

    ``built``: the model already built with ``creation`` on the meta device, if at hand. Raises Misfit (a
    ValueError) when the weights do not fit the model exactly; a family filter's own ValueError (another stage
    structure) passes through.
    """
    import timm

    from linvit.io import describe_mismatch, state_dict_mismatch

    def fit(model_args: dict[str, int]) -> tuple[dict[str, Any], tuple[list, list, list]]:
        if model_args or built is None:
            model = timm.create_model(name, pretrained=False, device="meta", **creation, **model_args)
        else:
            model = built
        filter_fn = family_filter(model)
        filtered = filter_fn(dict(state_dict), model) if filter_fn is not None else dict(state_dict)
        return filtered, state_dict_mismatch(filtered, model.state_dict())

    filtered, mismatch = fit({})
    model_args: dict[str, int] = {}
    if any(mismatch):  # another class or channel count? then the rest must fit exactly
        model = built if built is not None else timm.create_model(name, pretrained=False, device="meta", **creation)
        guess = _class_and_channel_args(model, filtered)
        refit, remaining = fit(guess) if guess else (filtered, mismatch)
        if not any(remaining):
            filtered, mismatch, model_args = refit, remaining, guess
    if any(mismatch):
        raise Misfit(f"weights do not fit {name}: {describe_mismatch(*mismatch)}", sum(map(len, mismatch)))
    return filtered, _resized_tables(state_dict, filtered), model_args


# ------------------------------------------------------------------------------------ what the shapes determine
_REDUCTION_KEY = re.compile(r"^(?:block(\d+)\.|stages\.(\d+)\.blocks\.)\d+\.attn\.sr\.weight$")
_LINEAR_BRANCH_KEY = re.compile(
    r"^(?:stage(\d+)\.|stages\.(\d+)\.blocks\.)\d+\.attns\.(\d+)\.(?:focused\.)?positional_encoding$"
)


def _stage_of(match: re.Match) -> int:
    """0-based stage of an authors' (1-based ``block{s}`` / ``stage{s}``) or linvit (``stages.{i}``) key."""
    return int(match.group(1)) - 1 if match.group(1) is not None else int(match.group(2))


def reduction_options(model: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """PVT/PVTv2: ``la_sr_ratios`` (the s of each focused stage's s x s, stride-s ``attn.sr`` convolution) or
    ``linear=True`` (a 1x1 ``attn.sr``: PVTv2-Li's pooled reduction), read from the weights; {} for other families
    and for weights without a reduction (the defaults)."""
    ratios_now = getattr(model, "la_sr_ratios", None)
    if ratios_now is None:
        return {}
    ratios = [1] * len(ratios_now)
    linear = False
    for key, value in state_dict.items():
        match = _REDUCTION_KEY.match(key)
        focused = key.removesuffix("sr.weight") + "scale" in state_dict  # else PVT's softmax (S): sr_ratios
        if match and focused and getattr(value, "ndim", 0) == 4 and 0 <= _stage_of(match) < len(ratios):
            if value.shape[-1] == 1:
                linear = True
            else:
                ratios[_stage_of(match)] = int(value.shape[-1])
    if linear:
        return {"linear": True}  # the pooled form reduces every stage to 7x7 whatever its ratio
    if max(ratios) > 1:
        return {"la_sr_ratios": "".join(map(str, ratios)) if max(ratios) < 10 else ratios}
    return {}


_DWC_KEY = re.compile(r"(?:^|\.)dwc\.weight$")


def _dwc_kernels(state_dict: dict[str, Any]) -> set[int]:
    """The kernel sizes of the depthwise-convolution enhancements (``...dwc.weight``, (d, 1, k, k)) in the weights."""
    return {
        int(value.shape[-1])
        for key, value in state_dict.items()
        if _DWC_KEY.search(key) and getattr(value, "ndim", 0) == 4 and value.shape[-1] == value.shape[-2]
    }


def _takes_argument(model: Any, argument: str) -> bool:
    """Whether ``model``'s class (or a base it passes ``**kwargs`` to) takes the creation argument ``argument``."""
    import inspect

    return any(argument in inspect.signature(cls.__init__).parameters for cls in type(model).__mro__)


def dwc_options(model: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``dwc_kernel_size`` read from the shape of the weights' DWC convolutions (e.g. 3 for (d, 1, 3, 3)) where it
    differs from ``model``'s; {} when they agree, hold no DWC or several sizes, or the model takes no such option
    (a LinViT names its kernel per stage in ``attn_layers``)."""
    theirs, ours = _dwc_kernels(state_dict), _dwc_kernels(model.state_dict())
    if len(theirs) != 1 or len(ours) != 1 or theirs == ours or not _takes_argument(model, "dwc_kernel_size"):
        return {}
    return {"dwc_kernel_size": next(iter(theirs))}


def _stripe_options(model: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """CSwin: the ``la_split_size`` that gives ``model``'s linear stages the checkpoint's stripe branches at the
    model's ``img_size``, or {} (other families; no stage with two linear branches; no whole stripe width fits).

    A linear stage with two branches holds (map height x stripe) tables: the stripe is the table's positions over
    the map's height at ``img_size``. A linear stage with one branch has the map as its stripe. Stages where the
    width does not matter (softmax stages, the last stage) take half the previous one's, as the authors' configs.
    """
    if not hasattr(model, "la_split_size") or not hasattr(model, "stage_grids"):
        return {}
    branches: dict[int, set[int]] = {}
    positions: dict[int, int] = {}
    for key, value in state_dict.items():
        match = _LINEAR_BRANCH_KEY.match(key)
        if match and getattr(value, "ndim", 0) == 3:
            stage = int(match.group(1)) - 1 if match.group(1) is not None else int(match.group(2))
            branches.setdefault(stage, set()).add(int(match.group(3)))
            positions[stage] = int(value.shape[1])
    striped = {stage for stage, found in branches.items() if len(found) == 2}
    if not striped:
        return {}
    grids = model.stage_grids(model.img_size)
    splits: list[int | None] = []
    for stage, (height, width) in enumerate(grids):
        if stage in striped:
            split, remainder = divmod(positions[stage], height)
            if remainder or not 0 < split < min(height, width):
                return {}
            splits.append(split)
        elif stage in branches and stage < len(grids) - 1:
            splits.append(height)  # one branch: the stripe is the map
        else:
            splits.append(None)
    for stage, split in enumerate(splits):
        if split is None:
            previous = splits[stage - 1] if stage > 0 else None
            splits[stage] = max(previous // 2, 1) if previous else max(grids[stage][0], 1)
    return {"la_split_size": "-".join(str(split) for split in splits)}


def _size_candidates(default: int, source_tokens: set[int], model_tokens: set[int]) -> list[int]:
    """Square input sizes at which the model's tables (``model_tokens`` positions at ``default``) may have the
    checkpoint's (``source_tokens``): the default scaled by the ratio of the grids' sides (square tables, with or
    without a class token) or of the positions (stripe tables, one side of which follows the size); the sizes that
    most table pairs agree on first, then the smaller."""
    import math
    from collections import Counter

    votes: Counter[int] = Counter()
    for theirs in source_tokens:
        for ours in model_tokens:
            for a, b in ((theirs, ours), (theirs - 1, ours - 1)):
                side, side0 = (math.isqrt(a), math.isqrt(b)) if a > 0 and b > 0 else (0, 0)
                if side and side * side == a and side0 * side0 == b and default * side % side0 == 0:
                    votes[default * side // side0] += 1
            if default * theirs % ours == 0:
                votes[default * theirs // ours] += 1
    sizes = [size for size in votes if size != default and _SIZE_RANGE[0] <= size <= _SIZE_RANGE[1]]
    return sorted(sizes, key=lambda size: (-votes[size], size))[:_MAX_SIZE_CANDIDATES]


def _table_tokens(state: dict[str, Any]) -> set[int]:
    return {
        int(v.shape[1])
        for k, v in state.items()
        if is_table(k, _SIZEDTABLE_NAMES) and getattr(v, "ndim", 0) == 3 and v.shape[0] == 1
    }


ADVICE_ROUNDS = 4  # a filter's advice names every option it sees differ; a few rounds settle what follows from them


def infer_creation(
    name: str, state_dict: dict[str, Any], creation: dict[str, Any] | None = None
) -> tuple[dict[str, Any], int, dict[str, Any], list[str]]:
    """The weights for model ``name`` and the creation arguments that keep everything in them.

    ``creation`` (the user's ``img_size`` and ``--model-kwargs``) is kept as given. To it are added the options the
    weights' shapes determine (``la_sr_ratios`` / ``linear`` / ``la_split_size``, and what a family filter's
    `CreationOptionsError` names: the attention per stage ``attn_layers``, PVT's ``sr_ratios``, Swin's ``ape``)
    and, without a given ``img_size``,
    the training size: the default first, then the square sizes the tables suggest (`_size_candidates`), until one
    fits every table as it is. When none does, the tables are resized to the default size (the count says so).

    Returns (filtered state dict, how many tables were resized, every creation argument, the names of those that
    were inferred). Raises Misfit when the weights do not fit the model, or a family filter's ValueError when no
    size or option makes the structures agree.
    """
    import timm

    from linvit.models._family import CreationOptionsError

    given = dict(creation or {})
    default = timm.create_model(name, pretrained=False, device="meta", **given)
    shaped = {**reduction_options(default, state_dict), **dwc_options(default, state_dict)}
    options = {key: value for key, value in shaped.items() if key not in given}
    base = {**given, **options}
    if options:
        default = timm.create_model(name, pretrained=False, device="meta", **base)

    def attempt(args: dict[str, Any], model: Any) -> tuple[dict[str, Any], int, dict[str, Any], list[str]]:
        for _ in range(ADVICE_ROUNDS):
            stripes = {} if "la_split_size" in given else _stripe_options(model, state_dict)
            args = {**args, **stripes}
            try:
                filtered, resized, extra = _fit(name, state_dict, args, None if stripes else model)
            except CreationOptionsError as error:  # built with other options (attn_layers, ape, ...): follow it
                advice = {key: value for key, value in error.options.items() if key not in given}
                if not advice or all(args.get(key) == value for key, value in advice.items()):
                    raise
                args = {**args, **advice}
                model = timm.create_model(name, pretrained=False, device="meta", **args)
                continue
            inferred = [key for key in args if key not in given] + list(extra)
            return filtered, resized, {**args, **extra}, inferred
        raise ValueError(f"the weights' options for {name} could not be settled in {ADVICE_ROUNDS} rounds: {args}")

    fallback, failure = None, None
    try:
        fallback = attempt(base, default)
    except Misfit:
        raise  # widths, depths or blocks differ: no size or option changes that
    except ValueError as error:  # a filter's structure error (stripe branches at this size): try other sizes
        failure = error
    sized = getattr(default, "img_size", None)  # models without one take any size with the same tables
    if "img_size" in given or sized is None or (fallback is not None and fallback[1] == 0):
        if fallback is None:
            raise failure  # type: ignore[misc]
        return fallback
    size = int(sized[0]) if isinstance(sized, (tuple, list)) else int(sized)
    for candidate in _size_candidates(size, _table_tokens(state_dict), _table_tokens(default.state_dict())):
        args = {**base, "img_size": candidate}
        try:
            result = attempt(args, timm.create_model(name, pretrained=False, device="meta", **args))
        except ValueError:  # Misfit too: this size does not fit
            continue
        if result[1] == 0:
            return result
    if fallback is None:

        def sized(img_size: list[int]) -> tuple[dict[str, Any], int, dict[str, Any], list[str]]:
            args = {**base, "img_size": img_size}
            return attempt(args, timm.create_model(name, pretrained=False, device="meta", **args))

        _refuse_non_square(name, state_dict, default, size, sized)
        raise failure  # type: ignore[misc]
    return fallback


_MAX_ASPECT = 4  # the longest side over the shortest of the non-square training sizes tried


def _non_square_candidates(default: int, source_tokens: set[int], model_tokens: set[int]) -> list[tuple[int, int]]:
    """(H, W) input sizes, H < W, at which the model's square tables (``model_tokens`` positions at the square
    ``default``) have the checkpoint's non-square ones (``source_tokens``, with or without a class token): each
    factorisation of a table's positions into rows x columns, scaled as the model's grid; those most table pairs
    agree on first, then the squarer, then the smaller."""
    import math
    from collections import Counter

    votes: Counter[tuple[int, int]] = Counter()
    for theirs in source_tokens:
        for ours in model_tokens:
            for positions, square in ((theirs, ours), (theirs - 1, ours - 1)):
                side = math.isqrt(square) if square > 0 else 0
                if positions <= 0 or side * side != square or math.isqrt(positions) ** 2 == positions:
                    continue
                for rows in range(1, math.isqrt(positions) + 1):
                    columns, remainder = divmod(positions, rows)
                    scalable = (default * rows) % side == 0 and (default * columns) % side == 0
                    if remainder or columns > _MAX_ASPECT * rows or not scalable:
                        continue
                    height, width = default * rows // side, default * columns // side
                    if _SIZE_RANGE[0] <= height and width <= _SIZE_RANGE[1]:
                        votes[(height, width)] += 1
    return sorted(votes, key=lambda hw: (-votes[hw], hw[1] / hw[0], hw))[:_MAX_SIZE_CANDIDATES]


def _refuse_non_square(name: str, state_dict: dict[str, Any], default: Any, size: int, attempt) -> None:
    """MissingOption when the weights' tables are no square grids (the checkpoint was trained at a non-square size,
    which ``--img-size H W`` names), with a size that fits every table as it is where one is found; nothing when
    every table is square."""
    tokens = _table_tokens(state_dict)
    odd = sorted(t for t in tokens if not (_is_square(t) or _is_square(t - 1)))
    if not odd or not _fits_apart_from_tables(state_dict, default):
        return
    sizes = []
    for height, width in _non_square_candidates(size, tokens, _table_tokens(default.state_dict())):
        try:
            result = attempt([height, width])
        except ValueError:  # Misfit too: this size does not fit
            continue
        if result[1] == 0:
            sizes.append((height, width))
    raise MissingOption(name, odd[0], sizes)


def _fits_apart_from_tables(state_dict: dict[str, Any], model: Any) -> bool:
    """Whether the weights without their positional tables map onto ``model`` exactly, tables aside: a cheap test
    before sizes are searched (another architecture fits at no size)."""
    from linvit.io import state_dict_mismatch

    filter_fn = family_filter(model)
    weights = {key: value for key, value in state_dict.items() if not is_table(key)}
    try:
        mapped = filter_fn(weights, model) if filter_fn is not None else weights
    except ValueError:
        return False
    target = {key: value for key, value in model.state_dict().items() if not is_table(key)}
    return not any(state_dict_mismatch({k: v for k, v in mapped.items() if not is_table(k)}, target))


def _is_square(number: int) -> bool:
    import math

    return number > 0 and math.isqrt(number) ** 2 == number
