"""A deterministic catalogue-photo gallery, built offline from the photos scikit-learn ships.

Photos of 0.3 to 12 megapixels in size classes (each class half landscape, half portrait),
cut from scikit-learn's two bundled photos (``china.jpg`` and ``flower.jpg``, 640x427) by
random crops, Lanczos upscaling, flips, mild colour jitter and a light film grain (an
upscaled crop is smoother than a camera's photo, and libjpeg-turbo's entropy decoding costs
more on a grainy one), all drawn from one seed. Formats and encodings follow a fixed cycle of
ten per class: JPEG at quality 85-95, most 4:2:0, some progressive, some 4:4:4, a greyscale
(L) and a CMYK JPEG, two JPEGs with an EXIF orientation tag (6 and 8), a PNG (classes up to
4 megapixels: a 12-megapixel PNG photo is past the migration's 20 MB file limit; above
them a 4:4:4 JPEG takes its place) and a WebP. The same seed gives the same bytes.

``manifest.jsonl`` beside the files says, a line a photo: file, format, width, height,
size class, mode, quality, subsampling, progressive, orientation and bytes. The default
folder is under rm-qdrant's cache folder (``$RMQ_CACHE_DIR``, else ``~/.cache/rm-qdrant``),
never the working directory, and a folder whose manifest matches is reused as it is.

Run: ``python benchmarks/photo_gallery.py [--out DIR] [--per-class 10] [--seed 0]
[--classes 640x427,1600x1067,...]``
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageEnhance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rm_qdrant.caches import cache_root  # noqa: E402

VERSION = "photo-gallery-v1"
MANIFEST = "manifest.jsonl"
#: (name, landscape width, landscape height): phone, web, 4-MP, 10.7-MP and 12-MP photos.
SIZE_CLASSES = (
    ("640x427", 640, 427),
    ("1600x1067", 1600, 1067),
    ("2448x1632", 2448, 1632),
    ("4000x2667", 4000, 2667),
    ("4240x2832", 4240, 2832),
)
#: The largest class (in pixels) that holds PNGs; larger ones get a 4:4:4 JPEG instead.
PNG_MAX_PIXELS = 2448 * 1632
#: Each class's photos take these variants in turn: (format, mode, subsampling, progressive,
#: EXIF orientation). Subsampling is Pillow's: 0 = 4:4:4, 2 = 4:2:0.
CYCLE = (
    ("JPEG", "RGB", 2, False, 1),
    ("JPEG", "RGB", 2, False, 6),
    ("JPEG", "RGB", 2, True, 1),
    ("PNG", "RGB", None, False, 1),
    ("JPEG", "RGB", 0, False, 1),
    ("JPEG", "L", 2, False, 1),
    ("JPEG", "RGB", 2, False, 1),
    ("WEBP", "RGB", None, False, 1),
    ("JPEG", "CMYK", 2, False, 1),
    ("JPEG", "RGB", 2, True, 8),
)
SUFFIXES = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}
GRAIN = 4  # the film grain's half-range, in pixel levels


@dataclasses.dataclass(frozen=True)
class Photo:
    """One photo of the gallery as planned (everything but its bytes, known before it is built)."""

    file: str
    format: str
    width: int
    height: int
    size_class: str
    mode: str
    quality: int | None
    subsampling: str | None
    progressive: bool
    orientation: int
    seed: int


def default_folder(per_class: int = 10, seed: int = 0, classes: tuple = SIZE_CLASSES) -> Path:
    """Where the gallery goes unless told: ``<cache_root>/photo-gallery-v1`` for the defaults."""
    name = VERSION if (per_class, seed) == (10, 0) else f"{VERSION}-per{per_class}-seed{seed}"
    if tuple(classes) != SIZE_CLASSES:
        name += "-" + "_".join(c[0] for c in classes)
    return cache_root() / name


def parse_classes(text: str) -> tuple:
    """Size classes from ``640x427,1600x1067``: each named after its landscape size."""
    out = []
    for item in text.split(","):
        wide, _, high = item.strip().partition("x")
        if not (wide.isdigit() and high.isdigit()):
            raise ValueError(f"a size class is WIDTHxHEIGHT, got {item!r}")
        out.append((item.strip(), int(wide), int(high)))
    return tuple(out)


def plan(per_class: int = 10, seed: int = 0, classes: tuple = SIZE_CLASSES) -> list[Photo]:
    """The photos a build makes, in order: ``per_class`` of each size class."""
    rng = np.random.default_rng(seed)
    photos = []
    for name, wide, high in classes:
        for i in range(per_class):
            fmt, mode, sub, progressive, orientation = CYCLE[i % len(CYCLE)]
            if fmt == "PNG" and wide * high > PNG_MAX_PIXELS:
                fmt, sub = "JPEG", 0
            width, height = (wide, high) if i % 2 == 0 else (high, wide)
            quality = int(rng.integers(85, 96)) if fmt != "PNG" else None
            photos.append(
                Photo(
                    file=f"{name}-{i:03d}{SUFFIXES[fmt]}",
                    format=fmt,
                    width=width,
                    height=height,
                    size_class=name,
                    mode=mode,
                    quality=quality,
                    subsampling={0: "4:4:4", 2: "4:2:0"}.get(sub) if fmt == "JPEG" and mode != "L" else None,
                    progressive=progressive,
                    orientation=orientation,
                    seed=int(rng.integers(2**31)),
                )
            )
    return photos


def sources() -> list[Image.Image]:
    """scikit-learn's bundled photos (no download: they ship inside the package)."""
    from sklearn.datasets import load_sample_image

    return [Image.fromarray(load_sample_image(name)) for name in ("china.jpg", "flower.jpg")]


