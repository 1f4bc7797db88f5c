"""A team collection with vectors rm-qdrant does not manage: ``image`` (cosine, the old model's),
``text`` (dot) and a sparse ``bm25`` (IDF). Writes never drop them, in either layout.

The collection is made with plain qdrant-edge or qdrant-client calls (a shard in an embedded
store, or a ``QdrantClient(path=...)`` folder), with integer or UUID ids.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, open_store, scan_image_folder
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, DimensionMismatch
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize, rollback
from rm_qdrant.store import Where
from tests.conftest import OLD_DIM, make_image_folder

pytestmark = pytest.mark.slow

N = 30
TEXT = 3


def _ids(kind, count, start=0):
    if kind == "int":
        return list(range(start, start + count))
    return [str(uuid.uuid5(uuid.NAMESPACE_URL, f"point-{k}")) for k in range(start, start + count)]


def _sparse(rng):
    indices = sorted(rng.choice(1000, size=3, replace=False).tolist())
    return indices, rng.uniform(0.1, 2.0, size=3).astype(np.float32).tolist()


class Team:
    """The team's gallery: what each point holds, to compare with what rm-qdrant leaves."""

    def __init__(self, models, tmp_path, ids):
        self.items = scan_image_folder(make_image_folder(tmp_path / "images", per_class=10))
        rng = np.random.default_rng(11)
        self.ids = ids
        self.image = OnnxEncoder(models.old).encode([i.uri for i in self.items])["embedding"]
        self.text = {i: rng.normal(size=TEXT).astype(np.float32) for i in ids}
        self.bm25 = {i: _sparse(rng) for i in ids}
        self.payload = {
            i: {"image_url": it.uri, "sku": f"SKU-{k}"} for k, (i, it) in enumerate(zip(ids, self.items))
        }


