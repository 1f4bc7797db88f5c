"""pixels() against the team's own pipeline, over formats × modes × geometry × filters × orientation.

The reference is what a team's PyTorch code does with Pillow alone: ``Image.open``,
``ImageOps.exif_transpose`` where it honours the tag, ``convert``, torchvision's
``Resize`` + ``CenterCrop`` (Pillow's resize, then a crop). ``decode="exact"`` must give
those pixels to the bit, whichever way rm-qdrant decodes (libjpeg-turbo directly for
YCbCr and grey JPEGs, Pillow for everything else).
"""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from PIL import Image, ImageOps
from sklearn.datasets import load_sample_image

from rm_qdrant.errors import ImageError
from rm_qdrant.models import images
from rm_qdrant.models.images import FILTERS, centre_box, pixels, shorter_side_size

PHOTO = Image.fromarray(load_sample_image("china.jpg"))  # 640x427, a real photo


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A real photo's crop at ``width`` × ``height``, flipped by seed."""
    picture = PHOTO.crop((seed * 7, seed * 5, seed * 7 + 400, seed * 5 + 300)).resize((width, height))
    return picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if seed % 2 else picture


def encoded(picture: Image.Image, fmt: str, *, orientation: int = 1, **options) -> bytes:
    buffer = io.BytesIO()
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif
    picture.save(buffer, format=fmt, **options)
    return buffer.getvalue()


#: name -> (Pillow mode, format, save options)
FILES = {
    "jpeg-420": ("RGB", "JPEG", {"quality": 90}),
    "jpeg-444": ("RGB", "JPEG", {"quality": 95, "subsampling": 0}),
    "jpeg-progressive": ("RGB", "JPEG", {"quality": 85, "progressive": True}),
    "jpeg-grey": ("L", "JPEG", {"quality": 90}),
    "jpeg-cmyk": ("CMYK", "JPEG", {"quality": 90}),
    "png-rgb": ("RGB", "PNG", {}),
    "png-rgba": ("RGBA", "PNG", {}),
    "png-palette": ("P", "PNG", {}),
    "png-grey": ("L", "PNG", {}),
    "webp": ("RGB", "WEBP", {"quality": 90}),
}
#: (height, width, resize, crop): straight resize, resize + centre crop, the graph's own size.
GEOMETRY = [(24, 24, None, None), (32, 32, 36, 32), (90, 120, None, None)]


def team_pipeline(data: bytes, *, height, width, channels, resize, crop, interpolation, orientation):
    picture = Image.open(io.BytesIO(data))
    if orientation == "exif":
        picture = ImageOps.exif_transpose(picture)
    picture = picture.convert("RGB" if channels == 3 else "L")
    if resize is None:
        picture = picture.resize((width, height), FILTERS[interpolation])
    else:
        size = shorter_side_size(picture.size, resize)
        picture = picture.resize(size, FILTERS[interpolation]).crop(centre_box(size, crop))
    return np.asarray(picture).reshape(height, width, channels)


CASES = list(itertools.product(FILES, GEOMETRY, ("ignore", "exif"), (3, 1)))


@pytest.mark.parametrize(("name", "geometry", "orientation", "channels"), CASES)
def test_exact_gives_the_team_pipelines_pixels(name, geometry, orientation, channels):
    mode, fmt, options = FILES[name]
    index = CASES.index((name, geometry, orientation, channels))
    interpolation = ("bilinear", "bicubic", "lanczos", "nearest")[index % 4]
    picture = photo(120, 90, seed=index).convert(mode)
    data = encoded(picture, fmt, orientation=6 if fmt in ("JPEG", "PNG", "WEBP") else 1, **options)
    height, width, resize, crop = geometry
    spec = dict(height=height, width=width, channels=channels, resize=resize, crop=crop)
    want = team_pipeline(data, interpolation=interpolation, orientation=orientation, **spec)
    got = pixels(data, interpolation=interpolation, orientation=orientation, decode="exact", **spec)
    assert got.dtype == np.uint8
    assert np.array_equal(got, want)


