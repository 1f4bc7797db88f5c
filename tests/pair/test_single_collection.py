"""The single-collection layout: the new model as a second named vector of the team's collection.

Each test runs on qdrant-edge and on qdrant-client's local mode (the ``store`` fixture).
"""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.merge import Hit, merge, score_to_distance
from rm_qdrant.core.planning import user_payload
from rm_qdrant.errors import ConfigError, MigrationError, Unsupported
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.migration.ranking import plan
from rm_qdrant.operations.cutover import finalize, rollback
from rm_qdrant.operations.drop import drop_pair
from rm_qdrant.serving.status import pair_status
from rm_qdrant.store import Where
from tests.conftest import NEW_DIM, OLD_DIM, make_image_folder
from tests.faults import Scripted, hammer_migration

HAS_NEW = Where(has_vector=("new",))


def make_pair(store, models, items, **kwargs):
    index_images(store, "photos", OnnxEncoder(models.old), items)
    return create_pair(
        store,
        "p",
        old_collection="photos",
        encoder=OnnxEncoder(models.rm),
        layout="single-collection",
        new_vector="new",
        **kwargs,
    )


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    make_pair(store, models, items, old_encoder=OnnxEncoder(models.old))
    return items


def user_vector(seed, dim=NEW_DIM):
    return np.random.default_rng(seed).normal(size=(1, dim)).astype(np.float32)


def two_searches(store, new_q, old_q, limit, filter=None):
    """The client-side merge over the same collection: each vector searched alone, merged in Python."""
    extra = Where(must=filter or {})
    old = store.search("photos", old_q, limit=limit, exact=True, filter=extra & Where(lacks_vector=("new",)))
    new = store.search("photos", new_q, limit=limit, exact=True, vector="new", filter=extra)

    def hits(rows, source):
        return [Hit(r.id, r.score, score_to_distance(r.score, "cosine"), source) for r in rows]

    return [merge(hits(o, "old"), hits(n, "new"), limit) for o, n in zip(old, new, strict=True)]


def assert_same_hits(got, want):
    """Same ids in the same order from the same side; distances equal to float rounding."""
    assert [[(h.id, h.source) for h in row] for row in got] == [
        [(h.id, h.source) for h in row] for row in want
    ]
    for a, b in zip(got, want, strict=True):
        assert np.allclose([h.distance for h in a], [h.distance for h in b], atol=1e-5)


def test_init_adds_a_vector_and_nothing_moves(store, gallery):
    spec = store.collection("photos", "new")
    assert (spec.dim, spec.vectors) == (NEW_DIM, ("", "new"))
    before = {r.id: r.payload for r in store.scroll("photos", limit=1000)[0]}
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=7))
    after = {r.id: r for r in store.scroll("photos", limit=1000, with_vectors=True, vector="new")[0]}
    assert store.list_collections() == ["photos", "rmq_meta"]  # no second collection
    assert set(after) == set(before) and all(r.vector is not None for r in after.values())
    status = pair_status(store, DualIndex.open(store, "p").pair)
    assert (status.old_count, status.new_count, status.fraction) == (0, len(gallery), 1.0)
    finalize(store, DualIndex.open(store, "p").pair)
    assert {r.id: r.payload for r in store.scroll("photos", limit=1000)[0]} == before  # rmq_* fields gone


@pytest.mark.parametrize("filter", [None, {"label": "b"}])
def test_the_one_query_merge_equals_the_client_side_merge(store, gallery, filter):
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=10, until=0.5))
    queries = [i.uri for i in gallery[::3]]
    new_q, old_q = index.query_vectors(queries)
    merged = index.search_vectors_batch(new_q, old_q, limit=12, filter=filter)
    assert_same_hits(merged, two_searches(store, new_q, old_q, 12, filter))
    assert {h.source for row in merged for h in row} == {"old", "new"}  # both vectors served
    assert all(not any(k.startswith("rmq_") for k in h.payload) for row in merged for h in row)


class NoFormula:
    """A server that predates formula queries (Qdrant < 1.20): the one-query merge is refused."""

    def __init__(self, inner):
        self._inner, self.refused = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def merged_search(self, *args, **kwargs):
        self.refused += 1
        raise Unsupported("formula queries need Qdrant 1.20")


def test_a_store_without_formulas_gets_the_same_hits_from_two_searches(store, gallery):
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=10, until=0.5))
    one = DualIndex.open(store, "p", exact=True)
    old_server = NoFormula(store)
    two = DualIndex.open(old_server, "p", exact=True)
    queries = [i.uri for i in gallery[::4]]
    for _ in range(2):
        assert_same_hits(two.search_batch(queries, limit=9), one.search_batch(queries, limit=9))
    assert old_server.refused == 1  # asked once, then two searches