def _edge_collection(folder, team):
    path = folder / "collections" / "products" / "shard"
    path.parent.mkdir(parents=True)
    config = qe.EdgeConfig(
        vectors={
            "image": qe.EdgeVectorParams(size=OLD_DIM, distance=qe.Distance.Cosine),
            "text": qe.EdgeVectorParams(size=TEXT, distance=qe.Distance.Dot),
        },
        sparse_vectors={"bm25": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )
    shard = qe.EdgeShard.create(str(path), config)
    points = [
        qe.Point(
            i,
            {"image": v.tolist(), "text": team.text[i].tolist(), "bm25": qe.SparseVector(*team.bm25[i])},
            team.payload[i],
        )
        for i, v in zip(team.ids, team.image)
    ]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.close()


def _client_collection(folder, team):
    client = QdrantClient(path=str(folder))
    client.create_collection(
        "products",
        vectors_config={
            "image": qm.VectorParams(size=OLD_DIM, distance=qm.Distance.COSINE),
            "text": qm.VectorParams(size=TEXT, distance=qm.Distance.DOT),
        },
        sparse_vectors_config={"bm25": qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
    )
    bm25 = {i: qm.SparseVector(indices=ix, values=vs) for i, (ix, vs) in team.bm25.items()}
    points = [
        qm.PointStruct(
            id=i,
            vector={"image": v.tolist(), "text": team.text[i].tolist(), "bm25": bm25[i]},
            payload=team.payload[i],
        )
        for i, v in zip(team.ids, team.image)
    ]
    client.upsert("products", points)
    client.close()


@pytest.fixture(params=["edge", "local"])
def backend(request):
    return request.param


@pytest.fixture(params=["int", "uuid"])
def team(request, backend, models, tmp_path):
    """(store, Team): the team's 'products' collection, opened as rm-qdrant opens it."""
    team = Team(models, tmp_path, _ids(request.param, N))
    team.kind = request.param
    folder = tmp_path / "team"
    (_edge_collection if backend == "edge" else _client_collection)(folder, team)
    with open_store(folder, create=False) as store:
        yield store, team


def _pair(store, models, **kwargs):
    return create_pair(
        store,
        "p",
        old_collection="products",
        encoder=OnnxEncoder(models.rm),
        old_encoder=OnnxEncoder(models.old),
        old_vector="image",
        uri=UriRule("image_url"),
        **kwargs,
    )


def _stored(store, collection, ids):
    """Each point's text (numpy), bm25 (indices, values) and payload, as stored."""
    found = store.retrieve(collection, ids, others=("text", "bm25"))
    return {
        r.id: (
            r.others.get("text"),
            None
            if "bm25" not in r.others
            else (list(r.others["bm25"].indices), list(r.others["bm25"].values)),
            r.payload,
        )
        for r in found
    }


def _assert_carried(stored, text, bm25):
    for point, want in text.items():
        assert stored[point][0] is not None, f"point {point} lost its text vector"
        np.testing.assert_allclose(stored[point][0], want, rtol=1e-6)
        assert stored[point][1] is not None, f"point {point} lost its sparse vector"
        assert stored[point][1][0] == bm25[point][0]
        np.testing.assert_allclose(stored[point][1][1], bm25[point][1], rtol=1e-6)


def _app_writes(index, team, rng):
    """The application's writes during the backfill: 3 existing points (one keeps its payload:
    None) and 2 new ones with their text and sparse vectors. Returns the expected state."""
    existing = team.ids[:3]
    added = _ids(team.kind, 2, start=1000)
    images = [team.items[5].uri] * 3 + [team.items[6].uri, team.items[7].uri]
    new_text = {i: rng.normal(size=TEXT).astype(np.float32) for i in added}
    new_bm25 = {i: _sparse(rng) for i in added}
    payloads = [{"image_url": team.items[5].uri, "sku": "updated"}] * 2 + [None]
    payloads += [{"image_url": images[3], "sku": "new-0"}, {"image_url": images[4], "sku": "new-1"}]
    others = [None] * 3 + [
        {"text": new_text[i], "bm25": qm.SparseVector(indices=new_bm25[i][0], values=new_bm25[i][1])}
        for i in added
    ]
    index.upsert(existing + added, images, payloads, other_vectors=others)
    text, bm25 = {**team.text, **new_text}, {**team.bm25, **new_bm25}
    payload = {**team.payload, **dict(zip(existing + added, payloads))}
    payload[existing[2]] = team.payload[existing[2]]  # None: kept
    return text, bm25, payload


def test_single_collection_writes_keep_other_vectors_through_finalize_drop_old(team, models):
    store, gallery = team
    _pair(store, models, layout="single-collection", new_vector="new")
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=7, until=0.5))
    text, bm25, payload = _app_writes(index, gallery, np.random.default_rng(5))
    run_migration(index, MigrateOptions(batch=7))
    finalize(store, index.pair, drop_old=True)
    assert store.collection("products", "new").vectors == ("new", "text")  # the old vector is gone
    every = list(text)
    stored = _stored(store, "products", every)
    assert set(stored) == set(every) and len(every) == N + 2
    _assert_carried(stored, text, bm25)
    assert {i: s[2] for i, s in stored.items()} == payload  # no rmq_* left, the kept one kept
    assert store.count("products", Where(has_vector=("new",))) == N + 2


def test_paired_layout_mirrors_other_vectors_and_carries_them(team, models):
    store, gallery = team
    record = _pair(store, models)
    spec = store.collection("p-new", "image")
    assert {(o.name, o.dim, o.distance, o.sparse, o.idf) for o in spec.extra} == {
        ("text", TEXT, "dot", False, False),
        ("bm25", 0, "", True, True),
    }
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=7, until=0.5))
    moved = [r.id for r in store.scroll("p-new", limit=100)[0]]
    assert len(moved) == N // 2
    _assert_carried(_stored(store, "p-new", moved), {i: gallery.text[i] for i in moved}, gallery.bm25)
    text, bm25, payload = _app_writes(index, gallery, np.random.default_rng(5))
    run_migration(index, MigrateOptions(batch=7))
    assert store.count("products") == 0
    finalize(store, index.pair)
    served = store.alias(record.name)
    assert served == "p-new"
    stored = _stored(store, served, list(text))
    assert len(stored) == N + 2
    _assert_carried(stored, text, bm25)
    assert {i: s[2] for i, s in stored.items()} == payload


