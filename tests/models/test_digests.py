"""Checkpoint keys, their order and shapes, and the seeded initial weights of every family.

A refactoring of the model code must not change what a model *is*: the state-dict keys (and their order, which
conversion scripts and `strict` loading reports follow), the shapes, and the weights that `torch.manual_seed(0)`
gives (the order in which modules draw from the generator).

- Keys, order, shapes and dtypes are exact on any machine, so they are hashed and compared with the digests recorded
  before the shared backbone frame (issue 13) replaced the per-family plumbing: every registered model at full size
  on the meta device (no memory, no time), and small variants of each family (the same code paths, with every
  attention kind and stage layout).
- Seeded weights are *not* bit-identical across CPUs (issue 22): the initialisers go through ``erfinv``, ``log`` and
  ``cos``, which MKL and ATen compute with code chosen by the CPU's vendor and instruction set. So each tensor is
  compared value by value with figures recorded in ``seeded_weights.json``: its element count, sum, sum of squares
  and the values at four fixed positions (first, a third, two thirds, last), within ``RTOL`` of the tensor's scale.

Why ``RTOL = 1e-5``: measured on an Intel Xeon (AVX-512) against the figures recorded from the AMD-identical values,
with ``MKL_ENABLE_INSTRUCTIONS`` = SSE4_2 / AVX2 / AVX512 and ``ATEN_CPU_CAPABILITY`` = default / avx2 (the
portability test below runs these), no element of any seeded tensor moved by more than 2.2e-6 of
``max(|value|, rms)`` (ATen's scalar ``normal_``; MKL's paths: 1.4e-7), no sum by more than 6.1e-8 of the sum of
|values|, no sum of squares by more than 7.7e-8 of itself: at most 0.13 of the tolerance is used (``--check``). A
real change of identity moves them by far more (``test_a_change_of_identity_is_caught``): two linear layers drawing
in swapped order use 1e5 times the tolerance, one extra draw before the model 3e4 times on every drawn tensor, one
weight scaled by 1.0001 20 times (its sum of squares).

The weights depend on PyTorch's CPU generator and initialisers, which a PyTorch upgrade may change. If only the weight
figures fail after an upgrade, re-record them at the same commit (run this file as a script:
``python tests/models/test_digests.py`` rewrites seeded_weights.json and prints the digest tables for this file),
after checking with the old PyTorch that the old figures still hold. ``python tests/models/test_digests.py --check``
prints the share of the tolerance each case uses and exits with 1 if any exceeds it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

import linvit.models  # noqa: F401  (registers the families)

RECORDED = Path(__file__).with_name("seeded_weights.json")
RTOL = 1e-5  # of each figure's scale; see the module docstring for the measurement behind it
ATOL = 1e-12  # floor for all-zero tensors (biases), whose figures are exactly 0

# Small variants: the same layouts as the registered models, a fraction of the size.
SEEDED_CASES: dict[str, tuple[str, dict]] = {
    "linvit_nano": ("linvit_nano", {}),
    "linvit_nano_mixed": ("linvit_nano", {"attn_layers": ("linear", "hybrid", "softmax", "window")}),
    "linvit_nano_kernels": ("linvit_nano", {"attn_layers": ("favor", "elu", "taylor", "focused")}),
    "flatten_swin": (
        "flatten_swin_tiny_patch4_224",
        {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 2, 4), "num_classes": 10},
    ),
    "flatten_swin_mixed": (
        "flatten_swin_tiny_patch4_224",
        {
            "img_size": 96,
            "embed_dim": 16,
            "depths": (1, 2, 2, 1),
            "num_heads": (1, 2, 2, 2),
            "attn_layers": ("window", "focused", "window", "focused"),
        },
    ),
    "flatten_deit": ("flatten_deit_tiny_patch16_224", {"depth": 2, "num_classes": 10}),
    "flatten_deit_abs_pos": ("flatten_deit_tiny_patch16_224", {"depth": 2, "abs_pos_embed": True, "img_size": 96}),
    "flatten_pvt": (
        "flatten_pvt_tiny",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 1, 2, 1), "num_classes": 10},
    ),
    "flatten_pvt_v2": (
        "flatten_pvt_v2_b0",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 2, 1, 1), "num_classes": 10},
    ),
    "flatten_cswin": (
        "flatten_cswin_tiny_224",
        {"img_size": 64, "embed_dim": 16, "depths": (1, 2, 2, 1), "num_heads": (2, 2, 4, 4), "num_classes": 10},
    ),
    # options of issue 14: reduced keys (PVT), pooled keys (PVTv2-Li), stripe linear attention (CSwin)
    "flatten_pvt_reduced": (
        "flatten_pvt_tiny",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 1, 2, 1), "la_sr_ratios": "8421"},
    ),
    "flatten_pvt_v2_linear": (
        "flatten_pvt_v2_b0",
        {"img_size": 64, "embed_dims": (16, 32, 40, 64), "depths": (1, 2, 1, 1), "linear": True},
    ),
    "flatten_cswin_striped": (
        "flatten_cswin_tiny_224",
        {
            "img_size": 64,
            "embed_dim": 16,
            "depths": (1, 2, 2, 1),
            "num_heads": (2, 2, 4, 4),
            "la_split_size": "8-4-2-1",
        },
    ),
}

# Recorded at commit 44bfde3 (before the shared frame); the last three when issue 14 added the options: the keys, their
# order, shapes and dtypes of each seeded case (the weights are in seeded_weights.json).
SEEDED_KEYS_DIGESTS: dict[str, str] = {
    "flatten_cswin": "42d467311bc73d63",
    "flatten_deit": "563058ecb367a0ba",
    "flatten_deit_abs_pos": "eac06e6bd7cca980",
    "flatten_pvt": "3718fa98de7ac000",
    "flatten_pvt_v2": "997f8c566506094c",
    "flatten_swin": "24756c72c120c3f8",
    "flatten_swin_mixed": "d6de53a2edf71f35",
    "linvit_nano": "f8ec941743ebf3f2",
    "linvit_nano_kernels": "fbb5e99439195298",
    "linvit_nano_mixed": "93a4215f3fc1a9a2",
    # issue 14
    "flatten_cswin_striped": "4d6643d22dc9d949",
    "flatten_pvt_reduced": "babc3e4591940cbc",
    "flatten_pvt_v2_linear": "52ebad66ada9870b",
}

# Recorded at commit 44bfde3: keys, order and shapes of every registered model at its full size.
REGISTERED_DIGESTS: dict[str, str] = {
    "flatten_cswin_base_224": "b1fbaa463be75786",
    "flatten_cswin_base_384": "b61b3c7040761485",
    "flatten_cswin_small_224": "b102e3d6ebe46836",
    "flatten_cswin_tiny_224": "8bc82fbff3251afb",
    "flatten_deit_small_patch16_224": "ccc1ba28a07e036c",
    "flatten_deit_tiny_patch16_224": "bacc67b50a76cbb1",
    "flatten_pvt_large": "995ae45c6261921c",
    "flatten_pvt_medium": "b693a0dffb3df83a",
    "flatten_pvt_small": "a62ee546fe9b1433",
    "flatten_pvt_tiny": "b2b017509bbe6849",
    "flatten_pvt_v2_b0": "756e340c957cd69e",
    "flatten_pvt_v2_b1": "8a691331dfa5e4c0",
    "flatten_pvt_v2_b2": "9afdf802aa2d321d",
    "flatten_pvt_v2_b3": "209f68947160402b",
    "flatten_pvt_v2_b4": "30f602ee53260a1f",
    "flatten_pvt_v2_b5": "c6bdddaca2185b84",  # issue 14
    "flatten_swin_base_patch4_224": "a6423dd595de44b9",
    "flatten_swin_base_patch4_384": "892e549a30fe6315",
    "flatten_swin_small_patch4_224": "3538d79a09eec253",
    "flatten_swin_tiny_patch4_224": "148c1aaf79ace29b",
    "linvit_base": "e6256864bf9b8318",
    "linvit_nano": "f8ec941743ebf3f2",
    "linvit_small": "a61073706cfee0f8",
    "linvit_tiny": "85cb0b6ef304fecc",
}


# The instruction sets CI and test_seeded_weights_hold_on_other_instruction_sets restrict MKL and ATen to: MKL picks
# its vector-math code by CPU vendor and instruction set (AMD machines take the SSE4.2 path), ATen its kernels by
# instruction set. Each can only lower what the CPU has; on other CPUs (ARM) they are ignored.
INSTRUCTION_SETS: dict[str, dict[str, str]] = {
    "mkl_sse4_2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl_avx512": {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
}


def keys_digest(model: torch.nn.Module) -> str:
    """sha256 of the state dict's keys in order, with each tensor's shape and dtype."""
    lines = [f"{key}:{tuple(value.shape)}:{value.dtype}" for key, value in model.state_dict().items()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def weight_figures(model: torch.nn.Module) -> dict[str, list[float]]:
    """Per state-dict tensor: element count, sum, sum of squares, and the values at flat positions 0, n//3, 2n//3
    and n-1 (all in float64)."""
    figures = {}
    for key, value in model.state_dict().items():
        flat = value.detach().cpu().double().flatten()
        n = flat.numel()
        samples = [flat[i].item() for i in (0, n // 3, 2 * n // 3, n - 1)] if n else []
        figures[key] = [float(n), flat.sum().item(), flat.square().sum().item(), *samples]
    return figures


def tolerance_used(figures: list[float], recorded: list[float]) -> float:
    """The largest share of the tolerance any figure of one tensor uses (above 1: changed).

    Scales: the sum's is ``sqrt(n * sum of squares)`` (n times the rms, at least the sum of |values|), the sum of
    squares' itself, each value's ``max(|value|, rms)``; the tolerance is ``RTOL`` of the scale plus ``ATOL``."""
    if len(figures) != len(recorded) or figures[0] != recorded[0]:
        return math.inf
    n, total, squares, *samples = recorded
    rms = math.sqrt(squares / n) if n else 0.0
    pairs = [(figures[1], total, math.sqrt(n * squares)), (figures[2], squares, squares)]
    pairs += [(got, want, max(abs(want), rms)) for got, want in zip(figures[3:], samples)]
    return max((abs(got - want) / (RTOL * scale + ATOL) for got, want, scale in pairs), default=0.0)


def changed_weights(model: torch.nn.Module, recorded: dict[str, list[float]]) -> dict[str, float]:
    """The tensors whose figures differ from the recorded ones by more than the tolerance, with the share used."""
    figures = weight_figures(model)
    used = {key: tolerance_used(figures[key], recorded[key]) for key in figures.keys() & recorded.keys()}
    used.update(dict.fromkeys(figures.keys() ^ recorded.keys(), math.inf))
    return {key: share for key, share in used.items() if share > 1}


def recorded_figures() -> dict[str, dict[str, list[float]]]:
    return json.loads(RECORDED.read_text())["cases"]


def seeded_model(case: str) -> torch.nn.Module:
    name, kwargs = SEEDED_CASES[case]
    torch.manual_seed(0)
    return timm.create_model(name, **kwargs)


def registered_model(name: str) -> torch.nn.Module:
    return timm.create_model(name, device="meta")


def _report(case: str, changed: dict[str, float]) -> str:
    worst = sorted(changed.items(), key=lambda item: -item[1])[:5]
    listed = ", ".join(f"{key} ({share:.3g}x the tolerance)" for key, share in worst)
    return f"{case}: the seeded initial weights of {len(changed)} tensors changed: {listed}"


@pytest.mark.parametrize("case", sorted(SEEDED_CASES))
def test_seeded_weights_and_keys_unchanged(case):
    model = seeded_model(case)
    assert keys_digest(model) == SEEDED_KEYS_DIGESTS[case], (
        f"{case}: the state-dict keys, their order or shapes changed"
    )
    changed = changed_weights(model, recorded_figures()[case])
    assert not changed, _report(case, changed)


def _first_two_linear_layers_swapped(init):
    """``init`` (a model's ``init_linear_weights``, as ``model.apply`` calls it), except that the first two linear
    layers it meets draw their weights in swapped order."""
    held: list[torch.nn.Module] = []

    def swapped(module, **kwargs):
        if not isinstance(module, torch.nn.Linear) or len(held) == 2:
            return init(module, **kwargs)
        held.append(module)  # the first waits for the second
        if len(held) == 2:
            init(held[1], **kwargs)
            init(held[0], **kwargs)

    swapped.held = held
    return swapped


@pytest.mark.parametrize("change", ["two_modules_draw_in_swapped_order", "one_draw_more_first", "one_tensor_scaled"])
def test_a_change_of_identity_is_caught(change, monkeypatch):
    """The comparison is tolerant of floating-point paths, not of a change in what the model is: linvit_nano with
    its first two linear layers initialised in swapped order fails on exactly those two tensors (the generator is
    where it was after both, so every later tensor still matches); one extra draw before the model fails on every
    drawn tensor; one weight scaled by 1.0001 fails on that weight alone."""
    recorded = recorded_figures()["linvit_nano"]
    if change == "two_modules_draw_in_swapped_order":
        import linvit.models.linvit as family

        swapped = _first_two_linear_layers_swapped(family.init_linear_weights)
        monkeypatch.setattr(family, "init_linear_weights", swapped)
        model = seeded_model("linvit_nano")
        names = {id(module): name for name, module in model.named_modules()}
        expected = {f"{names[id(module)]}.weight" for module in swapped.held}
        assert len(expected) == 2
    elif change == "one_draw_more_first":
        name, kwargs = SEEDED_CASES["linvit_nano"]
        torch.manual_seed(0)
        torch.rand(1)  # a module drawing before the model
        model = timm.create_model(name, **kwargs)
        expected = {key for key, p in model.named_parameters() if p.std() > 0}  # all but the constants
    else:
        model = seeded_model("linvit_nano")
        key = "stages.1.blocks.0.mlp.fc1.weight"
        with torch.no_grad():
            model.get_parameter(key).mul_(1.0001)
        expected = {key}
    assert keys_digest(model) == SEEDED_KEYS_DIGESTS["linvit_nano"]
    assert set(changed_weights(model, recorded)) == expected


@pytest.mark.slow  # CI's default run repeats this whole file under the same restrictions (.ci/run)
@pytest.mark.parametrize("restriction", sorted(INSTRUCTION_SETS))
def test_seeded_weights_hold_on_other_instruction_sets(restriction):
    """What a machine with another CPU draws: MKL and ATen restricted to other instruction sets, in a fresh process
    (both read these variables once, at load). About 5 s each on 2 idle cores."""
    env = dict(os.environ, **INSTRUCTION_SETS[restriction])
    done = subprocess.run([sys.executable, __file__, "--check"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{restriction}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("name", sorted(timm.list_models(["linvit_*", "flatten_*"])))
def test_registered_keys_unchanged(name):
    assert name in REGISTERED_DIGESTS, f"{name} is a new model: record its digest (python {__file__})"
    assert keys_digest(registered_model(name)) == REGISTERED_DIGESTS[name], f"{name}: keys, order or shapes changed"


def _check() -> int:
    """Prints each case's largest share of the tolerance used; 1 if any tensor changed."""
    recorded = recorded_figures()
    worst_case = 0.0
    for case in sorted(SEEDED_CASES):
        model = seeded_model(case)
        figures = weight_figures(model)
        used = {key: tolerance_used(figures[key], recorded[case].get(key, [])) for key in figures}
        key, share = max(used.items(), key=lambda item: item[1])
        keys_ok = keys_digest(model) == SEEDED_KEYS_DIGESTS[case]
        print(f"{case:24s} keys {'ok' if keys_ok else 'CHANGED'}  tolerance used {share:.3g} ({key})")
        worst_case = max(worst_case, share if keys_ok else math.inf)
    print(f"largest share of the tolerance used: {worst_case:.3g}")
    return 0 if worst_case <= 1 else 1


def _record() -> None:
    """Rewrites seeded_weights.json and prints the digest tables above for the current code."""
    cases = {case: weight_figures(seeded_model(case)) for case in sorted(SEEDED_CASES)}
    header = {
        "figures": "per tensor: n, sum, sum of squares, values at flat positions 0, n//3, 2n//3, n-1",
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "environment": {
            name: os.environ.get(name) for name in ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ATEN_CPU_CAPABILITY")
        },
    }
    lines = ["{", *(f"  {json.dumps(name)}: {json.dumps(value)}," for name, value in header.items()), '  "cases": {']
    for i, (case, figures) in enumerate(cases.items()):
        lines.append(f"    {json.dumps(case)}: {{")
        for j, (key, values) in enumerate(figures.items()):
            numbers = ", ".join(repr(float(f"{value:.10g}")) for value in values)
            lines.append(f"      {json.dumps(key)}: [{numbers}]" + ("," if j < len(figures) - 1 else ""))
        lines.append("    }" + ("," if i < len(cases) - 1 else ""))
    lines += ["  }", "}"]
    RECORDED.write_text("\n".join(lines) + "\n")
    print(f"wrote {RECORDED}")
    print("SEEDED_KEYS_DIGESTS = {")
    for case in sorted(SEEDED_CASES):
        print(f"    {case!r}: {keys_digest(seeded_model(case))!r},")
    print("}")
    print("REGISTERED_DIGESTS = {")
    for name in sorted(timm.list_models(["linvit_*", "flatten_*"])):
        print(f"    {name!r}: {keys_digest(registered_model(name))!r},")
    print("}")


if __name__ == "__main__":  # `--check`: compare with the recorded figures; no argument: re-record them
    if sys.argv[1:] == ["--check"]:
        sys.exit(_check())
    _record()
