"""DualIndex over a real pair of collections: merge, writes, and refusing mismatched models."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import (
    CollectionNotFound,
    ConfigError,
    DimensionMismatch,
    DualIndex,
    OnnxEncoder,
    create_pair,
    index_images,
    load_pair,
    scan_image_folder,
)
from rm_qdrant.core.planning import MOVING
from rm_qdrant.operations.drop import drop_pair
from tests.conftest import NEW_DIM, OLD_DIM, says_remote


@pytest.fixture
def pair(store, models, image_folder):
    """The old collection indexed with the old model, and an rm-mode pair over it."""
    items = scan_image_folder(image_folder)
    report = index_images(store, "gallery", OnnxEncoder(models.old), items)
    assert report.indexed == len(items) and not report.failed
    create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(models.rm))
    return items


def unit(rows, dim, seed):
    x = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_merged_top_k_equals_exact_top_k_over_the_union(store, models):
    """Same space on both sides: the merged list must be the union's exact top-k, ids and order."""
    store.create_collection("old", dim=OLD_DIM, distance="cosine")
    gallery, queries = unit(400, OLD_DIM, 1), unit(30, OLD_DIM, 2)
    store.upsert("old", list(range(400)), gallery)
    rm = linear_rm_with_dims(models, OLD_DIM)
    create_pair(store, "p", old_collection="old", encoder=rm)
    index = DualIndex.open(store, "p", exact=True)
    moved = list(range(0, 400, 3))
    index.upsert_vectors(moved, gallery[moved])
    assert store.count("old") + store.count("p-new") == 400
    for q in queries:
        hits = index.search_vectors(q, q, limit=10)
        brute = np.argsort(-(gallery @ q))[:10].tolist()
        assert [h.id for h in hits] == brute
        assert {h.source for h in hits} <= {"old", "new"}
        assert all(h.source == ("new" if h.id in moved else "old") for h in hits)
        assert all(a.distance <= b.distance for a, b in zip(hits, hits[1:]))


def linear_rm_with_dims(models, dim):
    """An rm graph whose 'new' and 'rev' outputs are both `dim` wide (one shared space)."""
    from rm_qdrant_exporters.linear import linear_encoder
    from tests.conftest import SPEC

    rng = np.random.default_rng(5)
    path = models.rm.parent / f"rm-{dim}.onnx"
    linear_encoder(
        path,
        [("new", "pixels", rng.normal(size=(192, dim))), ("rev", "new", np.eye(dim))],
        input_spec=SPEC,
        name="same-space",
    )
    return OnnxEncoder(path)


def test_search_images_both_halves(store, models, pair):
    index = DualIndex.open(store, "p", exact=True)
    half = pair[::2]
    index.upsert(
        [i.point_id for i in half], [i.uri for i in half], [{"uri": i.uri, "label": i.label} for i in half]
    )
    assert index.progress() == pytest.approx(len(half) / len(pair))
    assert store.count("gallery") == len(pair) - len(half)
    results = index.search_batch([pair[0].uri, pair[1].uri], limit=len(pair))
    for hits in results:
        assert len({h.id for h in hits}) == len(hits) == len(pair)  # every point, once
        assert {h.source for h in hits} == {"old", "new"}
    # Each query finds itself first: pair[0] was moved to new, pair[1] is still in old.
    assert (results[0][0].id, results[0][0].source) == (pair[0].point_id, "new")
    assert (results[1][0].id, results[1][0].source) == (pair[1].point_id, "old")
    assert results[1][0].distance == pytest.approx(0.0, abs=1e-5)
    filtered = index.search(pair[0].uri, limit=50, filter={"label": "b"})
    assert filtered and {h.payload["label"] for h in filtered} == {"b"}


def test_point_in_both_collections_is_served_once_as_new(store, models, pair):
    index = DualIndex.open(store, "p", exact=True)
    item = pair[3]
    vectors = index.encoder.encode([item.uri], ["new"])["new"]
    # a migration step cut short: old's copy marked moving, the copy written to new, no removal
    # (an unmarked old copy in both is a bypassing writer's rewrite: served from old, see bypass.py)
    store.mark(index.pair.old_collection, [item.point_id], {MOVING: 1})
    store.upsert("p-new", [item.point_id], vectors, [{"uri": item.uri, "label": item.label}])
    hits = index.search(item.uri, limit=len(pair) + 1)
    assert [h.source for h in hits if h.id == item.point_id] == ["new"]
    assert len(hits) == len(pair)


def test_add_and_delete(store, models, pair, image_folder):
    index = DualIndex.open(store, "p", exact=True)
    index.add(10**6, sorted(image_folder.glob("a/*"))[0], {"label": "a"})
    assert store.count("p-new") == 1
    index.delete([10**6, pair[0].point_id])
    assert store.count("p-new") == 0 and store.count("gallery") == len(pair) - 1


