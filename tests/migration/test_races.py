"""A user's writes racing the migration: forced interleavings, and a bounded unforced hammer.

The README promises that a user's newer write wins and that a delete stays deleted.
Each forced test pins the user's write into one window of the settle step; the
hammer lets them collide at random and then accounts for every id.
"""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from tests.conftest import NEW_DIM, make_image_folder
from tests.faults import Scripted, Step, hammer_migration


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    return items


def settle_confirms_new(name, args, kwargs):
    """The settle step asking new which copies landed (a count; a read where a copy may differ)."""
    return args[0] == "p-new" and (name == "count" or (name == "retrieve" and kwargs.get("with_vectors")))


def writes_copies(name, args, kwargs):
    return name == "upsert" and args[0] == "p-new" and kwargs.get("insert_only")


def reads_old(name, args, kwargs):
    return name == "retrieve" and args[0] == "old"


def user_vector(seed):
    return np.random.default_rng(seed).normal(size=(1, NEW_DIM)).astype(np.float32)


def migrate_scripted(store, steps):
    scripted = Scripted(store, steps)
    report = run_migration(DualIndex.open(scripted, "p", exact=True), MigrateOptions(batch=100))
    assert scripted.pending == 0, "a scripted write never found its moment"
    return report


def noop():
    pass


@pytest.mark.slow
@pytest.mark.parametrize(
    "window",
    [
        [("after", settle_confirms_new, "update")],  # the copy is confirmed, old not yet retired
        [("after", writes_copies, noop), ("after", reads_old, "update")],  # old read back, new not yet
    ],
    ids=["after-new-confirmed", "between-old-and-new-reads"],
)
def test_an_update_during_the_settle_reads_survives(store, gallery, window):
    """The issue's interleaving: the copy is written and read back, then the user updates the point."""
    victim = gallery[0].point_id
    user = DualIndex.open(store, "p")

    def update():
        user.upsert_vectors([victim], user_vector(1), [{"uri": "user.jpg", "by": "user"}])

    migrate_scripted(store, [(when, test, update if act == "update" else act) for when, test, act in window])
    found = store.retrieve("p-new", [victim])
    assert [r.payload for r in found] == [{"uri": "user.jpg", "by": "user"}]
    assert store.count("old") == 0 and store.count("p-new") == len(gallery)


def test_a_delete_then_re_add_around_the_settle_keeps_the_re_added_point(store, gallery):
    """The user deletes a point before its copy lands (the copy resurrects it), then adds it
    again after the settle step decided to remove the resurrected copy."""
    victim = gallery[0].point_id
    user = DualIndex.open(store, "p")
    steps: list[Step] = [
        ("before", writes_copies, lambda: user.delete([victim])),
        ("after", reads_old, lambda: user.upsert_vectors([victim], user_vector(2), [{"by": "user"}])),
    ]
    migrate_scripted(store, steps)
    assert [r.payload for r in store.retrieve("p-new", [victim])] == [{"by": "user"}]
    assert store.count("old") == 0 and store.count("p-new") == len(gallery)


def test_a_delete_during_the_batch_stays_deleted(store, gallery):
    victim = gallery[0].point_id
    user = DualIndex.open(store, "p")
    migrate_scripted(store, [("before", writes_copies, lambda: user.delete([victim]))])
    assert store.retrieve("p-new", [victim]) == [] and store.retrieve("old", [victim]) == []
    assert store.count("p-new") == len(gallery) - 1


def test_a_hit_payload_written_back_is_the_users_not_a_migration_copy(store, gallery):
    """Bookkeeping fields never reach a user, and a user's write that carries them is still the user's."""
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=100, limit=5))
    hits = index.search_vectors(np.ones(NEW_DIM, np.float32), np.ones(6, np.float32), limit=len(gallery))
    assert all(not any(k.startswith("rmq_") for k in h.payload) for h in hits)
    moved = next(h for h in hits if h.source == "new")
    stored = store.retrieve("p-new", [moved.id])[0].payload
    index.upsert_vectors([moved.id], user_vector(3), [{**stored, "by": "user"}])
    assert "rmq_origin" not in store.retrieve("p-new", [moved.id])[0].payload


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_hammer_user_writes_during_a_migration_every_id_accounted_for(store, models, tmp_path, workers):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=150))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    ids = [i.point_id for i in items]
    report, last = hammer_migration(store, ids, user_vector, workers=workers)
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=20))  # finish any point left in old
    assert report.moved > 100 and len(last) >= 20
    new = {r.id: r.payload for r in store.scroll("p-new", limit=10_000)[0]}
    assert store.count("old") == 0
    for point in ids:
        wanted = last.get(point)
        if wanted == "deleted":
            assert point not in new, "a deleted point came back"
        elif wanted is not None:
            assert new.get(point) == {"version": wanted}, "a user's update was lost or overwritten"
        else:
            assert new[point]["rmq_origin"] == "migrate"
