"""The migration decodes the gallery as the pair records: the local engine, and the Ray engine's
decode tasks, with a graph stamped with a resize and a centre crop (torchvision's Resize(10) +
CenterCrop(8)), so fast decoding takes a 1600x1067 JPEG at 1/8 DCT scale and resizes only the crop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rm_qdrant
from rm_qdrant import DualIndex, InputSpec, MigrateOptions, OnnxEncoder, RayOptions, open_store
from rm_qdrant.core.uris import UriRule
from rm_qdrant.migration.migrate import run_migration
from rm_qdrant.migration.ray_workers import decode_chunk
from rm_qdrant.models.images import pixels
from rm_qdrant.sources import SourceConfig
from rm_qdrant_exporters.linear import linear_encoder

CROP = InputSpec(height=8, width=8, channels=3, resize=10, crop=8)


@pytest.fixture(scope="module")
def crop_rm(models, tmp_path_factory) -> Path:
    """The rm graph of the shared models, stamped to resize the shorter side to 10 and crop 8x8."""
    path = tmp_path_factory.mktemp("crop") / "crop-rm.onnx"
    return linear_encoder(
        path, [("new", "pixels", models.w_new), ("rev", "new", models.w_rev)], input_spec=CROP, name="crop-rm"
    )


def _photos(photo_folder: Path) -> list[tuple[str, dict[str, str]]]:
    return [(str(i), {"uri": str(p)}) for i, p in enumerate(sorted(photo_folder.rglob("*.jpg")))]


def _crop_pixels(path: str, decode: str) -> np.ndarray:
    return pixels(path, height=8, width=8, channels=3, resize=10, crop=8, decode=decode)


def test_a_ray_decode_task_decodes_as_it_is_told(crop_rm, photo_folder):
    points = _photos(photo_folder)
    info = OnnxEncoder(crop_rm).info
    fast = decode_chunk(info, SourceConfig(), UriRule(), points, 2, "fast")
    exact = decode_chunk(info, SourceConfig(), UriRule(), points, 2)  # a task of an older driver: exact
    for row, (_, payload) in enumerate(points):
        assert np.array_equal(fast.pixels[row], _crop_pixels(payload["uri"], "fast"))
        assert np.array_equal(exact.pixels[row], _crop_pixels(payload["uri"], "exact"))
    assert not np.array_equal(fast.pixels, exact.pixels)


def _fast_pair(store, models, photo_folder, encoder: Path) -> None:
    rm_qdrant.index(store, photo_folder, encoder=models.old, collection="gallery")
    rm_qdrant.init(store, "p", old_collection="gallery", encoder=encoder, decode="fast")


def _migrated(store) -> tuple[list[str], np.ndarray]:
    page, _ = store.scroll("p-new", limit=100, with_vectors=True)
    page = sorted(page, key=lambda r: r.payload["uri"])
    return [r.payload["uri"] for r in page], np.stack([np.asarray(r.vector) for r in page])


def _unit_vectors(encoder: Path, uris: list[str], decode: str) -> np.ndarray:
    rows = OnnxEncoder(encoder, decode=decode).encode([Path(u) for u in uris], ["new"])["new"]
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_local_migration_of_a_fast_pair_embeds_fast_pixels_of_the_crop(
    store, models, photo_folder, crop_rm
):
    _fast_pair(store, models, photo_folder, crop_rm)
    rm_qdrant.migrate(store, "p", batch=4)
    uris, vectors = _migrated(store)
    assert len(uris) == 6
    np.testing.assert_allclose(vectors, _unit_vectors(crop_rm, uris, "fast"), atol=1e-5)
    assert np.abs(vectors - _unit_vectors(crop_rm, uris, "exact")).max() > 1e-3


@pytest.mark.slow
def test_the_ray_engine_decodes_a_fast_pair_fast(models, photo_folder, crop_rm, tmp_path, local_ray):
    store = open_store(tmp_path / "q")
    try:
        _fast_pair(store, models, photo_folder, crop_rm)
        report = run_migration(
            DualIndex.open(store, "p"), MigrateOptions(batch=4), ray=RayOptions(encoders=1, decoders=2)
        )
        assert (report.moved, report.failed) == (6, 0)
        uris, vectors = _migrated(store)
        np.testing.assert_allclose(vectors, _unit_vectors(crop_rm, uris, "fast"), atol=1e-5)
    finally:
        store.close()
