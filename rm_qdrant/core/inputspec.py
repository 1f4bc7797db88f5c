"""How images are prepared for a graph: the ``input`` object of its metadata (pure: no I/O).

Split out of :mod:`rm_qdrant.core.modelinfo`, which reads the whole entry and
re-exports :class:`InputSpec`, :func:`check_input_shape` and :func:`parse_floats`.

``interpolation`` names the Pillow resampling filter of every resize (the straight
resize to height × width, or the shorter-side ``resize``): ``nearest``, ``bilinear``,
``bicubic``, ``lanczos``, ``box`` or ``hamming``, applied as ``Image.resize(size,
Image.Resampling.<NAME>)`` does it. Pillow's filters other than ``nearest`` widen
their support by the scale factor when they shrink an image (antialiasing); this is
what torchvision's ``Resize(..., interpolation=...)`` does to a PIL image. An entry
without it means ``bilinear``, what rm-qdrant always used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rm_qdrant.errors import ConfigError, EncoderError

LAYOUTS = ("NHWC", "NCHW")
DTYPES = ("uint8", "float32")
CHANNEL_ORDERS = ("RGB", "BGR")
#: Pillow's resampling filters, by the name the metadata and ``--interpolation`` use.
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
#: The filter of an entry that names none (every graph stamped before the setting existed).
DEFAULT_INTERPOLATION = "bilinear"
#: How the EXIF orientation tag is treated: ``ignore`` it (what ``PIL.Image.open`` and
#: torchvision's ``default_loader`` do, and rm-qdrant always did) or turn the photo as
#: the tag says (``exif``: ``PIL.ImageOps.exif_transpose``), as the team's pipeline does.
ORIENTATIONS = ("ignore", "exif")
DEFAULT_ORIENTATION = "ignore"
#: How a pair decodes its images (recorded at ``rmq init``, changed by ``switch-encoder``):
#: ``exact`` gives every pixel the team's pipeline gives; ``fast`` decodes JPEGs at
#: libjpeg-turbo's smallest DCT scale that still covers the resize, then resizes only
#: the pixels the crop keeps (see :func:`rm_qdrant.models.images.pixels`).
DECODES = ("exact", "fast")
DEFAULT_DECODE = "exact"
#: The largest input side (height, width, resize, crop) a graph may declare.
MAX_INPUT_SIDE = 8192


@dataclass(frozen=True)
class InputSpec:
    """How images are laid out and scaled before they enter the graph."""

    height: int
    width: int
    channels: int = 3
    layout: str = "NHWC"
    dtype: str = "uint8"
    #: Per-channel normalisation for ``float32`` input, in ``channel_order``; empty means none.
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    #: The shorter side after the first resize; None resizes straight to height × width.
    resize: int | None = None
    #: The side of the square centre crop taken after ``resize`` (equal to height and width).
    crop: int | None = None
    #: The channel order the graph expects, ``RGB`` or ``BGR``.
    channel_order: str = "RGB"
    #: The Pillow filter of every resize, one of :data:`INTERPOLATIONS`.
    interpolation: str = DEFAULT_INTERPOLATION
    #: The EXIF orientation tag, ignored or applied: one of :data:`ORIENTATIONS`.
    orientation: str = DEFAULT_ORIENTATION

    modality = "image"

    def tensor_shape(self, batch: int) -> tuple[int, int, int, int]:
        """The input tensor's shape for ``batch`` images."""
        if self.layout == "NCHW":
            return (batch, self.channels, self.height, self.width)
        return (batch, self.height, self.width, self.channels)

    def describe(self) -> str:
        """One line for people.

        e.g. ``NCHW float32 224x224x3 RGB, resize 256 + centre crop 224 (bicubic), (x/255 - mean ...``
        """
        text = f"{self.layout} {self.dtype} {self.height}x{self.width}x{self.channels} {self.channel_order}"
        text += f", resize {self.resize} + centre crop {self.crop}" if self.resize else ", resized directly"
        text += f" ({self.interpolation})"
        if self.orientation == "exif":
            text += ", turned as the EXIF orientation tag says"
        if self.dtype == "uint8":
            return text + ", raw pixels (normalised inside the graph)"
        if all(m == 0 for m in self.mean) and all(s == 1 for s in self.std):
            return text + ", x/255 (no mean/std)"
        return text + f", (x/255 - mean {list(self.mean)}) / std {list(self.std)}"

    def to_json(self) -> dict[str, Any]:
        """The metadata's ``input`` object; ``interpolation`` only when it is not the default,
        so a graph stamped as before reads the same to any rm-qdrant."""
        body: dict[str, Any] = {
            "height": self.height,
            "width": self.width,
            "channels": self.channels,
            "layout": self.layout,
            "dtype": self.dtype,
            "mean": list(self.mean),
            "std": list(self.std),
            "resize": self.resize,
            "crop": self.crop,
            "channel_order": self.channel_order,
        }
        if self.interpolation != DEFAULT_INTERPOLATION:
            body["interpolation"] = self.interpolation
        if self.orientation != DEFAULT_ORIENTATION:
            body["orientation"] = self.orientation
        return body


def check_decode(decode: str) -> str:
    """``decode`` if it is one of :data:`DECODES`.

    Raises:
        ConfigError: any other value (one line naming both).
    """
    if decode not in DECODES:
        raise ConfigError(f"unknown decode {decode!r}; expected one of {', '.join(DECODES)}")
    return decode


