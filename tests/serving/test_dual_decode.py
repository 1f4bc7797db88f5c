"""Queries decode as the pair records: DualIndex and AsyncDualIndex encode a query image's fast
pixels on a fast pair, leave an encoder the caller passed as it was, and follow a switch of
the mode on refresh."""

from __future__ import annotations

import asyncio

import numpy as np

import rm_qdrant
from rm_qdrant import AsyncDualIndex, DualIndex, OnnxEncoder


def _fast_pair(store, models, photo_folder) -> None:
    rm_qdrant.index(store, photo_folder, encoder=models.old, collection="gallery")
    rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm, decode="fast")


def _vectors(model, image, decode):
    """The ``new`` and ``rev`` vectors of one image decoded ``decode``."""
    out = OnnxEncoder(model, decode=decode).encode([image], ["new", "rev"])
    return out["new"][0], out["rev"][0]


def test_a_query_on_a_fast_pair_is_the_vector_of_its_fast_pixels(store, models, photo_folder):
    _fast_pair(store, models, photo_folder)
    query = sorted(photo_folder.glob("a/*.jpg"))[0]
    fast, exact = _vectors(models.rm, query, "fast"), _vectors(models.rm, query, "exact")
    with DualIndex.open(store, "p") as index:
        new, old = index.query_vectors(query)
        hits = index.search(query, limit=1, exact=True)
    np.testing.assert_allclose(new[0], fast[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(old[0], fast[1], rtol=1e-5, atol=1e-5)
    assert np.abs(new[0] - exact[0]).max() > 1e-2  # not what exact pixels give
    assert hits[0].payload["uri"] == str(query.resolve())


def test_an_encoder_the_caller_passed_is_left_decoding_as_it_did(store, models, photo_folder):
    _fast_pair(store, models, photo_folder)
    query = sorted(photo_folder.glob("b/*.jpg"))[0]
    mine = OnnxEncoder(models.rm)  # exact
    with DualIndex.open(store, "p", encoder=mine) as index:
        new, _ = index.query_vectors(query)
    assert mine.decoding == "exact"
    np.testing.assert_allclose(new[0], _vectors(models.rm, query, "fast")[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        mine.encode([query], ["new"])["new"][0], _vectors(models.rm, query, "exact")[0]
    )


def test_refresh_follows_a_switch_of_the_decode_mode(store, models, photo_folder):
    _fast_pair(store, models, photo_folder)
    query = sorted(photo_folder.glob("a/*.jpg"))[1]
    with DualIndex.open(store, "p") as index:
        report = rm_qdrant.switch_encoder(store, "p", decode="exact")
        assert (report.previous.decode, report.pair.decode, report.migrated) == ("fast", "exact", 0)
        before, _ = index.query_vectors(query)
        index.refresh()
        after, _ = index.query_vectors(query)
    np.testing.assert_allclose(before[0], _vectors(models.rm, query, "fast")[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after[0], _vectors(models.rm, query, "exact")[0], rtol=1e-5, atol=1e-5)


def test_async_queries_decode_as_the_pair_records(store, models, photo_folder):
    _fast_pair(store, models, photo_folder)
    query = sorted(photo_folder.glob("b/*.jpg"))[2]

    async def ask() -> np.ndarray:
        async with await AsyncDualIndex.open(store, "p") as index:
            new, _ = await index.query_vectors(query)
            return new

    new = asyncio.run(ask())
    np.testing.assert_allclose(new[0], _vectors(models.rm, query, "fast")[0], rtol=1e-5, atol=1e-5)
