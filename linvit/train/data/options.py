"""Checks of the data options that a config or a command line hands over as numbers of any type.

``int(1.5)`` is 1 and ``int(True)`` is 1: a loader built on such values trains, silently, with something else than
what was asked for. These refuse what cannot have been meant, and cap what the machine cannot give.
"""

from __future__ import annotations

import logging
import math
import numbers
import os

_log = logging.getLogger(__name__)


def whole_number(value: object, name: str, minimum: int) -> int:
    """``value`` as an int when it is a whole number ``>= minimum`` (``8`` or ``8.0``), else a ValueError naming it.

    ``name`` is the option as the user writes it (``data.batch_size``).
    """
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if real and float(value).is_integer() and int(value) >= minimum:
        return int(value)
    kind = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
    if real and math.isfinite(value) and value > minimum:  # a fraction: name the two whole numbers around it
        fix = f"{name}={math.floor(value)} or {name}={math.ceil(value)}"
    else:
        fix = f"{name}={minimum} or more"
    raise ValueError(f"{name} must be {kind}, got {value!r}: set {fix}.")


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. under taskset or a scheduler), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


AUTO = "auto"
MAX_AUTO_WORKERS = 8


def capped_workers(value: object, name: str = "data.num_workers") -> int:
    """``value`` data-loader workers, at most one per available core (more only compete, and each holds memory).

    ``"auto"``: one per available core, up to 8.
    """
    if value == AUTO:
        return min(MAX_AUTO_WORKERS, available_cores())
    requested = whole_number(value, name, minimum=0)
    cores = available_cores()
    if requested > cores:
        _log.warning(
            "%s=%d but this process can use %d CPU core(s): using %d workers (each worker is a process holding its "
            "own copy of the dataset; more than the cores only cost memory).",
            name,
            requested,
            cores,
            cores,
        )
        return cores
    return requested


def fraction(value: object, name: str) -> float:
    """``value`` as a float strictly between 0 and 1 (a share of the data), else a ValueError naming it as given."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (real and 0.0 < float(value) < 1.0):
        raise ValueError(f"{name}={value!r} is not a share of the data: give a number between 0 and 1 (e.g. 0.1).")
    return float(value)
