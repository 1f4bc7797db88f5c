"""AsyncDualIndex: the same answers as DualIndex, awaited, with the event loop free meanwhile."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rm_qdrant import AsyncDualIndex, ConfigError, DualIndex, create_pair
from tests.conftest import OLD_DIM
from tests.serving.test_dual import linear_rm_with_dims, unit

N = 60


def same(a, b):
    """The same hits in the same order (scores equal up to float32 rounding)."""
    assert [(h.id, h.source, h.payload) for h in a] == [(h.id, h.source, h.payload) for h in b]
    assert [h.distance for h in a] == pytest.approx([h.distance for h in b], abs=1e-6)
    return True


@pytest.fixture(params=["paired", "single-collection"])
def pair(request, store, models):
    store.create_collection("photos", dim=OLD_DIM, distance="cosine")
    gallery = unit(N, OLD_DIM, 1)
    store.upsert("photos", list(range(N)), gallery, [{"price": float(i)} for i in range(N)])
    options = {"layout": "single-collection", "new_vector": "new"} if request.param != "paired" else {}
    create_pair(store, "p", old_collection="photos", encoder=linear_rm_with_dims(models, OLD_DIM), **options)
    moved = list(range(0, N, 2))
    DualIndex.open(store, "p", exact=True).upsert_vectors(
        moved, gallery[moved], [{"price": float(i)} for i in moved]
    )
    return store, gallery


def test_awaited_calls_answer_as_the_blocking_ones(pair, image_folder):
    store, gallery = pair
    images = sorted(image_folder.rglob("*.png"))[:3]
    blocking = DualIndex.open(store, "p", exact=True)
    queries = unit(4, OLD_DIM, 5)

    async def main():
        async with await AsyncDualIndex.open(store, "p", exact=True) as index:
            batch = await index.search_vectors_batch(queries, queries, limit=7, offset=2)
            many = await asyncio.gather(
                *(index.search_vectors(q, q, limit=5, filter={"price": {"lt": 30}}) for q in queries)
            )
            by_image = await index.search(images[0], limit=4)
            fraction = await index.progress()
            return batch, many, by_image, fraction, index.pair.state

    batch, many, by_image, fraction, state = asyncio.run(main())
    want = blocking.search_vectors_batch(queries, queries, limit=7, offset=2)
    assert all(same(got, row) for got, row in zip(batch, want, strict=True))
    for got, q in zip(many, queries, strict=True):
        assert same(got, blocking.search_vectors(q, q, limit=5, filter={"price": {"lt": 30}}))
    assert all(h.payload["price"] < 30 for hits in many for h in hits)
    assert same(by_image, blocking.search(images[0], limit=4))
    assert (fraction, state) == (blocking.progress(), "backfilling")


def test_awaited_writes_land_and_errors_reach_the_caller(pair):
    store, gallery = pair
    fresh = unit(2, OLD_DIM, 9)

    async def main():
        index = await AsyncDualIndex.open(store, "p", exact=True)
        await index.upsert_vectors([500, 501], fresh, [{"price": -1.0}, {"price": -2.0}])
        found = await index.search_vectors(fresh[0], fresh[0], limit=1)
        await index.delete([500])
        after = await index.search_vectors(fresh[0], fresh[0], limit=1)
        await index.set_payload({"price": -5.0}, [501, 1])
        points = await index.retrieve([501, 1, 999])
        counted = await index.count({"price": {"lt": 0}})
        with pytest.raises(ConfigError, match="offset"):
            await index.search_vectors(fresh[0], fresh[0], offset=-1)
        await index.close()
        with pytest.raises(ConfigError, match="this AsyncDualIndex is closed"):
            await index.count()
        return found, after, points, counted

    found, after, points, counted = asyncio.run(main())
    assert [(p.id, p.source, p.payload) for p in points] == [
        (501, "new", {"price": -5.0}),
        (1, "old", {"price": -5.0}),
    ]
    assert counted == 2
    assert (found[0].id, found[0].source, found[0].payload) == (500, "new", {"price": -1.0})
    assert after[0].id != 500


def test_the_event_loop_runs_while_a_search_blocks(pair):
    """A search that waits on the store must not hold the loop: here the store's search blocks
    until a coroutine on the loop releases it, which it can only do if the loop is free."""
    store, _ = pair
    released = threading.Event()
    index = DualIndex.open(store, "p", exact=True)
    original_search, original_merged = store.search, store.merged_search

    def waits(original):
        def call(*args, **kwargs):
            assert released.wait(timeout=30), "the event loop never ran while the search blocked"
            return original(*args, **kwargs)

        return call

    store.search, store.merged_search = waits(original_search), waits(original_merged)

    async def main():
        async_index = AsyncDualIndex(index)
        q = unit(1, OLD_DIM, 3)[0]
        search = asyncio.ensure_future(async_index.search_vectors(q, q, limit=3))
        await asyncio.sleep(0)  # the search is on its thread now
        released.set()  # a coroutine ran while the search waited
        hits = await search
        await async_index.close()
        return hits

    try:
        hits = asyncio.run(main())
    finally:
        store.search, store.merged_search = original_search, original_merged
    assert len(hits) == 3


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_a_bad_worker_count_is_refused(pair, workers):
    store, _ = pair
    with pytest.raises(ConfigError, match="workers"):
        AsyncDualIndex(DualIndex.open(store, "p"), workers=workers)