def test_user_writes_carry_the_new_vector_and_are_served_from_new(store, gallery):
    index = DualIndex.open(store, "p", exact=True)
    victim = gallery[0].point_id
    index.upsert([victim], [gallery[1].uri], [{"by": "user"}])  # both vectors: the index has the old model
    stored = store.retrieve("photos", [victim], with_vectors=True, vector="new")[0]
    assert stored.payload == {"by": "user"} and stored.vector is not None
    assert store.retrieve("photos", [victim], with_vectors=True)[0].vector is not None  # old one too
    report = run_migration(index, MigrateOptions(batch=100))
    assert report.moved == len(gallery) - 1  # the user's point was not migrated over
    again = store.retrieve("photos", [victim], with_vectors=True, vector="new")[0]
    assert np.array_equal(again.vector, stored.vector)
    index.delete([victim])
    assert store.retrieve("photos", [victim]) == []


def settle_writes(name, args, kwargs):
    return name == "set_vectors" and kwargs.get("vector") == "new"


def migrate_scripted(store, steps, **options):
    scripted = Scripted(store, steps)
    report = run_migration(DualIndex.open(scripted, "p", exact=True), MigrateOptions(batch=100, **options))
    assert scripted.pending == 0, "a scripted write never found its moment"
    return report


def test_a_user_update_before_the_migration_write_wins(store, gallery):
    victim = gallery[0].point_id
    user = DualIndex.open(store, "p")
    mine = user_vector(1)

    def update():
        user.upsert_vectors([victim], mine, [{"by": "user"}])

    migrate_scripted(store, [("before", settle_writes, update)])
    found = store.retrieve("photos", [victim], with_vectors=True, vector="new")[0]
    assert found.payload == {"by": "user"}
    assert np.allclose(
        found.vector / np.linalg.norm(found.vector), mine[0] / np.linalg.norm(mine[0]), atol=1e-6
    )
    assert store.count("photos", HAS_NEW) == len(gallery)


def test_a_delete_before_the_migration_write_stays_deleted(store, gallery):
    victim = gallery[0].point_id
    user = DualIndex.open(store, "p")
    report = migrate_scripted(store, [("before", settle_writes, lambda: user.delete([victim]))])
    assert store.retrieve("photos", [victim]) == []
    assert report.moved == len(gallery) - 1 and report.gone == 1
    assert store.count("photos") == store.count("photos", HAS_NEW) == len(gallery) - 1


def test_an_old_model_write_after_the_migration_read_is_migrated_again(store, gallery, models):
    """Code that still writes only the old vector (the team's app before its upgrade) rewrites a
    point after the migration embedded it: the point is in old again, and the next run migrates it."""
    victim = gallery[0].point_id

    def legacy_write():
        store.upsert("photos", [victim], user_vector(2, OLD_DIM), [{"uri": gallery[5].uri, "by": "app"}])

    report = migrate_scripted(store, [("after", settle_writes, legacy_write)])
    assert report.unconfirmed == 1
    assert pair_status(store, DualIndex.open(store, "p").pair).old_count == 1
    again = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    assert again.moved == 1 and store.count("photos", HAS_NEW) == len(gallery)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_hammer_user_writes_during_a_migration_every_id_accounted_for(store, models, tmp_path, workers):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=150))
    make_pair(store, models, items)
    ids = [i.point_id for i in items]
    report, last = hammer_migration(store, ids, user_vector, workers=workers)
    assert report.moved > 100 and len(last) >= 20
    stored = {r.id: r for r in store.scroll("photos", limit=10_000, with_vectors=True, vector="new")[0]}
    assert store.count("photos", Where(lacks_vector=("new",))) == 0
    for point in ids:
        wanted = last.get(point)
        if wanted == "deleted":
            assert point not in stored, "a deleted point came back"
        elif wanted is not None:
            assert user_payload(stored[point].payload) == {"version": wanted}, "a user's update was lost"
            expected = user_vector(wanted)[0]
            got = stored[point].vector
            assert np.allclose(got / np.linalg.norm(got), expected / np.linalg.norm(expected), atol=1e-5)
        else:
            assert stored[point].vector is not None


