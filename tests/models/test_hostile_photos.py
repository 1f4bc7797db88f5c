"""Bad photos, both decode modes: each is decoded as the stamp describes or refused with its reason,
before any pixel is decoded where the header already says it is too large.

The files are the ones ``benchmarks/photo_memory.py`` measures (peak memory per file).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rm_qdrant.errors import ImageError, TooLarge
from rm_qdrant.models.images import pixels

_SPEC = importlib.util.spec_from_file_location(
    "photo_memory", Path(__file__).resolve().parents[2] / "benchmarks" / "photo_memory.py"
)
photo_memory = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
_SPEC.loader.exec_module(photo_memory)  # type: ignore[union-attr]
INPUT = dict(height=224, width=224, channels=3, resize=256, crop=224)


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return photo_memory.cases()


@pytest.mark.parametrize("decode", ["exact", "fast"])
def test_every_bad_photo_is_decoded_or_refused_with_its_reason(files, decode):
    outcomes = {}
    for name, data in files.items():
        try:
            got = pixels(data, decode=decode, orientation="exif" if "EXIF" in name else "ignore", **INPUT)
            outcomes[name] = got.shape
        except ImageError as exc:
            outcomes[name] = (type(exc).__name__, str(exc))
    decoded = [n for n, o in outcomes.items() if o == (224, 224, 3)]
    assert sorted(decoded) == sorted(
        [
            "baseline (32x32 JPEG)",
            "12 MP JPEG",
            "12 MP progressive JPEG",
            "12 MP CMYK JPEG",
            "12 MP JPEG, EXIF 6",
            "12 MP PNG",
            "12 MP WebP",
        ]
    )
    assert outcomes["PNG declaring 100,000x100,000"][0] == "TooLarge"
    assert outcomes["JPEG declaring 65,500x65,500"] == (
        "TooLarge",
        "the image is 65500x65500 pixels, over the 40,000,000-pixel limit",
    )
    assert "truncated" in outcomes["12 MP JPEG, truncated at half"][1]
    assert "16 bits a pixel" in outcomes["12 MP 16-bit grey PNG"][1]
    assert all("\n" not in o[1] for o in outcomes.values() if isinstance(o[1], str))


def test_a_bomb_is_refused_under_a_limit_set_lower_too(files):
    with pytest.raises(TooLarge, match="over the 1,000,000-pixel limit"):
        pixels(files["12 MP JPEG"], max_pixels=1_000_000, **INPUT)
    with pytest.raises(TooLarge, match="over the 1,000,000-pixel limit"):
        pixels(files["12 MP PNG"], max_pixels=1_000_000, **INPUT)