def test_a_keep_old_rollback_serves_every_other_vector(team, models):
    store, gallery = team
    _pair(store, models, keep_old=True)
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=7, until=0.5))
    text, bm25, payload = _app_writes(index, gallery, np.random.default_rng(6))
    record = rollback(store, index.pair)
    assert store.alias(record.alias) == "products"
    stored = _stored(store, "products", list(text))
    assert len(stored) == N + 2
    _assert_carried(stored, text, bm25)
    assert {i: s[2] for i, s in stored.items()} == payload
    index.refresh()
    hits = index.search(gallery.items[0].uri, limit=2 * N)
    assert {h.id for h in hits} == set(text) and {h.source for h in hits} == {"old"}


def test_other_vectors_given_by_name_as_columns(team, models):
    store, gallery = team
    _pair(store, models)
    index = DualIndex.open(store, "p")
    added = _ids(gallery.kind, 2, start=2000)
    text = np.arange(2 * TEXT, dtype=np.float32).reshape(2, TEXT)
    index.upsert(added, [gallery.items[0].uri] * 2, [{"k": 1}, {"k": 2}], other_vectors={"text": text})
    stored = _stored(store, "p-new", added)
    np.testing.assert_allclose(np.stack([stored[i][0] for i in added]), text)
    assert all(stored[i][1] is None for i in added)  # not given, and the points are new: none


@pytest.mark.parametrize(
    ("others", "error", "message"),
    [
        ({"txt": [1.0, 2.0, 3.0]}, ConfigError, "has no other vector 'txt' (it has 'text', 'bm25' (sparse))"),
        (
            {"image": [0.0] * OLD_DIM},
            ConfigError,
            "is the models' own vector (the old model's in old, the new one's in new): rm-qdrant writes it",
        ),
        ({"text": [1.0, 2.0]}, DimensionMismatch, "vector 'text' of 'p-new' holds 3 numbers"),
        ({"text": [1.0, float("nan"), 2.0]}, ConfigError, "contains NaN or infinity"),
        ({"bm25": {"indices": [1, 1], "values": [0.5, 0.5]}}, ConfigError, "indices must be distinct"),
        ({"bm25": [1.0, 2.0]}, ConfigError, "expected indices and values"),
    ],
)
def test_bad_other_vectors_are_one_clear_error_and_write_nothing(team, models, others, error, message):
    store, gallery = team
    _pair(store, models)
    index = DualIndex.open(store, "p")
    point = _ids(gallery.kind, 1, start=3000)
    with pytest.raises(error) as caught:
        index.upsert(point, [gallery.items[0].uri], [{"k": 1}], other_vectors=[others])
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert store.retrieve("p-new", point) == [] and store.retrieve("products", point) == []


def test_single_collection_updates_through_the_old_api_keep_other_vectors(team, models):
    """The issue's report, with the calls an application already makes: updated points lost
    their text vector, and after finalize --drop-old had none."""
    store, gallery = team
    _pair(store, models, layout="single-collection", new_vector="new")
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(batch=7, until=0.5))
    updated = gallery.ids[:10]
    index.upsert(updated, [gallery.items[0].uri] * 10, [{"image_url": gallery.items[0].uri}] * 10)
    run_migration(index, MigrateOptions(batch=7))
    finalize(store, index.pair, drop_old=True)
    stored = {
        r.id: r.vector for r in store.retrieve("products", gallery.ids, with_vectors=True, vector="text")
    }
    assert [i for i in gallery.ids if stored[i] is None] == []  # the issue: 10 points had lost it
    for point in gallery.ids:
        np.testing.assert_allclose(stored[point], gallery.text[point], rtol=1e-6)
    _assert_carried(_stored(store, "products", gallery.ids), gallery.text, gallery.bm25)


def test_the_eval_sandbox_of_such_a_pair_migrates_without_them(team, models):
    """rmq eval measures a copy that holds the searched vector only: with no other vectors on
    either side, the copy's migration carries none, and the team's collections are untouched."""
    from rm_qdrant.evaluation.sandbox import sandbox

    store, gallery = team
    record = _pair(store, models)
    with sandbox(store, record) as (copy, copied):
        assert copy.collection("p-new", "image").extra == ()
        report = run_migration(DualIndex.open(copy, copied.name), MigrateOptions(batch=7))
        assert report.moved == N and copy.count("products") == 0
    assert store.count("p-new") == 0 and store.count("products") == N
