"""DualIndex.set_payload racing a migration batch: forced interleavings.

A batch reads a point's payload from old, writes its copy to new (insert-only), reads both
back and retires the point from old. An update that lands in old after the read and in new
before the copy would be lost with the old copy; the settle step finds it in old and brings
the copy up to date, never over a user's own later write, and never resurrecting a delete.
"""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.planning import ORIGIN
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import rollback
from tests.conftest import NEW_DIM, make_image_folder
from tests.faults import Scripted, Step

LAYOUTS = {
    "paired": {},
    "keep-old": {"keep_old": True},
    "single": {"layout": "single-collection", "new_vector": "new"},
}


def make(store, models, tmp_path, layout):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    index_images(store, "old", OnnxEncoder(models.old), items)
    encoder, old = OnnxEncoder(models.rm), OnnxEncoder(models.old)
    create_pair(store, "p", old_collection="old", encoder=encoder, old_encoder=old, **LAYOUTS[layout])
    return layout, items


@pytest.fixture(params=list(LAYOUTS))
def gallery(request, store, models, tmp_path):
    return make(store, models, tmp_path, request.param)


@pytest.fixture(params=["paired", "keep-old"])
def copies(request, store, models, tmp_path):
    """Two collections: the layouts where a migrated point is a copy that can fall behind."""
    return make(store, models, tmp_path, request.param)


def writes_copies(name, args, kwargs):
    """The batch's write to new: the insert-only copies (one collection: the new vectors)."""
    return (name == "upsert" and kwargs.get("insert_only")) or name == "set_vectors"


def settle_reads_old(name, args, kwargs):
    """The settle step's read of old (after the copies, so the claim's read does not match)."""
    return name == "retrieve" and args[0] == "old" and not kwargs.get("with_vectors")


def catches_up(name, args, kwargs):
    """The catch-up's conditional delete of a copy that fell behind old."""
    return name == "delete" and args[0] == "p-new" and kwargs.get("where") is not None


def migrate_scripted(store, steps):
    scripted = Scripted(store, steps)
    run_migration(DualIndex.open(scripted, "p", exact=True), MigrateOptions(batch=100))
    assert scripted.pending == 0, "a scripted call never found its moment"


def served(store, point_id):
    """The point as the pair serves it, and its source."""
    found = DualIndex.open(store, "p").retrieve([point_id])
    return (found[0].payload, found[0].source) if found else None


def test_an_update_inside_a_migration_batch_survives(store, gallery):
    layout, items = gallery
    victim = items[0]
    user = DualIndex.open(store, "p")
    migrate_scripted(
        store, [("before", writes_copies, lambda: user.set_payload({"tag": "late"}, [victim.point_id]))]
    )
    payload, source = served(store, victim.point_id)
    assert (payload["tag"], payload["uri"], source) == ("late", victim.uri, "new")
    index = DualIndex.open(store, "p")
    assert index.count() == len(items) and index.count({"tag": "late"}) == 1
    if layout != "paired":  # the rollback copy has it too
        rollback(store, index.pair)
        payload, source = served(store, victim.point_id)
        assert (payload["tag"], payload["uri"], source) == ("late", victim.uri, "old")


def test_a_second_update_during_the_catch_up_wins(store, copies):
    _, items = copies
    victim = items[0].point_id
    user = DualIndex.open(store, "p")
    steps: list[Step] = [
        ("before", writes_copies, lambda: user.set_payload({"tag": "first"}, [victim])),
        ("after", settle_reads_old, lambda: user.set_payload({"tag": "second", "n": 2}, [victim])),
        ("after", catches_up, lambda: user.set_payload({"tag": "third"}, [victim])),
    ]
    migrate_scripted(store, steps)
    payload, source = served(store, victim)
    assert (payload["tag"], payload["n"], source) == ("third", 2, "new")


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["before the catch-up", "inside the catch-up"])
def test_a_users_upsert_racing_the_catch_up_wins(store, copies, moment):
    _, items = copies
    victim = items[0].point_id
    user = DualIndex.open(store, "p")
    vector = np.random.default_rng(1).normal(size=(1, NEW_DIM)).astype(np.float32)

    def upsert():
        user.upsert_vectors([victim], vector, [{"by": "user"}])

    steps: list[Step] = [("before", writes_copies, lambda: user.set_payload({"tag": "late"}, [victim]))]
    steps += (
        [("after", settle_reads_old, upsert)]
        if moment == "before the catch-up"
        else [("after", catches_up, upsert)]
    )
    migrate_scripted(store, steps)
    assert served(store, victim) == ({"by": "user"}, "new")
    stored = store.retrieve("p-new", [victim], with_vectors=True)[0]
    assert ORIGIN not in stored.payload
    np.testing.assert_allclose(
        stored.vector / np.linalg.norm(stored.vector), vector[0] / np.linalg.norm(vector), atol=1e-5
    )


def test_a_delete_inside_the_catch_up_stays_deleted(store, copies):
    _, items = copies
    victim = items[0].point_id
    user = DualIndex.open(store, "p")
    steps: list[Step] = [
        ("before", writes_copies, lambda: user.set_payload({"tag": "late"}, [victim])),
        ("after", catches_up, lambda: user.delete([victim])),
    ]
    migrate_scripted(store, steps)
    assert served(store, victim) is None
    assert store.retrieve("p-new", [victim]) == [] and store.retrieve("old", [victim]) == []
    assert DualIndex.open(store, "p").count() == len(items) - 1


def test_a_new_image_set_inside_a_batch_is_embedded_not_the_previous_one(store, models, gallery):
    """An update of the uri field names another image: the batch's vector is the previous
    image's, so the point stays in old (with its new uri) and the next run embeds the new image."""
    layout, items = gallery
    victim, other = items[0], items[-1]
    user = DualIndex.open(store, "p")
    steps: list[Step] = [
        ("before", writes_copies, lambda: user.set_payload({"uri": other.uri}, [victim.point_id]))
    ]
    migrate_scripted(store, steps)
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    payload, source = served(store, victim.point_id)
    assert (payload["uri"], source) == (other.uri, "new")
    pair = DualIndex.open(store, "p").pair
    stored = store.retrieve(pair.new_collection, [victim.point_id], with_vectors=True, vector=pair.new_using)[
        0
    ]
    want = OnnxEncoder(models.rm).encode([other.uri])["new"][0]
    np.testing.assert_allclose(
        stored.vector / np.linalg.norm(stored.vector), want / np.linalg.norm(want), atol=1e-5
    )
