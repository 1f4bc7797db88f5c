"""Turning what a caller hands us (path, bytes, PIL image, array) into pixel arrays."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from rm_qdrant.core.inputspec import DEFAULT_INTERPOLATION, INTERPOLATIONS
from rm_qdrant.errors import ConfigError, ImageError, SourceError, TooLarge
from rm_qdrant.sources.files import read_file

try:  # libjpeg-turbo without Pillow's per-image overhead; Pillow decodes everything without it
    import simplejpeg
except ImportError:  # pragma: no cover - a platform without its wheel
    simplejpeg = None

#: Anything :func:`to_pil` accepts as one image.
ImageLike = str | os.PathLike | bytes | Image.Image | np.ndarray

#: The largest image decoded by default (width × height), about 7,300 × 5,500.
MAX_PIXELS = 40_000_000
#: The largest image file read from a local path (a query, ``rmq index``).
MAX_FILE_BYTES = 20 * 1024 * 1024
#: Image formats decoded (Pillow's names; JPEG covers the MPO files many cameras write).
FORMATS = ("JPEG", "PNG", "WEBP", "AVIF", "GIF", "BMP", "DIB", "TIFF", "TGA", "PPM")
_FORMAT_NAMES = "a JPEG, PNG, WebP, AVIF, GIF, BMP, TIFF, TGA or PPM image"
#: Pillow's filter for each interpolation name (:data:`rm_qdrant.core.inputspec.INTERPOLATIONS`).
FILTERS = {name: Image.Resampling[name.upper()] for name in INTERPOLATIONS}


def to_pil(image: ImageLike, *, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Decode one image.

    Args:
        image: a file path, encoded bytes (JPEG, PNG, ...), a PIL image, or a
            ``uint8`` array of shape ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)``.
        max_pixels: refuse encoded images whose header declares more pixels than this
            (checked before any pixel is decoded, so a decompression bomb costs nothing).

    Raises:
        ImageError: the file is missing or not an image, declares too many pixels,
            or the array has the wrong shape or type.
    """
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, np.ndarray):
        return _from_array(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return _decode(bytes(image), "the image", max_pixels)
    if isinstance(image, (str, os.PathLike)):
        return _decode(*_read(image), max_pixels)
    raise ImageError(f"cannot use {type(image).__name__} as an image")


def _read(image: str | os.PathLike) -> tuple[bytes, str]:
    path = Path(image)
    try:  # bounded and never blocking: a query path may be /dev/zero or a FIFO
        return read_file(path, max_bytes=MAX_FILE_BYTES, shown=str(path)), str(path)
    except SourceError as exc:
        raise ImageError(f"cannot read image {exc}") from exc


def _too_large(what: str, width: int, height: int, max_pixels: int) -> ImageError:
    return TooLarge(f"{what} is {width}x{height} pixels, over the {max_pixels:,}-pixel limit")


def _decode(data: bytes, what: str, max_pixels: int) -> Image.Image:
    try:
        # Only formats whose header gives the size before any pixel is decoded: an ICO or
        # ICNS file decodes its embedded picture while it is opened, past the pixel cap.
        picture = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = picture.size
        if width * height > max_pixels:
            raise _too_large(what, width, height, max_pixels)
        picture.load()  # decode now: a truncated file fails here, not later
    except ImageError:
        raise
    except UnidentifiedImageError as exc:
        raise ImageError(f"{what} is not a readable image: not {_FORMAT_NAMES} data") from exc
    except Exception as exc:  # Pillow parses untrusted bytes and raises all kinds (SyntaxError, ...)
        raise ImageError(f"{what} is not a readable image: {type(exc).__name__}: {exc}") from exc
    return picture


def _jpeg_rgb(data: bytes, what: str, max_pixels: int) -> np.ndarray | None:
    """A YCbCr or grey JPEG's RGB pixels through libjpeg-turbo directly, or None where that does not apply.

    The pixels are Pillow's to the bit (the same library, the same default DCT and
    upsampling), several times faster on small images: Pillow parses the headers in
    Python. Anything else (CMYK, not a JPEG, a fault, or no simplejpeg) returns None,
    and Pillow decodes it and words the error.
    """
    if simplejpeg is None or data[:2] != b"\xff\xd8":
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace not in ("YCbCr", "Gray"):
            return None
        if width * height > max_pixels:
            raise _too_large(what, width, height, max_pixels)
        return simplejpeg.decode_jpeg(data, colorspace="RGB")  # strict: a recoverable fault raises
    except ImageError:
        raise
    except Exception:  # whatever it cannot take (a 4:4:1 file raises KeyError): Pillow decides
        return None


def _decoded(image: ImageLike, mode: str, max_pixels: int) -> Image.Image | np.ndarray:
    """``image`` decoded in ``mode`` (``RGB`` or ``L``): an RGB array where the fast JPEG path applies."""
    if mode == "RGB" and isinstance(image, (bytes, bytearray, memoryview, str, os.PathLike)):
        local = isinstance(image, (str, os.PathLike))
        data, what = _read(image) if local else (bytes(image), "the image")  # type: ignore[arg-type]
        fast = _jpeg_rgb(data, what, max_pixels)
        return fast if fast is not None else _convert(_decode(data, what, max_pixels), mode)
    return _convert(to_pil(image, max_pixels=max_pixels), mode)


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


def pixels(
    image: ImageLike,
    *,
    height: int,
    width: int,
    channels: int,
    max_pixels: int = MAX_PIXELS,
    resize: int | None = None,
    crop: int | None = None,
    channel_order: str = "RGB",
    interpolation: str = DEFAULT_INTERPOLATION,
) -> np.ndarray:
    """Decode, convert and resize one image to a ``(height, width, channels)`` uint8 array.

    Without ``resize`` the image is resized straight to height × width.
    With ``resize`` and ``crop`` it goes through torchvision's ``Resize(resize)`` and
    ``CenterCrop(crop)`` exactly: the shorter side becomes ``resize``, then the centre
    ``crop`` × ``crop`` square is kept (``crop`` equals height and width). Either resize
    is Pillow's ``Image.resize`` with the ``interpolation`` filter (``bilinear``,
    ``bicubic``, ``lanczos``, ``box``, ``hamming``: antialiased when shrinking;
    ``nearest``: one source pixel each), as torchvision's ``Resize`` on a PIL image.
    ``BGR`` reverses the channels at the end.

    Raises:
        ImageError: the image cannot be decoded or converted, is empty, or declares
            (or would be resized to) more than ``max_pixels``.
        ConfigError: ``resize`` without ``crop``, a crop that is not height × width, or
            an unknown ``interpolation``.
    """
    if (resize is None) != (crop is None) or (crop is not None and (crop != height or crop != width)):
        raise ConfigError(f"resize {resize} and crop {crop} do not make a {height}x{width} image")
    if interpolation not in FILTERS:
        raise ConfigError(f"unknown interpolation {interpolation!r}; expected one of {', '.join(FILTERS)}")
    resample = FILTERS[interpolation]
    decoded = _decoded(image, "RGB" if channels == 3 else "L", max_pixels)
    if isinstance(decoded, np.ndarray):
        if resize is None and decoded.shape[:2] == (height, width):  # nothing left to do: no Pillow
            return decoded[:, :, ::-1] if channel_order == "BGR" else decoded
        decoded = Image.fromarray(decoded, mode="RGB")
    picture = decoded
    width_now, height_now = picture.size
    if width_now < 1 or height_now < 1:
        raise ImageError(f"the image is empty ({width_now}x{height_now} pixels)")
    if resize is None:
        picture = _resized(picture, (width, height), resample)
    else:
        size = shorter_side_size(picture.size, resize)
        if size[0] * size[1] > max_pixels:
            raise TooLarge(
                f"a {width_now}x{height_now} image resized to shorter side {resize} is "
                f"{size[0]}x{size[1]} pixels, over the {max_pixels:,}-pixel limit"
            )
        picture = _resized(picture, size, resample).crop(centre_box(size, crop or 0))
    array: Any = np.asarray(picture, dtype=np.uint8).reshape(height, width, channels)
    return array[:, :, ::-1] if channel_order == "BGR" else array


def shorter_side_size(size: tuple[int, int], resize: int) -> tuple[int, int]:
    """(width, height) after torchvision's ``Resize(resize)``: the shorter side becomes ``resize``.

    >>> shorter_side_size((50, 40), 36)
    (45, 36)
    """
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)  # torchvision's arithmetic, to the pixel
    return (resize, new_long) if width <= height else (new_long, resize)


def centre_box(size: tuple[int, int], crop: int) -> tuple[int, int, int, int]:
    """The (left, top, right, bottom) box of torchvision's ``CenterCrop(crop)`` in a (width, height) image.

    >>> centre_box((45, 36), 32)
    (6, 2, 38, 34)
    """
    width, height = size
    top = int(round((height - crop) / 2.0))
    left = int(round((width - crop) / 2.0))
    return (left, top, left + crop, top + crop)


def _convert(picture: Image.Image, mode: str) -> Image.Image:
    if picture.mode == mode:
        return picture
    try:
        return picture.convert(mode)
    except Exception as exc:  # a decoded image in an unusual mode Pillow cannot convert
        raise ImageError(
            f"cannot convert a {picture.mode} image to {mode}: {type(exc).__name__}: {exc}"
        ) from exc


def _resized(picture: Image.Image, size: tuple[int, int], resample: Image.Resampling) -> Image.Image:
    if picture.size == size:
        return picture
    try:
        return picture.resize(size, resample)
    except Exception as exc:  # Pillow can still fail on a lazily decoded or odd image
        raise ImageError(f"cannot resize a {picture.mode} image: {type(exc).__name__}: {exc}") from exc
