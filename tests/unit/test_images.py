from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from rm_qdrant import ImageError
from rm_qdrant.images import as_batch, pixels, to_pil


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