@pytest.mark.parametrize("size", [(1600, 1067), (1067, 1600), (801, 1203)])
def test_exact_is_bit_for_bit_on_photo_sizes_where_the_fast_path_saves_work(size):
    data = encoded(photo(*size), "JPEG", quality=90)
    spec = dict(height=224, width=224, channels=3, resize=256, crop=224)
    want = team_pipeline(data, interpolation="bilinear", orientation="ignore", **spec)
    assert np.array_equal(pixels(data, **spec), want)


def decoded_sizes(monkeypatch) -> list[tuple[int, int]]:
    """Record the (width, height) every libjpeg-turbo decode gives."""
    seen: list[tuple[int, int]] = []
    real = images.simplejpeg.decode_jpeg

    def spy(*args, **kwargs):
        array = real(*args, **kwargs)
        seen.append((array.shape[1], array.shape[0]))
        return array

    monkeypatch.setattr(images.simplejpeg, "decode_jpeg", spy)
    return seen


@pytest.mark.parametrize(("size", "scaled"), [((2400, 1600), (600, 400)), ((1600, 2400), (400, 600))])
def test_fast_decodes_a_large_jpeg_at_the_smallest_dct_scale_covering_the_resize(monkeypatch, size, scaled):
    data = encoded(photo(*size), "JPEG", quality=90)
    seen = decoded_sizes(monkeypatch)
    spec = dict(height=224, width=224, channels=3, resize=256, crop=224)
    fast = pixels(data, decode="fast", **spec)
    assert seen == [scaled]  # 1/4: 1/8 would leave a side under 256
    exact = pixels(data, decode="exact", **spec)
    assert seen[-1] == size
    difference = np.abs(fast.astype(int) - exact.astype(int))
    assert 0 < difference.mean() < 2.0  # close, not the same pixels: never passed off as exact


@pytest.mark.parametrize("size", [(1, 2000), (6, 900)])
def test_fast_decodes_a_jpeg_no_dct_scale_covers_at_full_size(monkeypatch, size):
    # libjpeg-turbo (simplejpeg's min_width/min_height) still shrinks the long side of an image
    # whose short side is under the resize, when that side stays the same at a smaller scale
    # (1 or a few pixels): a 1x2000 strip came out 1x250, which the resize then stretched, and
    # fast accepted the strip that exact (and fast in grey, through Pillow's draft) refuses.
    from rm_qdrant.errors import TooLarge

    data = encoded(PHOTO.resize(size), "JPEG", quality=90)
    seen = decoded_sizes(monkeypatch)
    spec = dict(height=16, width=16, resize=16, crop=16)
    pixels(data, decode="fast", channels=3, **spec)
    assert seen == [size]
    limit = 16 * size[1] * 16 // size[0] - 1  # under what the resize would make
    for channels, decode in itertools.product((3, 1), ("exact", "fast")):
        with pytest.raises(TooLarge):
            pixels(data, decode=decode, channels=channels, max_pixels=limit, **spec)


@pytest.mark.parametrize("name", ["png-rgb", "webp", "jpeg-cmyk"])
def test_fast_on_formats_libjpeg_turbo_does_not_decode_stays_close(name):
    mode, fmt, options = FILES[name]
    data = encoded(photo(1200, 800).convert(mode), fmt, **options)
    spec = dict(height=224, width=224, channels=3, resize=256, crop=224)
    fast, exact = (pixels(data, decode=d, **spec) for d in ("fast", "exact"))
    assert np.abs(fast.astype(int) - exact.astype(int)).mean() < 2.0


def test_fast_leaves_an_image_that_needs_no_resize_exact():
    data = encoded(photo(32, 32), "JPEG", quality=90)
    spec = dict(height=32, width=32, channels=3)
    assert np.array_equal(pixels(data, decode="fast", **spec), pixels(data, decode="exact", **spec))


