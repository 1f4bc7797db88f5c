"""The Store contract, run on the embedded qdrant-edge store and on qdrant-client's :memory:."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from rm_qdrant import CollectionNotFound, ConfigError, DimensionMismatch, StoreError, open_store


def unit(rows, dim, seed=0):
    x = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_write_read_search_delete(store):
    store.create_collection("c", dim=4, distance="cosine")
    vectors = unit(20, 4)
    u = str(uuid.uuid4())
    ids = list(range(19)) + [u.upper()]  # UUIDs come back canonical, lower-case
    store.upsert("c", ids, vectors, [{"label": str(i % 2)} for i in range(20)])
    assert store.count("c") == 20
    assert store.collection("c").dim == 4 and store.collection("c").distance == "cosine"

    got = store.retrieve("c", [3, u], with_vectors=True)
    assert sorted(map(str, (r.id for r in got))) == sorted(["3", u])
    by_id = {r.id: r for r in got}
    np.testing.assert_allclose(by_id[3].vector, vectors[3], atol=1e-6)

    hits = store.search("c", vectors[5:7], limit=3, exact=True)
    assert [h[0].id for h in hits] == [5, 6]
    assert hits[0][0].score == pytest.approx(1.0, abs=1e-5)

    only_odd = store.search("c", vectors[5:6], limit=20, filter={"label": "1"}, exact=True)[0]
    assert {h.payload["label"] for h in only_odd} == {"1"} and len(only_odd) == 10

    store.delete("c", [3, u])
    assert store.count("c") == 18 and store.retrieve("c", [3]) == []


def test_scroll_visits_every_point_once(store):
    store.create_collection("c", dim=2, distance="euclid")
    store.upsert("c", list(range(25)), unit(25, 2))
    seen, offset = [], None
    while True:
        page, offset = store.scroll("c", limit=7, offset=offset)
        seen += [r.id for r in page]
        if offset is None:
            break
    assert sorted(seen) == list(range(25))


def test_wrong_dimension_writes_nothing(store):
    store.create_collection("c", dim=4, distance="cosine")
    with pytest.raises(DimensionMismatch, match="holds 4-d vectors"):
        store.upsert("c", [1, 2], unit(2, 5))
    with pytest.raises(DimensionMismatch):
        store.search("c", unit(1, 3), limit=1)
    with pytest.raises(ConfigError, match="NaN"):
        store.upsert("c", [1], np.full((1, 4), np.nan))
    assert store.count("c") == 0


def test_missing_collection_and_bad_names(store):
    with pytest.raises(CollectionNotFound, match="'nope' not found"):
        store.count("nope")
    with pytest.raises(CollectionNotFound):
        store.search("nope", unit(1, 4), limit=1)
    with pytest.raises(ConfigError, match="invalid point id"):
        store.create_collection("c", dim=2, distance="dot") or store.upsert("c", ["not-a-uuid"], unit(1, 2))
    with pytest.raises(ConfigError, match="unknown distance"):
        store.create_collection("d", dim=2, distance="hamming")
    with pytest.raises(StoreError, match="already exists"):
        store.create_collection("c", dim=2, distance="dot")


def test_backends_agree_on_the_same_scenario(tmp_path):
    """Congruence: the same writes and queries give the same answers on both backends."""
    vectors, queries = unit(300, 8, seed=1), unit(5, 8, seed=2)
    answers = []
    for location in (tmp_path / "edge", ":memory:"):
        with open_store(location) as s:
            s.create_collection("c", dim=8, distance="cosine")
            s.upsert("c", list(range(300)), vectors, [{"k": i % 3} for i in range(300)])
            s.delete("c", list(range(0, 300, 7)))
            hits = s.search("c", queries, limit=10, filter={"k": [0, 1]}, exact=True)
            answers.append([[(h.id, round(h.score, 4)) for h in row] for row in hits])
    assert answers[0] == answers[1]


def test_unreachable_server_is_a_store_error():
    with pytest.raises(StoreError, match="cannot reach Qdrant at http://127.0.0.1:9"):
        open_store("http://127.0.0.1:9")


def test_payload_updates_ordered_scroll_and_filtered_count(store):
    from rm_qdrant.store import Where

    store.create_collection("c", dim=2, distance="cosine")
    store.upsert("c", list(range(10)), unit(10, 2))
    store.create_index("c", "rank", "integer")
    updated = store.set_payload(
        "c", [(i, {"rank": 100 - i, "bucket": i % 3}) for i in range(10)] + [(99, {"rank": 0})]
    )
    assert updated == 10  # id 99 does not exist and is skipped
    store.set_payload("c", [(4, {"failed": "HTTP 404"})])
    page, following = store.scroll("c", limit=3, order_by="rank", where=Where(empty=("failed",)))
    assert [r.id for r in page] == [9, 8, 7] and following is None
    mine = Where(must={"bucket": [0, 1]}, must_not={"rank": 91})
    assert store.count("c", mine) == 6  # 7 ids in buckets 0/1, minus id 9 (rank 91)
    assert store.count("c", Where(not_empty=("failed",))) == 1
    assert store.retrieve("c", [4])[0].payload == {"rank": 96, "bucket": 1, "failed": "HTTP 404"}


def test_insert_only_keeps_the_existing_point(store):
    store.create_collection("c", dim=2, distance="euclid")
    store.upsert("c", [1], np.array([[1.0, 0.0]]), [{"v": "fresh"}])
    store.upsert(
        "c", [1, 2], np.array([[0.0, 1.0], [0.0, 2.0]]), [{"v": "stale"}, {"v": "new"}], insert_only=True
    )
    got = {r.id: r for r in store.retrieve("c", [1, 2], with_vectors=True)}
    assert got[1].payload == {"v": "fresh"} and got[1].vector.tolist() == [1.0, 0.0]
    assert got[2].payload == {"v": "new"}


def test_aliases(store):
    store.create_collection("a", dim=2, distance="cosine")
    store.create_collection("b", dim=2, distance="cosine")
    assert store.alias("serving") is None
    store.set_alias("serving", "a")
    store.set_alias("serving", "b")
    assert store.alias("serving") == "b"
    with pytest.raises(CollectionNotFound):
        store.set_alias("serving", "missing")
    assert store.alias("serving") == "b"
