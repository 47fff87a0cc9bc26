"""Construction-time checks shared by the attention modules."""

__all__ = ["check_heads", "to_pair"]


def to_pair(size, name: str) -> tuple[int, int]:
    """An int or an (h, w) pair as a tuple of two positive ints (construction-time helper)."""
    if isinstance(size, int):
        pair = (size, size)
    else:
        pair = tuple(int(s) for s in size)
    if len(pair) != 2 or pair[0] < 1 or pair[1] < 1:
        raise ValueError(f"{name} must be a positive int or a pair (h, w) of positive ints, got {size!r}.")
    return pair[0], pair[1]


def check_heads(dim: int, num_heads: int) -> int:
    """The head width dim // num_heads (construction-time check); ValueError when num_heads does not divide dim."""
    if num_heads < 1 or dim % num_heads != 0:
        raise ValueError(
            f"dim={dim} is not divisible by num_heads={num_heads}; choose num_heads that divides dim "
            f"(e.g. {dim // 32 or 1} heads of 32 channels)."
        )
    return dim // num_heads
