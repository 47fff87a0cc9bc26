"""Memory sizes as people write them ("80GiB", "16 GB", "512MiB") and as the reports print them."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``"80GiB"`` -> 85899345920. Units: B, kB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024)."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"Memory size {text!r} is not a number with a unit; write e.g. 80GiB, 16GB or 512MiB "
            "(KiB/MiB/GiB/TiB are powers of 1024, kB/MB/GB/TB powers of 1000)."
        )
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"Memory size {text!r} must be positive, e.g. 80GiB.")
    return int(value)


def format_bytes(count: int) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1, one decimal: "1.5 GiB", "12.3 MiB"."""
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(count)} B" if unit == "B" else f"{value:.1f} {unit}"