def picture(photo: Photo, bases: list[Image.Image]) -> Image.Image:
    """The photo's pixels: a random crop of a bundled photo, jittered, flipped, upscaled, grained."""
    rng = np.random.default_rng(photo.seed)
    base = bases[int(rng.integers(len(bases)))]
    aspect = photo.width / photo.height
    most_w = min(base.width, int(base.height * aspect))
    crop_w = int(most_w * rng.uniform(0.45, 1.0))
    crop_h = max(1, round(crop_w / aspect))
    left = int(rng.integers(base.width - crop_w + 1))
    top = int(rng.integers(base.height - crop_h + 1))
    small = base.crop((left, top, left + crop_w, top + crop_h))
    if rng.random() < 0.5:
        small = small.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        small = enhance(small).enhance(float(rng.uniform(0.9, 1.1)))  # on the crop: cheap
    big = small.resize((photo.width, photo.height), Image.Resampling.LANCZOS)
    tile = rng.integers(0, 2 * GRAIN + 1, size=(509, 509, 3), dtype=np.uint8)  # 509: no JPEG block edge
    reps = (-(-photo.height // 509), -(-photo.width // 509), 1)
    grain = Image.fromarray(np.tile(tile, reps)[: photo.height, : photo.width])
    return ImageChops.add(big, grain, offset=-GRAIN)


def encode(photo: Photo, image: Image.Image) -> bytes:
    """The photo's file bytes in its format, mode and encoding."""
    image = image.convert(photo.mode)
    out = io.BytesIO()
    if photo.format == "JPEG":
        exif = Image.Exif()
        if photo.orientation != 1:
            exif[0x0112] = photo.orientation
        image.save(
            out,
            "JPEG",
            quality=photo.quality,
            subsampling=0 if photo.subsampling == "4:4:4" else 2,
            progressive=photo.progressive,
            **({"exif": exif.tobytes()} if photo.orientation != 1 else {}),
        )
    elif photo.format == "PNG":
        image.save(out, "PNG", compress_level=1)  # a fast level: most catalogue PNGs are exports
    else:
        image.save(out, "WEBP", quality=photo.quality, method=2)
    return out.getvalue()


def build(
    out: Path | None = None, *, per_class: int = 10, seed: int = 0, classes: tuple = SIZE_CLASSES
) -> tuple[Path, list[dict]]:
    """Build the gallery in ``out`` (default: :func:`default_folder`), or reuse one whose manifest
    matches; returns the folder and the manifest's entries."""
    folder = Path(out) if out is not None else default_folder(per_class, seed, classes)
    photos = plan(per_class, seed, classes)
    existing = read_manifest(folder)
    if existing is not None and _matches(folder, photos, existing):
        return folder, existing
    folder.mkdir(parents=True, exist_ok=True)
    bases = sources()
    entries = []
    for photo in photos:
        data = encode(photo, picture(photo, bases))
        (folder / photo.file).write_bytes(data)
        entries.append({**_fields(photo), "bytes": len(data)})
    text = "".join(json.dumps(e) + "\n" for e in entries)
    (folder / MANIFEST).write_text(text)
    return folder, entries


def _fields(photo: Photo) -> dict:
    fields = dataclasses.asdict(photo)
    del fields["seed"]
    return fields


def read_manifest(folder: Path) -> list[dict] | None:
    """The manifest's entries, or None where there is none (or it cannot be read)."""
    try:
        return [json.loads(line) for line in (Path(folder) / MANIFEST).read_text().splitlines() if line]
    except (OSError, ValueError):
        return None


def _matches(folder: Path, photos: list[Photo], entries: list[dict]) -> bool:
    if len(entries) != len(photos):
        return False
    for photo, entry in zip(photos, entries, strict=True):
        path = folder / photo.file
        if {k: v for k, v in entry.items() if k != "bytes"} != _fields(photo):
            return False
        if not path.is_file() or path.stat().st_size != entry.get("bytes"):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder (default: under the cache folder)")
    parser.add_argument("--per-class", type=int, default=10, help="photos of each size class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--classes",
        type=parse_classes,
        default=SIZE_CLASSES,
        help="size classes, landscape WIDTHxHEIGHT, comma-separated (default: "
        + ",".join(c[0] for c in SIZE_CLASSES)
        + ")",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    folder, entries = build(args.out, per_class=args.per_class, seed=args.seed, classes=args.classes)
    total = sum(e["bytes"] for e in entries)
    seconds = time.perf_counter() - started
    print(f"{len(entries)} photos, {total / 1e6:.1f} MB, in {folder} ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
