"""The migration's batched read-backs: records built a batch at once say what one record at a
time said, and the has-vector counts that confirm a batch agree with reading each point."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rm_qdrant.pair.confirm import all_have_vector, having_vector
from rm_qdrant.store.ids import normalize_ids
from rm_qdrant.store.points import record_from, records_from
from rm_qdrant.store.vectors import OtherVector

UUID = "6f9619ff-8b86-d011-b42d-00c04fc964ff"


def point(i, vector, payload=None):
    return SimpleNamespace(id=i, vector=vector, payload=payload)


POINTS = [
    point(1, [1.0, 2.0], {"a": 1}),
    point(UUID.upper(), {"v": [3.0, 4.0], "m": [[1.0, 2.0], [3.0, 4.0]]}, {}),
    point(2, {"m": [[5.0, 6.0]]}),  # lacks "v"; a multivector of one row
    point(3, {"v": [7.0, 8.0], "m": [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]}, None),
]


@pytest.mark.parametrize(
    ("points", "with_vectors", "vector", "others"),
    [
        (POINTS[:1], True, "", ()),
        (POINTS[:1], False, "", ()),
        (POINTS[1:], True, "v", ()),
        (POINTS[1:], True, "m", ()),  # multivectors of 2, 1 and 3 rows
        (POINTS[1:], False, "v", ("m",)),
        (POINTS[1:], True, "v", ("m",)),
        ([], True, "v", ()),
    ],
)
def test_a_batch_of_records_is_each_record_as_one_at_a_time(points, with_vectors, vector, others):
    batch = records_from(points, with_vectors, vector, others)
    single = [record_from(p, with_vectors, vector, others) for p in points]
    assert [(r.id, r.payload) for r in batch] == [(r.id, r.payload) for r in single]
    for got, want in zip(batch, single, strict=True):
        assert (got.vector is None) == (want.vector is None)
        if want.vector is not None:
            assert got.vector.dtype == np.float32 and np.array_equal(got.vector, want.vector)
        assert got.others.keys() == want.others.keys()
        assert all(np.array_equal(got.others[k], want.others[k]) for k in want.others)


def test_ids_are_normalised_a_batch_at_once():
    assert normalize_ids([3, 1, 2]) == [3, 1, 2]
    assert normalize_ids([1, np.int64(2), UUID.upper()]) == [1, 2, UUID]
    assert normalize_ids([]) == []


def test_has_vector_counts_agree_with_reading_each_point(store):
    """A collection where some points lack the vector ``b``; asked about ids that exist and not."""
    store.create_collection("c", dim=3, distance="cosine", vector="a", others=[OtherVector("b", 2, "dot")])
    rng = np.random.default_rng(0)
    ids = list(range(1, 41))
    others = [{"b": rng.normal(size=2).tolist()} if i % 3 else {} for i in ids]
    store.upsert("c", ids, rng.normal(size=(40, 3)).astype(np.float32), vector="a", others=others)
    for asked in ([1, 2, 4, 5], [3, 6, 9], list(range(1, 60, 2)), [7], [99, 100], []):
        truth = {
            r.id for r in store.retrieve("c", asked, with_vectors=True, vector="b") if r.vector is not None
        }
        assert having_vector(store, "c", asked, "b") == truth
        assert all_have_vector(store, "c", asked, "b") == (truth == set(asked))
        assert all_have_vector(store, "c", asked, "a") == (set(asked) <= set(ids))


@pytest.mark.slow
@pytest.mark.parametrize("touched", [False, True])
def test_a_paired_batch_reads_copies_back_only_where_old_changed(store, models, tmp_path, touched):
    """A batch nobody wrote to meanwhile is confirmed with a count: no vector comes back from new
    (a list of floats per point). A point whose payload changed in old after the batch read it is
    read back, and its copy caught up."""
    from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
    from rm_qdrant.migration.migrate import MigrateOptions, run_migration
    from tests.conftest import make_image_folder
    from tests.faults import Recording, Scripted

    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    victim = items[0].point_id
    user = DualIndex.open(store, "p")

    def edit():  # a user's set_payload: old, then new (where the copy is not there yet)
        user.set_payload({"by": "user"}, points=[victim])

    writes_copies = lambda name, args, kw: name == "upsert" and kw.get("insert_only")  # noqa: E731
    calls = Recording(Scripted(store, [("before", writes_copies, edit)] if touched else []))
    report = run_migration(DualIndex.open(calls, "p"), MigrateOptions(batch=100))
    read = [a[1] for f, a, k in calls.log if f == "retrieve" and a[0] == "p-new" and k.get("with_vectors")]
    assert report.moved == len(items) and store.count("old") == 0
    assert {i for ids in read for i in ids} == ({victim} if touched else set())  # then once more, caught up
    edited = store.retrieve("p-new", [victim])[0].payload
    assert edited.get("by") == ("user" if touched else None)


def test_filters_by_id_sets_match_exactly_those_ids_however_many_sets_come_and_go(store):
    """qdrant-edge's id conditions are kept for the last few id sets (a batch's calls share
    one): every count by a set of ids, seen before or not, int or UUID, matches that set."""
    from rm_qdrant.store.filters import with_ids

    rng = np.random.default_rng(3)
    ids = list(range(1, 31)) + [f"00000000-0000-4000-8000-{i:012d}" for i in range(30)]
    store.create_collection("c", dim=2, distance="cosine")
    store.upsert("c", ids, rng.normal(size=(len(ids), 2)).astype(np.float32))
    asked_before = []
    for round in range(40):
        if asked_before and round % 3 == 0:
            asked = asked_before[int(rng.integers(len(asked_before)))]  # a set seen before
        else:
            picked = rng.choice(len(ids) + 10, size=int(rng.integers(1, 12)), replace=False)
            asked = [ids[i] if i < len(ids) else 1000 + int(i) for i in picked]  # some not stored
            asked_before.append(asked)
        assert store.count("c", with_ids(asked)) == len(set(asked) & set(ids)), asked