def test_the_exif_turn_happens_before_the_crop_and_the_fast_cover_turns_with_it(monkeypatch):
    data = encoded(photo(2400, 1200), "JPEG", orientation=6, quality=90)  # stored landscape, shown portrait
    seen = decoded_sizes(monkeypatch)
    spec = dict(height=224, width=224, channels=3, resize=256, crop=224)
    turned = pixels(data, orientation="exif", **spec)
    want = team_pipeline(data, interpolation="bilinear", orientation="exif", **spec)
    assert np.array_equal(turned, want)
    assert not np.array_equal(turned, pixels(data, orientation="ignore", **spec))
    pixels(data, orientation="exif", decode="fast", **spec)
    assert seen[-1] == (600, 300)  # 1/4 covers 256 on the short side, turned or not


@pytest.mark.parametrize("tag", [3, 6, 8])
@pytest.mark.parametrize("decode", ["exact", "fast"])
def test_a_tiff_whose_tag_pillow_applies_while_loading_is_turned_once(tmp_path, tag, decode):
    # Pillow's TIFF decoder turns the image as its tag says while it loads, and drops the tag:
    # exif_transpose, which loads first, then leaves it alone. Reading the tag before the
    # decode turned it a second time.
    data = encoded(photo(120, 90), "TIFF", orientation=tag)
    path = tmp_path / "tagged.tif"
    path.write_bytes(data)
    spec = dict(height=32, width=32, channels=3, resize=36, crop=32)
    want = team_pipeline(data, interpolation="bilinear", orientation="exif", **spec)
    with Image.open(path) as opened:
        for given in (data, path, opened):
            assert np.array_equal(pixels(given, orientation="exif", decode=decode, **spec), want)
    assert np.array_equal(pixels(data, orientation="ignore", **spec), want)  # turned by the decoder


def test_a_png_over_the_pixel_cap_is_refused_unread_when_the_tag_is_honoured(monkeypatch):
    # A PNG's EXIF may follow its pixels, so Pillow loads a PNG without one before the IDAT to
    # read its tag: reading the tag before the size check decoded the whole image (hundreds
    # of MB for a 1 MB file under the 20 MB cap) just to refuse it.
    from PIL import PngImagePlugin

    from rm_qdrant.errors import TooLarge

    data = encoded(photo(400, 300), "PNG")
    loads = []
    real = PngImagePlugin.PngImageFile.load

    def spy(self):
        loads.append(self.size)
        return real(self)

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", spy)
    with pytest.raises(TooLarge):
        pixels(data, height=24, width=24, channels=3, orientation="exif", max_pixels=1000)
    assert loads == []


def deep_png(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(values.astype(np.uint16)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_16_bit_grey_png_is_refused_with_its_reason_unless_its_values_fit_8_bits():
    deep = deep_png(np.arange(48 * 64).reshape(48, 64) * 20)
    with pytest.raises(ImageError, match=r"I;16 image \(16 bits a pixel\) holds values from 0 to 61420"):
        pixels(deep, height=24, width=24, channels=3)
    shallow = np.arange(48 * 64).reshape(48, 64) % 256
    got = pixels(deep_png(shallow), height=48, width=64, channels=1)
    assert np.array_equal(got[:, :, 0], shallow.astype(np.uint8))


@pytest.mark.parametrize("decode", ["slow", ""])
def test_an_unknown_decode_or_orientation_is_one_config_error(decode):
    from rm_qdrant.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown decode"):
        pixels(encoded(photo(32, 32), "PNG"), height=8, width=8, channels=3, decode=decode)
    with pytest.raises(ConfigError, match="unknown orientation"):
        pixels(encoded(photo(32, 32), "PNG"), height=8, width=8, channels=3, orientation="auto")
