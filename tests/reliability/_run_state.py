"""What a finished run leaves in its directory, and a comparison of two runs that names every difference.

A resumed run must leave what the uninterrupted run leaves: the same ``last.ckpt`` and ``best.ckpt`` (weights, EMA,
optimizer, schedule, loop counters, callback states), the same exported weights, ``metrics.csv`` row for row and
the same final metrics. Paths inside checkpoints name the run's own directory; they are compared relative to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def run_state(run_dir: Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    state: dict[str, Any] = {}
    for name in ("last.ckpt", "best.ckpt"):
        checkpoint = torch.load(run_dir / "checkpoints" / name, map_location="cpu", weights_only=True)
        state[name] = _relative(checkpoint, str(run_dir))
    exported = run_dir / "model.safetensors"
    if exported.is_file():
        from safetensors.torch import load_file

        state["model.safetensors"] = load_file(exported)
    csv = run_dir / "metrics.csv"
    state["metrics.csv"] = csv.read_text().splitlines() if csv.is_file() else None
    metrics = json.loads((run_dir / "metrics.json").read_text())
    state["metrics.json"] = {key: value for key, value in metrics.items() if not key.startswith("time/")}
    return state


def differences(expected: Any, got: Any, where: str = "") -> list[str]:
    """Every place where ``got`` differs from ``expected`` (tensors: bit for bit), as readable lines."""
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        same = (
            isinstance(expected, torch.Tensor)
            and isinstance(got, torch.Tensor)
            and expected.shape == got.shape
            and expected.dtype == got.dtype
            and torch.equal(expected, got)
        )
        return [] if same else [f"{where}: tensors differ"]
    if isinstance(expected, dict) and isinstance(got, dict):
        found = [f"{where}.{key}: missing" for key in expected if key not in got]
        found += [f"{where}.{key}: unexpected" for key in got if key not in expected]
        for key in expected:
            if key in got:
                found += differences(expected[key], got[key], f"{where}.{key}")
        return found
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(expected) != len(got):
            return [f"{where}: {len(got)} items instead of {len(expected)}"]
        return [line for i, (a, b) in enumerate(zip(expected, got)) for line in differences(a, b, f"{where}[{i}]")]
    return [] if expected == got else [f"{where}: {got!r} instead of {expected!r}"]


def assert_same_run(expected: dict[str, Any], got: dict[str, Any], what: str) -> None:
    found = differences(expected, got)
    assert not found, f"{what} differs from the uninterrupted run:\n" + "\n".join(_summarise(found))


def _summarise(found: list[str], limit: int = 20) -> list[str]:
    """One line per checkpoint section for differing tensors (a model has hundreds), then the other lines."""
    tensors: dict[str, list[str]] = {}
    others = []
    for line in found:
        if line.endswith(": tensors differ") and ".state_dict." in line:
            section, name = line[: -len(": tensors differ")].split(".state_dict.", 1)
            tensors.setdefault(f"{section}.state_dict", []).append(name)
        else:
            others.append(line)
    lines = [f"{where}: {len(names)} tensors differ ({', '.join(names[:3])} ...)" for where, names in tensors.items()]
    lines += others[:limit] + ([f"... and {len(others) - limit} more"] if len(others) > limit else [])
    return lines


def _relative(value: Any, run_dir: str) -> Any:
    if isinstance(value, str):
        return value.replace(run_dir, "<run>")
    if isinstance(value, dict):
        return {_relative(key, run_dir): _relative(item, run_dir) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_relative(item, run_dir) for item in value)
    return value
