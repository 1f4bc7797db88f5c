"""Hostile image bytes: every input decodes or fails with ImageError, never anything else.

A fixed-seed mutation fuzz over seven formats, and the decompression bombs the
adversarial test found (headers that declare tens of gigapixels in a few bytes).
"""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from rm_qdrant.errors import ImageError
from rm_qdrant.models.images import pixels

FORMATS = {
    "PNG": {},
    "JPEG": {"quality": 80},
    "BMP": {},
    "GIF": {},
    "TIFF": {},
    "WEBP": {},
    "TGA": {},
    "AVIF": {},
}
MUTATIONS = 4_000


def encoded(fmt: str, options: dict) -> bytes:
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 255, size=(12, 10, 3), dtype=np.uint8))
    out = io.BytesIO()
    (picture.convert("P") if fmt == "GIF" else picture).save(out, fmt, **options)
    return out.getvalue()


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind, at = rng.random(), rng.randrange(len(buf))
        if kind < 0.4:
            buf[at] = rng.randrange(256)
        elif kind < 0.6:  # a large value where the header keeps sizes and counts
            buf[at : at + 4] = struct.pack(rng.choice(["<I", ">I"]), rng.choice([0, 2**31 - 1, 65500, 50000]))
        elif kind < 0.8:
            del buf[at : at + rng.randint(1, 16)]
        else:
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(buf[: rng.randint(1, len(buf))] if rng.random() < 0.2 else buf)


def decode(data: bytes) -> None:
    try:
        out = pixels(data, height=8, width=8, channels=3)
    except ImageError:
        return
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8


def test_mutated_images_decode_or_fail_with_image_error():
    rng = random.Random(1234)
    seeds = {fmt: encoded(fmt, options) for fmt, options in FORMATS.items()}
    for i in range(MUTATIONS):
        fmt = list(seeds)[i % len(seeds)]
        decode(mutate(seeds[fmt], rng))


def png_declaring(width: int, height: int, body: bytes = b"") -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("JPEG", {"quality": 80}))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        png_declaring(50_000, 50_000),
        jpeg_declaring(65_500, 65_500),
        png_declaring(10_000, 10_000, zlib.compress(b"\x00" * 30_001 * 10_000, 9)),  # 100 MP in ~290 KB
    ],
    ids=["png-50000x50000", "jpeg-65500x65500", "png-100-megapixels"],
)
def test_decompression_bombs_are_refused_before_decoding(data):
    with pytest.raises(ImageError, match=r"pixel|decompression bomb"):
        pixels(data, height=8, width=8, channels=3)


def test_the_pixel_limit_is_a_setting():
    data = png_declaring(3_000, 3_000, zlib.compress(b"\x00" * 9_001 * 3_000, 9))
    with pytest.raises(ImageError, match="3000x3000 pixels, over the 1,000,000-pixel limit"):
        pixels(data, height=8, width=8, channels=3, max_pixels=1_000_000)
    assert pixels(data, height=8, width=8, channels=3).shape == (8, 8, 3)


def ico_embedding(size: int) -> bytes:
    """An ICO whose directory says 1x1 but which embeds a size x size PNG (Pillow decodes it on open)."""
    inner = png_declaring(size, size, zlib.compress(b"\x00" * (3 * size + 1) * size, 9))
    entry = struct.pack("<BBBBHHII", 1, 1, 0, 0, 1, 32, len(inner), 6 + 16)
    return struct.pack("<HHH", 0, 1, 1) + entry + inner


def test_formats_that_decode_while_opening_are_refused():
    with pytest.raises(ImageError, match="not a JPEG, PNG"):
        pixels(ico_embedding(3_000), height=8, width=8, channels=3)
