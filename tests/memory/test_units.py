"""Memory sizes in and out: "80GiB" -> bytes -> "80.0 GiB"."""

import pytest

from linvit.memory.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [("80GiB", 80 * 2**30), ("16 GB", 16 * 10**9), ("512MiB", 512 * 2**20), ("1.5gib", 3 * 2**29), ("100B", 100)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["80", "80 gigs", "GiB", "-1GiB", "0MiB", ""])
def test_parse_bytes_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="e.g. 80GiB"):
        parse_bytes(text)


def test_format_bytes():
    assert format_bytes(500) == "500 B"
    assert format_bytes(int(12.34 * 2**20)) == "12.3 MiB"
    assert format_bytes(80 * 2**30) == "80.0 GiB"
    assert format_bytes(3 * 2**40) == "3.0 TiB"
