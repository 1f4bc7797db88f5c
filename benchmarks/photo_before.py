"""A frozen copy of rm-qdrant's image preprocessing before issue 42 (d78af78), for comparisons.

What ``rm_qdrant.models.images.pixels(path, resize=256, crop=224, height=224, width=224,
channels=3)`` did at d78af78: a YCbCr or grey JPEG decoded to RGB by
``simplejpeg.decode_jpeg(data, colorspace="RGB")``, anything else by Pillow and converted
to RGB; then ``Image.fromarray``, ``resize`` of the shorter side to 256 (bilinear) and the
centre 224 x 224 crop. Only that path is kept (no pixel cap, no error wording): the
benchmarks time it and check the current code gives the same pixels.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image

from rm_qdrant.sources.files import read_file

MAX_FILE_BYTES = 20 * 1024 * 1024


def _jpeg_rgb(data: bytes) -> np.ndarray | None:
    if data[:2] != b"\xff\xd8":
        return None
    try:
        if simplejpeg.decode_jpeg_header(data)[2] not in ("YCbCr", "Gray"):
            return None
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    except Exception:  # what simplejpeg cannot take (CMYK headers among them): Pillow's
        return None


def _decoded(data: bytes) -> Image.Image | np.ndarray:
    fast = _jpeg_rgb(data)
    if fast is not None:
        return fast
    picture = Image.open(io.BytesIO(data))
    picture.load()
    return picture if picture.mode == "RGB" else picture.convert("RGB")


def shorter_side_size(size: tuple[int, int], resize: int) -> tuple[int, int]:
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    return (resize, new_long) if width <= height else (new_long, resize)


def centre_box(size: tuple[int, int], crop: int) -> tuple[int, int, int, int]:
    width, height = size
    top = int(round((height - crop) / 2.0))
    left = int(round((width - crop) / 2.0))
    return (left, top, left + crop, top + crop)


def pixels(path: str | Path, *, resize: int = 256, crop: int = 224) -> np.ndarray:
    """The ``(crop, crop, 3)`` uint8 pixels the pre-issue-42 code gave for the image at ``path``."""
    decoded = _decoded(read_file(Path(path), max_bytes=MAX_FILE_BYTES, shown=str(path)))
    picture = Image.fromarray(decoded, mode="RGB") if isinstance(decoded, np.ndarray) else decoded
    size = shorter_side_size(picture.size, resize)
    picture = picture.resize(size, Image.Resampling.BILINEAR).crop(centre_box(size, crop))
    return np.asarray(picture, dtype=np.uint8).reshape(crop, crop, 3)
