"""Small utilities shared across linvit (no model or training logic)."""

from linvit.utils.macs import count_macs, count_params, macs_counter

__all__ = ["count_macs", "count_params", "macs_counter"]
