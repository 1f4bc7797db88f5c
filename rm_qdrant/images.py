"""Turning what a caller hands us (path, bytes, PIL image, array) into pixel arrays."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from rm_qdrant.errors import ImageError

#: Anything :func:`to_pil` accepts as one image.
ImageLike = str | os.PathLike | bytes | Image.Image | np.ndarray


def to_pil(image: ImageLike) -> Image.Image:
    """Decode one image.

    Args:
        image: a file path, encoded bytes (JPEG, PNG, ...), a PIL image, or a
            ``uint8`` array of shape ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)``.

    Raises:
        ImageError: the file is missing or not an image, or the array has the
            wrong shape or type.
    """
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, np.ndarray):
        return _from_array(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return _decode(io.BytesIO(bytes(image)), "image bytes")
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        try:
            with path.open("rb") as handle:
                return _decode(io.BytesIO(handle.read()), str(path))
        except OSError as exc:
            raise ImageError(f"cannot read image {path}: {exc.strerror or exc}") from exc
    raise ImageError(f"cannot use {type(image).__name__} as an image")


def _decode(stream: io.BytesIO, what: str) -> Image.Image:
    try:
        picture = Image.open(stream)
        picture.load()  # decode now: a truncated file fails here, not later
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageError(f"{what} is not a readable image: {exc}") from exc
    return picture


def _from_array(array: np.ndarray) -> Image.Image:
    if array.dtype != np.uint8:
        raise ImageError(f"image arrays must be uint8, got {array.dtype}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 2:
        return Image.fromarray(array, mode="L")
    if array.ndim == 3 and array.shape[2] == 3:
        return Image.fromarray(array, mode="RGB")
    raise ImageError(f"image arrays must be (H, W), (H, W, 1) or (H, W, 3), got {array.shape}")


def as_batch(images: ImageLike | Sequence[ImageLike]) -> tuple[list[ImageLike], bool]:
    """Split a call's argument into a list of images, and say whether it was one image.

    A 4-D array is a batch; a list or tuple is a batch; anything else is one image.
    """
    if isinstance(images, np.ndarray):
        return (list(images), False) if images.ndim == 4 else ([images], True)
    if isinstance(images, (list, tuple)):
        return list(images), False
    return [images], True  # type: ignore[list-item]  # str is a Sequence too, but one image


def pixels(image: ImageLike, *, height: int, width: int, channels: int) -> np.ndarray:
    """Decode, convert and resize one image to a ``(height, width, channels)`` uint8 array."""
    picture = to_pil(image)
    mode = "RGB" if channels == 3 else "L"
    if picture.mode != mode:
        picture = picture.convert(mode)
    if picture.size != (width, height):
        picture = picture.resize((width, height), Image.Resampling.BILINEAR)
    array: Any = np.asarray(picture, dtype=np.uint8)
    return array.reshape(height, width, channels)