def test_naive_mode_encodes_queries_with_both_models(store, models, pair):
    drop_pair(store, "p")  # one pair per old collection
    create_pair(
        store,
        "n",
        old_collection="gallery",
        encoder=OnnxEncoder(models.new_only),
        old_encoder=OnnxEncoder(models.old),
    )
    index = DualIndex.open(store, "n", exact=True)
    new, old = index.query_vectors([pair[0].uri])
    assert new.shape == (1, NEW_DIM) and old.shape == (1, OLD_DIM)
    assert index.search(pair[0].uri, limit=1)[0].id == pair[0].point_id


def test_pair_record_is_shared_through_the_store(store, models, pair):
    record = load_pair(store, "p")
    assert (record.mode, record.old_collection, record.new_collection) == ("rm", "gallery", "p-new")
    assert record.encoder.fingerprint == OnnxEncoder(models.rm).fingerprint


def test_wrong_models_are_refused_and_nothing_is_written(store, models, pair):
    with pytest.raises(ConfigError, match="is not the model pair 'p' was created with"):
        DualIndex.open(store, "p", encoder=str(models.new_only))
    with pytest.raises(DimensionMismatch, match="holds 6-d vectors but .* makes 10-d queries"):
        create_pair(
            store,
            "bad",
            old_collection="gallery",
            encoder=OnnxEncoder(models.new_only),
            old_encoder=OnnxEncoder(models.new_only),
        )
    with pytest.raises(ConfigError, match="naive mode needs --old-encoder"):
        create_pair(store, "bad", old_collection="gallery", encoder=OnnxEncoder(models.new_only))
    with pytest.raises(CollectionNotFound, match="'missing'"):
        create_pair(store, "bad", old_collection="missing", encoder=OnnxEncoder(models.rm))
    with pytest.raises(ConfigError, match="already exists"):
        create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(models.rm))
    with pytest.raises(CollectionNotFound, match="no pair named 'bad'"):
        load_pair(store, "bad")
    assert not store.has_collection("bad-new")


def test_distance_mismatch_is_refused(store, models):
    store.create_collection("euclid", dim=OLD_DIM, distance="euclid")
    with pytest.raises(ConfigError, match="made for cosine distance"):
        create_pair(store, "e", old_collection="euclid", encoder=OnnxEncoder(models.rm))
    assert not store.has_collection("e-new")


def test_query_vectors_of_the_wrong_size(store, models, pair):
    index = DualIndex.open(store, "p")
    with pytest.raises(DimensionMismatch, match="new collection takes 10-d queries"):
        index.search_vectors(np.ones(3), np.ones(OLD_DIM))


def test_index_skips_unreadable_images_and_reports_them(store, models, image_folder):
    (image_folder / "a" / "zz-broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    items = scan_image_folder(image_folder)
    report = index_images(store, "g", OnnxEncoder(models.old), items)
    assert report.indexed == len(items) - 1
    assert report.failed[0][0].endswith("zz-broken.jpg") and "not a readable image" in report.failed[0][1]
    assert all("old_confidence" in r.payload for r in store.scroll("g", limit=100)[0])


def test_vectors_only_index_needs_no_encoder(store, models, pair):
    index = DualIndex(store, load_pair(store, "p"), exact=True)
    vector = OnnxEncoder(models.rm).encode([pair[2].uri])
    assert index.search_vectors(vector["new"], vector["rev"], limit=1)[0].id == pair[2].point_id
    with pytest.raises(ConfigError, match="has no encoder"):
        index.search(pair[2].uri)


def test_spaces_are_never_mixed(store, models, pair, image_folder):
    """A collection filled by one model refuses vectors or queries from another of the same size."""
    from rm_qdrant_exporters.linear import linear_encoder
    from tests.conftest import SPEC

    other = linear_encoder(
        models.old.parent / "other-old.onnx",
        [("embedding", "pixels", np.ones((192, OLD_DIM)))],
        input_spec=SPEC,
        name="other",
    )
    with pytest.raises(ConfigError, match="holds vectors of model old-linear"):
        index_images(store, "gallery", OnnxEncoder(other), scan_image_folder(image_folder))
    with pytest.raises(ConfigError, match="holds vectors of model old-linear"):
        create_pair(
            store,
            "n",
            old_collection="gallery",
            encoder=OnnxEncoder(models.new_only),
            old_encoder=OnnxEncoder(other),
        )
    assert store.count("gallery") == len(pair) and not store.has_collection("n-new")


def test_concurrent_side_searches_give_the_same_hits(tmp_path, models, image_folder, monkeypatch):
    """The two-thread path DualIndex takes against a server returns what the sequential one does."""
    from rm_qdrant import open_store

    with open_store(tmp_path / "q") as store:
        items = scan_image_folder(image_folder)
        index_images(store, "gallery", OnnxEncoder(models.old), items)
        create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(models.rm))
        sequential = DualIndex.open(store, "p", exact=True)
        sequential.upsert([i.point_id for i in items[::3]], [i.uri for i in items[::3]])
        expected = sequential.search_batch([i.uri for i in items], limit=7)
        says_remote(store, monkeypatch)  # what a remote store says
        with DualIndex.open(store, "p", exact=True) as threaded:
            assert threaded._pool is not None
            assert threaded.search_batch([i.uri for i in items], limit=7) == expected
