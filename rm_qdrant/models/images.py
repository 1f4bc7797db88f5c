"""Turning what a caller hands us (path, bytes, PIL image, array) into pixel arrays."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from rm_qdrant.core.inputspec import (
    DECODES,
    DEFAULT_DECODE,
    DEFAULT_INTERPOLATION,
    DEFAULT_ORIENTATION,
    INTERPOLATIONS,
    ORIENTATIONS,
)
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


def _decode(data: bytes, what: str, max_pixels: int, cover: tuple[int, int] | None = None) -> Image.Image:
    try:
        # Only formats whose header gives the size before any pixel is decoded: an ICO or
        # ICNS file decodes its embedded picture while it is opened, past the pixel cap.
        picture = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = picture.size
        if width * height > max_pixels:
            raise _too_large(what, width, height, max_pixels)
        if cover is not None and picture.format == "JPEG":  # a CMYK JPEG, say: Pillow's DCT scaling
            picture.draft(picture.mode, cover)
        picture.load()  # decode now: a truncated file fails here, not later
    except ImageError:
        raise
    except UnidentifiedImageError as exc:
        raise ImageError(f"{what} is not a readable image: not {_FORMAT_NAMES} data") from exc
    except Image.DecompressionBombError as exc:  # Pillow's own cap, met before the header's size is ours
        raise TooLarge(f"{what} declares too many pixels: {exc}") from exc
    except Exception as exc:  # Pillow parses untrusted bytes and raises all kinds (SyntaxError, ...)
        raise ImageError(f"{what} is not a readable image: {type(exc).__name__}: {exc}") from exc
    return picture


#: ``Image.transpose`` for each EXIF orientation value (what ``ImageOps.exif_transpose`` does).
_TURNS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _turn(picture: Image.Image) -> Image.Transpose | None:
    """The transposition the EXIF orientation tag of a decoded ``picture`` asks for (None: upright
    or no tag), read after it is loaded, as ``ImageOps.exif_transpose`` reads it: Pillow's TIFF
    decoder turns the image itself while loading and drops the tag, and a PNG's tag may follow
    its pixels."""
    try:
        picture.load()
        return _tagged_turn(picture)
    except Exception:  # no readable EXIF (a fault in the pixels: the conversion says so)
        return None


def _jpeg_turn(data: bytes) -> Image.Transpose | None:
    """The transposition the EXIF orientation tag of a JPEG's ``data`` asks for, read from its
    header before any pixel is decoded (the DCT scale must cover the turned size)."""
    try:
        return _tagged_turn(Image.open(io.BytesIO(data), formats=FORMATS))
    except Exception:  # no readable EXIF (or not an image: the decode says so)
        return None


def _tagged_turn(picture: Image.Image) -> Image.Transpose | None:
    value = picture.getexif().get(0x0112, 1)
    return _TURNS.get(value) if isinstance(value, int) else None


def _jpeg_rgbx(data: bytes, what: str, max_pixels: int, cover: tuple[int, int] | None) -> Image.Image | None:
    """A YCbCr or grey JPEG decoded by libjpeg-turbo directly, or None where that does not apply.

    The image is RGBX, Pillow's own layout of an RGB image, so it is wrapped without a
    copy; resized, its RGB bytes are those of the RGB image Pillow would have decoded
    (the same library, the same default DCT and upsampling), several times faster on
    small images: Pillow parses the headers in Python. ``cover`` (width, height): decode
    at libjpeg-turbo's smallest DCT scale (1/8 to 1) whose image is still at least that
    large. Anything else (CMYK, not a JPEG, a fault, or no simplejpeg) returns None, and
    Pillow decodes it and words the error.
    """
    if simplejpeg is None or data[:2] != b"\xff\xd8":
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace not in ("YCbCr", "Gray"):
            return None
        if width * height > max_pixels:
            raise _too_large(what, width, height, max_pixels)
        low_w, low_h = cover or (0, 0)
        if width < low_w or height < low_h:  # no scale covers it: libjpeg-turbo would still shrink
            low_w, low_h = width, height  # a long side whose short side no scale changes (1 pixel)
        # strict: a recoverable fault raises; the decode runs without the GIL
        array = simplejpeg.decode_jpeg(data, colorspace="RGBX", min_width=low_w, min_height=low_h)
    except ImageError:
        raise
    except Exception:  # whatever it cannot take (a 4:4:1 file raises KeyError): Pillow decides
        return None
    return Image.frombuffer("RGBX", (array.shape[1], array.shape[0]), array, "raw", "RGBX", 0, 1)


def _decoded(
    image: ImageLike, mode: str, max_pixels: int, cover: tuple[int, int] | None, orientation: str
) -> Image.Image:
    """``image`` decoded, turned as ``orientation`` says, in ``mode`` (``RGB``, or ``RGBX`` from the
    fast JPEG path, or ``L``); ``cover``: a JPEG may be decoded at a DCT scale that covers it."""
    if not isinstance(image, (bytes, bytearray, memoryview, str, os.PathLike)):
        picture = to_pil(image, max_pixels=max_pixels)
        if orientation == "exif" and isinstance(image, Image.Image):
            turn = _turn(picture)
            picture = picture.transpose(turn) if turn is not None else picture
        return _convert(picture, mode)
    local = isinstance(image, (str, os.PathLike))
    data, what = _read(image) if local else (bytes(image), "the image")  # type: ignore[arg-type]
    jpeg = data[:2] == b"\xff\xd8"
    turn = _jpeg_turn(data) if orientation == "exif" and jpeg else None
    if cover is not None and turn in _SIDEWAYS:
        cover = (cover[1], cover[0])  # decoded before it is turned
    picture = _jpeg_rgbx(data, what, max_pixels, cover) if mode == "RGB" else None
    if picture is None:
        decoded = _decode(data, what, max_pixels, cover)
        if orientation == "exif" and not jpeg:  # read once decoded, within the pixel cap
            turn = _turn(decoded)
        picture = _convert(decoded, mode)
        del decoded  # a CMYK or palette original is not kept while the converted image turns
    return picture.transpose(turn) if turn is not None else picture


_SIDEWAYS = (
    Image.Transpose.TRANSPOSE,
    Image.Transpose.ROTATE_270,
    Image.Transpose.TRANSVERSE,
    Image.Transpose.ROTATE_90,
)


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
    orientation: str = DEFAULT_ORIENTATION,
    decode: str = DEFAULT_DECODE,
) -> np.ndarray:
    """Decode, convert and resize one image to a ``(height, width, channels)`` uint8 array.

    Without ``resize`` the image is resized straight to height × width.
    With ``resize`` and ``crop`` it goes through torchvision's ``Resize(resize)`` and
    ``CenterCrop(crop)`` exactly: the shorter side becomes ``resize``, then the centre
    ``crop`` × ``crop`` square is kept (``crop`` equals height and width). Either resize
    is Pillow's ``Image.resize`` with the ``interpolation`` filter (``bilinear``,
    ``bicubic``, ``lanczos``, ``box``, ``hamming``: antialiased when shrinking;
    ``nearest``: one source pixel each), as torchvision's ``Resize`` on a PIL image.
    ``orientation="exif"`` first turns the image as its EXIF orientation tag says
    (``ImageOps.exif_transpose``); ``ignore`` leaves it as stored. ``BGR`` reverses the
    channels at the end.

    ``decode="exact"`` gives those pixels to the bit. ``decode="fast"`` gives nearly the
    same for much less work on large photos: a JPEG is decoded at libjpeg-turbo's smallest
    DCT scale (1/8, 1/4, 3/8, ..., 1) whose image still covers the resize (the shorter side
    at least ``resize``; without ``resize``, at least width × height), and the resize
    computes only the pixels the crop keeps, shrinking by whole factors first where it
    shrinks more than twice (Pillow's ``reducing_gap=2``). PNG, WebP and other formats
    have no DCT scaling: they are decoded at full size, then resized the same way.

    Raises:
        ImageError: the image cannot be decoded or converted, is empty, or declares
            (or would be resized to) more than ``max_pixels``.
        ConfigError: ``resize`` without ``crop``, a crop that is not height × width, or
            an unknown ``interpolation``, ``orientation`` or ``decode``.
    """
    if (resize is None) != (crop is None) or (crop is not None and (crop != height or crop != width)):
        raise ConfigError(f"resize {resize} and crop {crop} do not make a {height}x{width} image")
    for value, option, allowed in (
        (interpolation, "interpolation", FILTERS),
        (orientation, "orientation", ORIENTATIONS),
        (decode, "decode", DECODES),
    ):
        if value not in allowed:
            raise ConfigError(f"unknown {option} {value!r}; expected one of {', '.join(allowed)}")
    fast = decode == "fast"
    cover = ((resize, resize) if resize is not None else (width, height)) if fast else None
    picture = _decoded(image, "RGB" if channels == 3 else "L", max_pixels, cover, orientation)
    width_now, height_now = picture.size
    if width_now < 1 or height_now < 1:
        raise ImageError(f"the image is empty ({width_now}x{height_now} pixels)")
    resample = FILTERS[interpolation]
    gap = 2.0 if fast and resample != Image.Resampling.NEAREST else None
    if resize is None:
        picture = _resized(picture, (width, height), resample, gap=gap)
    else:
        size = shorter_side_size(picture.size, resize)
        if size[0] * size[1] > max_pixels:
            raise TooLarge(
                f"a {width_now}x{height_now} image resized to shorter side {resize} is "
                f"{size[0]}x{size[1]} pixels, over the {max_pixels:,}-pixel limit"
            )
        box = centre_box(size, crop or 0)
        if fast:  # only the kept square, straight from the decoded image
            scale_x, scale_y = width_now / size[0], height_now / size[1]
            source = (box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y)
            picture = _resized(picture, (box[2] - box[0], box[3] - box[1]), resample, gap=gap, box=source)
        else:
            picture = _resized(picture, size, resample).crop(box)
    array: Any = np.asarray(picture, dtype=np.uint8)
    array = array[:, :, :3] if array.ndim == 3 and array.shape[2] == 4 else array  # RGBX
    array = array.reshape(height, width, channels)
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


#: Modes of more than 8 bits a channel (16-bit greyscale PNG, 32-bit TIFF, ...).
_DEEP_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def _convert(picture: Image.Image, mode: str) -> Image.Image:
    if picture.mode == mode:
        return picture
    if picture.mode in _DEEP_MODES:
        _check_depth(picture)
    try:
        return picture.convert(mode)
    except Exception as exc:  # a decoded image in an unusual mode Pillow cannot convert
        raise ImageError(
            f"cannot convert a {picture.mode} image to {mode}: {type(exc).__name__}: {exc}"
        ) from exc


def _check_depth(picture: Image.Image) -> None:
    """Refuse a deep image whose values do not fit 8 bits: Pillow's conversion (what
    ``Image.open(...).convert("RGB")`` gives a team's pipeline) clips them, so a 16-bit
    photo comes out nearly white; a deep file that holds 8-bit values converts as is."""
    low, high = picture.getextrema()  # type: ignore[misc]
    if low < 0 or high > 255:
        raise ImageError(
            f"a {picture.mode} image ({_BITS.get(picture.mode, 'more than 8')} bits a pixel) holds values "
            f"from {low:g} to {high:g}: converting it to 8 bits would clip them (Pillow's conversion); "
            "save it as an 8-bit image"
        )


_BITS = {"I;16": "16", "I;16L": "16", "I;16B": "16", "I;16N": "16", "I": "32", "F": "32 (float)"}


def _resized(
    picture: Image.Image,
    size: tuple[int, int],
    resample: Image.Resampling,
    *,
    gap: float | None = None,
    box: tuple[float, float, float, float] | None = None,
) -> Image.Image:
    if picture.size == size and box is None:
        return picture
    try:
        return picture.resize(size, resample, box=box, reducing_gap=gap)
    except Exception as exc:  # Pillow can still fail on a lazily decoded or odd image
        raise ImageError(f"cannot resize a {picture.mode} image: {type(exc).__name__}: {exc}") from exc
