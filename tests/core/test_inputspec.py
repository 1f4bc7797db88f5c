"""The metadata's ``input.interpolation``: Pillow's filter for every resize, bilinear when absent."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from rm_qdrant import ConfigError, EncoderError
from rm_qdrant.core.inputspec import INTERPOLATIONS, InputSpec, parse_input
from rm_qdrant.models.images import pixels


def test_absent_is_bilinear_and_the_default_is_not_written():
    assert parse_input({"height": 8, "width": 8}).interpolation == "bilinear"
    assert "interpolation" not in InputSpec(8, 8).to_json()
    spec = InputSpec(8, 8, mean=(0.0,) * 3, std=(1.0,) * 3, resize=10, crop=8, interpolation="hamming")
    assert parse_input(spec.to_json()) == spec
    assert "resize 10 + centre crop 8 (hamming)" in spec.describe()


def test_an_unknown_filter_names_the_allowed_ones():
    with pytest.raises(EncoderError) as caught:
        parse_input({"height": 8, "width": 8, "interpolation": "area"})
    assert str(caught.value) == (
        "input.interpolation must be one of nearest, bilinear, bicubic, lanczos, box, hamming, got 'area'"
    )
    with pytest.raises(ConfigError, match="unknown interpolation 'area'; expected one of nearest, bilinear"):
        pixels(np.zeros((4, 4, 3), np.uint8), height=2, width=2, channels=3, interpolation="area")


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("channels", [1, 3])
def test_pixels_resize_with_pillows_filter(interpolation, channels):
    array = np.random.default_rng(4).integers(0, 256, size=(23, 41, 3), dtype=np.uint8)
    image = Image.fromarray(array).convert("RGB" if channels == 3 else "L")
    want = np.asarray(image.resize((9, 7), Image.Resampling[interpolation.upper()]))
    got = pixels(array, height=7, width=9, channels=channels, interpolation=interpolation)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