def test_shards_are_qdrant_slices_that_cover_the_gallery_once(store, gallery):
    index = DualIndex.open(store, "p")
    run_migration(index, MigrateOptions(batch=100, limit=0))  # rank only
    parts = [set(plan(store, index.pair, MigrateOptions(shard=(i, 3)))) for i in range(3)]
    for i, part in enumerate(parts):
        sliced = {r.id for r in store.scroll("photos", limit=1000, where=Where(slice=(i, 3)))[0]}
        assert part == sliced
    assert set.union(*parts) == {i.point_id for i in gallery} and sum(map(len, parts)) == len(gallery)
    report = run_migration(index, MigrateOptions(batch=4), workers=3)
    assert report.moved == len(gallery)


def test_rollback_serves_the_old_vector_and_keeps_the_new_ones(store, gallery):
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=10, until=0.5))
    back = rollback(store, index.pair)
    assert back.state == "rolled_back" and back.alias is None
    served = DualIndex.open(store, "p", exact=True)
    hits = served.search(gallery[0].uri, limit=len(gallery))
    assert {h.source for h in hits} == {"old"} and len(hits) == len(gallery)
    assert hits[0].id == gallery[0].point_id and hits[0].distance == pytest.approx(0, abs=1e-5)
    assert store.count("photos", HAS_NEW) == len(gallery) // 2  # unserved, kept
    with pytest.raises(MigrationError, match="rolled_back"):
        finalize(store, back)


def test_finalize_refuses_while_points_lack_the_new_vector_then_drops_the_old_one_later(store, gallery):
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=10, until=0.5))
    with pytest.raises(MigrationError, match="15 points still serve"):
        finalize(store, index.pair)
    with pytest.raises(ConfigError, match="no alias"):
        finalize(store, index.pair, alias="serving")
    run_migration(index, MigrateOptions(batch=10))
    done = finalize(store, index.pair)
    assert store.collection("photos", "new").vectors == ("", "new")  # the old vector stays
    served = DualIndex.open(store, "p", exact=True)
    assert {h.source for h in served.search(gallery[0].uri, limit=30)} == {"new"}
    dropped = finalize(store, done, drop_old=True)
    assert dropped.drop_old and store.collection("photos").vectors == ("new",)
    assert pair_status(store, dropped).fraction == 1.0
    hits = DualIndex.open(store, "p", exact=True).search(gallery[0].uri, limit=3)
    assert hits[0].id == gallery[0].point_id


def test_drop_pair_removes_an_empty_new_vector_and_keeps_a_filled_one(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    make_pair(store, models, items)
    assert drop_pair(store, "p").deleted_new
    assert store.collection("photos").vectors == ("",)
    create_pair(
        store,
        "p",
        old_collection="photos",
        encoder=OnnxEncoder(models.rm),
        layout="single-collection",
        new_vector="new",
    )
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=5, limit=5))
    DualIndex.open(store, "p").upsert_vectors([7], user_vector(1))  # a point with the new vector only
    with pytest.raises(ConfigError, match="hold only the new vector"):
        drop_pair(store, "p")
    assert not drop_pair(store, "p", force=True).deleted_new
    assert store.count("photos", HAS_NEW) == 6
    assert not any(k.startswith("rmq_") for r in store.scroll("photos", limit=100)[0] for k in r.payload)


def test_init_refuses_what_a_single_collection_pair_cannot_be(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=2))
    index_images(store, "photos", OnnxEncoder(models.old), items)
    rm = OnnxEncoder(models.rm)
    single = {"old_collection": "photos", "encoder": rm, "layout": "single-collection"}
    with pytest.raises(ConfigError, match="needs --new-vector"):
        create_pair(store, "p", **single)
    with pytest.raises(ConfigError, match="drop --new-collection and --keep-old"):
        create_pair(store, "p", **single, new_vector="new", new_collection="other")
    with pytest.raises(ConfigError, match="unknown layout"):
        create_pair(store, "p", old_collection="photos", encoder=rm, layout="sideways")
    assert store.collection("photos").vectors == ("",)  # nothing written by a refused init


def test_a_naive_pair_in_one_collection_merges_the_two_models(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=6))
    index_images(store, "photos", OnnxEncoder(models.old), items)
    create_pair(
        store,
        "p",
        old_collection="photos",
        encoder=OnnxEncoder(models.new_only),
        old_encoder=OnnxEncoder(models.old),
        mode="naive",
        layout="single-collection",
        new_vector="new",
    )
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=5, until=0.5))
    new_q, old_q = index.query_vectors([i.uri for i in items[::2]])
    merged = index.search_vectors_batch(new_q, old_q, limit=len(items))
    assert_same_hits(merged, two_searches(store, new_q, old_q, len(items)))
    assert all(len({h.id for h in row}) == len(items) for row in merged)
