from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rm_qdrant import ConfigError, ImageError
from rm_qdrant.models.images import as_batch, pixels, to_pil


def png_bytes(array):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_input_kind_gives_the_same_pixels(tmp_path):
    array = np.random.default_rng(0).integers(0, 255, size=(5, 7, 3), dtype=np.uint8)
    path = tmp_path / "x.png"
    path.write_bytes(png_bytes(array))
    for given in (array, png_bytes(array), str(path), path, Image.fromarray(array)):
        assert np.array_equal(pixels(given, height=5, width=7, channels=3), array)


def test_resize_and_grayscale():
    array = np.full((16, 16), 200, dtype=np.uint8)
    out = pixels(array, height=4, width=4, channels=1)
    assert out.shape == (4, 4, 1) and (out == 200).all()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (b"not an image at all", "not a readable image"),
        (np.zeros((4, 4), dtype=np.float32), "must be uint8"),
        (np.zeros((4, 4, 2), dtype=np.uint8), "must be"),
        (3.5, "cannot use float"),
    ],
)
def test_bad_images_are_image_errors(given, message):
    with pytest.raises(ImageError, match=message):
        to_pil(given)


def test_missing_and_truncated_files(tmp_path):
    with pytest.raises(ImageError, match="cannot read image"):
        to_pil(tmp_path / "missing.jpg")
    good = io.BytesIO()
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(good, format="JPEG")
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(good.getvalue()[:200])
    with pytest.raises(ImageError, match="not a readable image"):
        to_pil(broken)


def test_as_batch():
    one = np.zeros((4, 4, 3), dtype=np.uint8)
    assert as_batch(one) == ([one], True)
    batch, single = as_batch(np.zeros((2, 4, 4, 3), dtype=np.uint8))
    assert len(batch) == 2 and not single
    assert as_batch(["a", "b"]) == (["a", "b"], False)


@pytest.mark.parametrize(
    ("width", "height", "resized", "box"),
    [
        (50, 40, (45, 36), (6, 2, 38, 34)),  # landscape: torchvision's int(36 * 50 / 40) = 45
        (40, 64, (36, 57), (2, 12, 34, 44)),  # portrait: top = int(round(12.5)) = 12, as torchvision
        (36, 36, (36, 36), (2, 2, 34, 34)),  # already the size: no resampling
        (97, 61, (57, 36), (12, 2, 44, 34)),
    ],
)
def test_shorter_side_resize_then_centre_crop(width, height, resized, box):
    array = np.random.default_rng(width).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    expected = Image.fromarray(array)
    if expected.size != resized:
        expected = expected.resize(resized, Image.Resampling.BILINEAR)
    expected = np.asarray(expected.crop(box))
    got = pixels(png_bytes(array), height=32, width=32, channels=3, resize=36, crop=32)
    assert got.shape == (32, 32, 3) and np.array_equal(got, expected)
    bgr = pixels(array, height=32, width=32, channels=3, resize=36, crop=32, channel_order="BGR")
    assert np.array_equal(bgr, expected[:, :, ::-1])


def test_resize_and_crop_limits():
    strip = np.zeros((1, 3000, 3), dtype=np.uint8)  # 3,000 pixels, but 108,000 x 36 once resized
    with pytest.raises(ImageError, match="over the 1,000,000-pixel limit"):
        pixels(strip, height=32, width=32, channels=3, resize=36, crop=32, max_pixels=1_000_000)
    with pytest.raises(ImageError, match="empty"):
        pixels(Image.new("RGB", (0, 5)), height=4, width=4, channels=3)
    with pytest.raises(ConfigError, match="do not make a 32x32 image"):
        pixels(strip, height=32, width=32, channels=3, resize=36)


def jpeg_bytes(array, **options):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def pillow_only(monkeypatch):
    from rm_qdrant.models import images

    monkeypatch.setattr(images, "simplejpeg", None)


JPEG_CASES = [
    ((32, 32, 3), {}),
    ((37, 53, 3), {"subsampling": 0, "quality": 95}),  # 4:4:4
    ((40, 30, 3), {"subsampling": 1}),  # 4:2:2
    ((64, 48, 3), {"progressive": True}),
    ((33, 17), {}),  # a grey JPEG
]
PREPROCESSING = [
    {"height": 32, "width": 32, "channels": 3},
    {"height": 24, "width": 24, "channels": 3, "resize": 28, "crop": 24, "channel_order": "BGR"},
    {"height": 16, "width": 16, "channels": 1},
]


@pytest.mark.parametrize(("shape", "options"), JPEG_CASES)
@pytest.mark.parametrize("spec", PREPROCESSING)
def test_the_fast_jpeg_path_gives_pillows_pixels(monkeypatch, tmp_path, shape, options, spec):
    rng = np.random.default_rng(len(shape) * 100 + shape[0])
    data = jpeg_bytes(rng.integers(0, 255, size=shape, dtype=np.uint8), **options)
    path = tmp_path / "x.jpg"
    path.write_bytes(data)
    from rm_qdrant.models import images

    assert images._jpeg_rgbx(data, "x.jpg", images.MAX_PIXELS, None) is not None  # libjpeg-turbo directly
    fast = [pixels(given, **spec) for given in (data, path)]
    pillow_only(monkeypatch)
    slow = pixels(data, **spec)
    assert all(np.array_equal(f, slow) for f in fast)


def test_jpegs_the_fast_path_does_not_take_still_decode_or_fail_as_before(monkeypatch):
    cmyk = io.BytesIO()
    Image.new("CMYK", (8, 6), (10, 200, 30, 40)).save(cmyk, format="JPEG")
    truncated = jpeg_bytes(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8))[:-200]
    big = jpeg_bytes(np.zeros((40, 50, 3), np.uint8))
    fast_cmyk = pixels(cmyk.getvalue(), height=6, width=8, channels=3)
    with pytest.raises(ImageError) as fast_truncated:
        pixels(truncated, height=8, width=8, channels=3)
    with pytest.raises(ImageError, match="50x40 pixels") as fast_big:
        pixels(big, height=8, width=8, channels=3, max_pixels=1000)
    pillow_only(monkeypatch)
    assert np.array_equal(fast_cmyk, pixels(cmyk.getvalue(), height=6, width=8, channels=3))
    with pytest.raises(ImageError) as slow_truncated:
        pixels(truncated, height=8, width=8, channels=3)
    with pytest.raises(ImageError) as slow_big:
        pixels(big, height=8, width=8, channels=3, max_pixels=1000)
    assert str(fast_truncated.value) == str(slow_truncated.value)
    assert str(fast_big.value) == str(slow_big.value)


def test_a_jpeg_the_fast_path_cannot_name_still_decodes(monkeypatch):
    """4:4:1 subsampling (a 4:1:1 photo rotated losslessly): simplejpeg raises KeyError on its header."""
    data = (Path(__file__).parents[1] / "data" / "subsampling-441.jpg").read_bytes()
    fast = pixels(data, height=24, width=16, channels=3)
    pillow_only(monkeypatch)
    assert np.array_equal(fast, pixels(data, height=24, width=16, channels=3))
