"""A many-class, few-shot gallery of greyscale drawings: glyphs rendered with jitter, no download.

Hundreds of classes with a handful of images each, the kind of open-class gallery on which
the label-free ``rmq fit`` once kept a ψ that served below the old model (issue 39). Each
class is one character of the DejaVu fonts that ship with the machine (Latin, Greek,
Cyrillic, Armenian, Georgian, symbols, arrows, ...); characters that render alike (Latin A,
Greek Alpha, Cyrillic A) are merged away by their bitmaps. Each image draws the character in
one of the font's styles (the "hand"), rotated, scaled, shifted, thickened or thinned, and
noised, as a 32 × 32 greyscale PNG in ``root/{train,test}/<class>/``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONTS = Path("/usr/share/fonts/truetype/dejavu")
STYLES = (
    "DejaVuSans.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSansCondensed-Oblique.ttf",
)
#: Unicode blocks the characters come from (DejaVu Sans covers them).
BLOCKS = (
    (0x0021, 0x007E),  # ASCII
    (0x00A1, 0x017F),  # Latin-1, Latin Extended-A
    (0x0370, 0x03FF),  # Greek
    (0x0400, 0x04FF),  # Cyrillic
    (0x0531, 0x0587),  # Armenian
    (0x10A0, 0x10FF),  # Georgian
    (0x2190, 0x21FF),  # arrows
    (0x2200, 0x22FF),  # mathematical operators
    (0x2500, 0x25FF),  # box drawing, geometric shapes
    (0x2600, 0x26FF),  # miscellaneous symbols
)
SIZE = 32
CANVAS = 64


def _draw(char: str, font: ImageFont.FreeTypeFont) -> Image.Image:
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    ImageDraw.Draw(canvas).text((CANVAS // 2, CANVAS // 2), char, fill=255, font=font, anchor="mm")
    return canvas


def characters(count: int, *, seed: int = 0) -> list[str]:
    """``count`` characters that render with ink and unlike each other (seeded choice)."""
    fonts = [ImageFont.truetype(str(FONTS / style), 40) for style in STYLES]
    missing = [np.asarray(_draw("\ue000", font)) for font in fonts]  # each style's box for a missing glyph
    font, seen, chosen = fonts[0], set(), []
    pool = [chr(c) for lo, hi in BLOCKS for c in range(lo, hi + 1)]
    for char in np.random.default_rng(seed).permutation(pool):
        bitmap = np.asarray(_draw(str(char), font).resize((16, 16)))
        if bitmap.sum() < 255 * 4:  # blank or a dot
            continue
        key = hashlib.sha1((bitmap > 96).tobytes()).hexdigest()
        if key in seen or any(
            np.array_equal(np.asarray(_draw(str(char), f)), box)
            for f, box in zip(fonts, missing, strict=True)
        ):  # drawn alike, or missing from a style
            continue
        seen.add(key)
        chosen.append(str(char))
        if len(chosen) == count:
            return chosen
    raise ValueError(f"only {len(chosen)} distinct characters; asked for {count}")


def render(char: str, rng: np.random.Generator) -> Image.Image:
    """One jittered drawing of ``char``."""
    font = ImageFont.truetype(str(FONTS / STYLES[rng.integers(len(STYLES))]), int(rng.integers(30, 44)))
    image = _draw(char, font).rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
    stroke = rng.integers(3)
    if stroke == 1:
        image = image.filter(ImageFilter.MaxFilter(3))
    elif stroke == 2:
        image = image.filter(ImageFilter.GaussianBlur(1.2))
    shift = rng.integers(-5, 6, size=2)
    image = image.transform(image.size, Image.AFFINE, (1, 0, int(shift[0]), 0, 1, int(shift[1])))
    pixels = np.asarray(image.resize((SIZE, SIZE), Image.BILINEAR), np.float32)
    pixels += rng.normal(0, 12, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="L")


def write_glyphs(root: Path, *, classes: int = 400, train: int = 14, test: int = 6, seed: int = 0) -> Path:
    """``classes`` glyph classes, ``train`` + ``test`` drawings each, as PNGs under root/{train,test}/."""
    if (root / "test").is_dir():
        return root
    rng = np.random.default_rng(seed)
    for c, char in enumerate(characters(classes, seed=seed)):
        for i in range(train + test):
            target = root / ("train" if i < train else "test") / f"g{c:04d}" / f"{i:02d}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            render(char, rng).save(target)
    return root
