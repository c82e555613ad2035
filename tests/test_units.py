import pytest

from mpplan.units import dtype_bytes, format_size, parse_size


@pytest.mark.parametrize(
    "text, expected",
    [("16GiB", 16 * 2**30), ("512MB", 512 * 10**6), ("64", 64), (64, 64), ("1.5KiB", 1536), ("2g", 2 * 2**30),
     ("3 kb", 3000)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1GB", "12XB", "", True, None, -3, "GiB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_format_and_dtypes():
    assert format_size(3 * 2**20) == "3.00 MiB" and format_size(12) == "12 B"
    assert dtype_bytes("torch.bfloat16") == 2 and dtype_bytes("float32") == 4
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("float13")