def check_input_shape(spec: InputSpec, shape: Sequence[object], what: str) -> int | None:
    """Check a graph input's static shape against ``spec``; return its fixed batch size, or None.

    ``shape`` holds an int for every static dimension (anything else is dynamic).

    Raises:
        EncoderError: the input is not 4-D, or a static dimension contradicts ``spec``.
    """
    if len(shape) != 4:
        raise EncoderError(f"{what}: expected a 4-D image input, got {len(shape)} dimensions")
    want = spec.tensor_shape(0)[1:]
    for got, expected in zip(shape[1:], want, strict=True):
        if is_int(got) and got != expected:
            shown = ", ".join(str(d) if is_int(d) else "?" for d in shape)
            raise EncoderError(
                f"{what}: the graph's input has shape [{shown}], but {spec.layout} "
                f"{spec.height}x{spec.width}x{spec.channels} needs [N, {', '.join(map(str, want))}]"
            )
    batch = shape[0]
    return batch if is_int(batch) and batch > 0 else None  # type: ignore[return-value]


def parse_floats(value: str | None, option: str) -> tuple[float, ...] | None:
    """``"0.5,0.5,0.5"`` → ``(0.5, 0.5, 0.5)``: an input's per-channel --mean or --std as typed.

    Raises:
        ConfigError: a part that is not a finite number (``option`` names the option).
    """
    if value is None:
        return None
    try:
        numbers = tuple(float(part) for part in value.split(","))
    except ValueError:
        numbers = (math.nan,)
    if not all(math.isfinite(n) for n in numbers):
        raise ConfigError(
            f"bad {option} {value!r}: expected comma-separated finite numbers, e.g. 0.5,0.5,0.5"
        )
    return numbers


def parse_input(raw: Any) -> InputSpec:
    """Read and check the metadata's ``input`` object.

    Raises:
        EncoderError: a missing, mistyped or contradictory fact (one line).
    """
    if not isinstance(raw, dict):
        raise EncoderError("metadata 'input' must be an object with height and width")
    channels = raw.get("channels", 3)
    if not is_int(channels) or channels not in (1, 3):
        raise EncoderError(f"input.channels must be 1 or 3, got {show(channels)}")
    std = _floats(raw.get("std"), "input.std", channels, 1.0)
    if not all(s > 0 for s in std):
        raise EncoderError(f"input.std values must be > 0, got {list(std)}")
    spec = InputSpec(
        height=int_in(raw.get("height"), "input.height", MAX_INPUT_SIDE),
        width=int_in(raw.get("width"), "input.width", MAX_INPUT_SIDE),
        channels=channels,
        layout=choice(raw.get("layout", "NHWC"), "input.layout", LAYOUTS),
        dtype=choice(raw.get("dtype", "uint8"), "input.dtype", DTYPES),
        mean=_floats(raw.get("mean"), "input.mean", channels, 0.0),
        std=std,
        resize=_optional_int(raw.get("resize"), "input.resize"),
        crop=_optional_int(raw.get("crop"), "input.crop"),
        channel_order=choice(raw.get("channel_order", "RGB"), "input.channel_order", CHANNEL_ORDERS),
        interpolation=choice(
            raw.get("interpolation", DEFAULT_INTERPOLATION), "input.interpolation", INTERPOLATIONS
        ),
        orientation=choice(raw.get("orientation", DEFAULT_ORIENTATION), "input.orientation", ORIENTATIONS),
    )
    _check_geometry(spec)
    return spec


def _check_geometry(spec: InputSpec) -> None:
    if (spec.resize is None) != (spec.crop is None):
        raise EncoderError("input.resize and input.crop go together (shorter-side resize, then centre crop)")
    if spec.crop is not None and spec.resize is not None:
        if spec.crop > spec.resize:
            raise EncoderError(f"input.crop ({spec.crop}) must not exceed input.resize ({spec.resize})")
        if spec.crop != spec.height or spec.crop != spec.width:
            raise EncoderError(
                f"input.crop ({spec.crop}) must equal input.height and input.width "
                f"({spec.height}x{spec.width})"
            )
    if spec.channel_order == "BGR" and spec.channels != 3:
        raise EncoderError("input.channel_order BGR needs 3 channels")


def is_int(value: object) -> bool:
    """An int that is not a bool (JSON's ``true`` is no dimension)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_in(value: Any, what: str, high: int) -> int:
    """``value`` as an integer in 1..``high``, or an EncoderError naming ``what``."""
    if not is_int(value) or not 1 <= value <= high:
        raise EncoderError(f"{what} must be a positive integer up to {high}, got {show(value)}")
    return value


def _optional_int(value: Any, what: str) -> int | None:
    return None if value is None else int_in(value, what, MAX_INPUT_SIDE)


def choice(value: Any, what: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, or an EncoderError that names them all."""
    if not isinstance(value, str) or value not in choices:
        raise EncoderError(f"{what} must be one of {', '.join(choices)}, got {show(value)}")
    return value


def _floats(value: Any, what: str, channels: int, default: float) -> tuple[float, ...]:
    if value is None or value == []:
        return (default,) * channels
    if not isinstance(value, list) or not all(_finite(v) for v in value) or len(value) != channels:
        raise EncoderError(
            f"{what} needs one value per channel ({channels} finite numbers), got {show(value)}"
        )
    return tuple(float(v) for v in value)


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def show(value: Any) -> str:
    """A value's repr cut to one short line (hostile metadata can hold megabytes)."""
    return clip(repr(value))


def clip(text: str) -> str:
    """``text`` on one line, at most 80 characters."""
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."
