"""A --keep-old pair keeps a rollback whole: what the application writes during the backfill
is written to old too (by the old model), hidden there until a rollback serves it."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.planning import INTERNAL_FIELDS
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize, rollback
from rm_qdrant.serving.status import pair_status
from tests.conftest import make_image_folder

N = 30


@pytest.fixture
def pair(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(
        store,
        "p",
        old_collection="old",
        encoder=OnnxEncoder(models.rm),
        keep_old=True,
        old_encoder=OnnxEncoder(models.old),
    )
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(until=0.5, batch=7))
    return index, items


def _once(hits) -> set:
    ids = [h.id for h in hits]
    assert len(ids) == len(set(ids)), "a point served twice"
    return set(ids)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def test_writes_during_the_backfill_are_served_after_a_rollback(store, models, pair):
    index, items = pair
    migrated = {r.id for r in store.scroll("p-new", limit=100)[0]}
    others = items[:5] + items[6:-1]  # items[5] is deleted below, items[-1] holds the image
    moved = next(i for i in others if i.point_id in migrated)
    waiting = next(i for i in others if i.point_id not in migrated)
    image = items[-1].uri
    added = [10_000 + k for k in range(3)]
    index.upsert(
        added, [items[k].uri for k in range(3)], [{"uri": items[k].uri, "by": "app"} for k in range(3)]
    )
    updated = [moved.point_id, waiting.point_id]
    index.upsert(updated, [image, image], [{"uri": image, "by": "app"}] * 2)
    index.delete([items[5].point_id])
    expected_ids = {i.point_id for i in items} - {items[5].point_id} | set(added)

    during = index.search(image, limit=3 * N)
    assert _once(during) == expected_ids  # each point once, none lost
    assert {h.source for h in during if h.id in set(added) | set(updated)} == {"new"}

    record = rollback(store, index.pair)
    index.refresh()
    after = index.search(image, limit=3 * N)
    assert _once(after) == expected_ids and {h.source for h in after} == {"old"}
    assert pair_status(store, record).old_count == len(expected_ids)
    old_model = OnnxEncoder(models.old)
    want = old_model.encode([image])["embedding"][0]
    for point in store.retrieve("old", updated, with_vectors=True):
        assert point.payload == {"uri": image, "by": "app"}  # no bookkeeping left after the rollback
        np.testing.assert_allclose(_unit(point.vector), _unit(want), atol=1e-5)
    # the updated points now hold the new image, as does the gallery's own copy of it
    assert {h.id for h in after[:3]} == {*updated, items[-1].point_id}


def test_vectors_only_writes_take_old_vectors_for_a_rollback(store, pair, caplog):
    index, _ = pair
    rng = np.random.default_rng(0)
    new = rng.normal(size=(2, index._new_dim)).astype(np.float32)
    old = rng.normal(size=(2, index._old_dim)).astype(np.float32)
    index.upsert_vectors([501, 502], new, [{"k": 1}, {"k": 2}], old_vectors=old)
    kept = store.retrieve("old", [501, 502], with_vectors=True)
    assert [p.id for p in kept] == [501, 502] and all(set(p.payload) & set(INTERNAL_FIELDS) for p in kept)
    with caplog.at_level(logging.WARNING, logger="rm_qdrant.serving.dual"):
        index.upsert_vectors([503], new[:1], [{"k": 3}])  # no old vector: new only, and said
    assert "rollback" in caplog.text and not store.retrieve("old", [503])
    record = rollback(store, index.pair)
    assert pair_status(store, record).old_count == N + 2


def test_finalize_after_app_writes_serves_new_and_keeps_them(store, pair):
    index, items = pair
    index.upsert([777], [items[0].uri], [{"by": "app"}])
    run_migration(index, MigrateOptions(batch=7))
    record = finalize(store, index.pair)
    index.refresh()
    hits = index.search(items[0].uri, limit=2 * N)
    assert record.state == "finalized" and {h.source for h in hits} == {"new"}
    assert _once(hits) == {i.point_id for i in items} | {777}


def test_a_finalized_keep_old_pair_counts_its_kept_copies_no_more(store, pair):
    """After the cutover new serves alone: the copies kept in old for a rollback are not
    points still to migrate (status said 50 % migrated here)."""
    index, items = pair
    run_migration(index, MigrateOptions(batch=7))
    record = finalize(store, index.pair)
    status = pair_status(store, record)
    assert (status.old_count, status.new_count, status.kept_count) == (0, len(items), 0)
    assert status.fraction == 1.0
