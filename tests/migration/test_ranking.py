"""Ranking the old points (rmq migrate --prepare) and finding points an interrupted step left in both."""

from __future__ import annotations

import numpy as np

from rm_qdrant.core.ordering import order_keys, ranks
from rm_qdrant.core.planning import MOVING, RANK
from rm_qdrant.migration.ranking import prepare_order, read_all
from rm_qdrant.pair.record import ModelRef, PairRecord, save_pair
from rm_qdrant.serving.status import in_both
from rm_qdrant.store import Where


def _pair(store, n: int = 40) -> PairRecord:
    vectors = np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)
    for name in ("old", "p-new"):
        store.create_collection(name, dim=4, distance="cosine")
    store.upsert("old", list(range(n)), vectors, [{"uri": f"/{i}.jpg"} for i in range(n)])
    pair = PairRecord("p", "old", "p-new", "rm", "cosine", ModelRef("m", "0", 4, "-"))
    save_pair(store, pair)
    return pair


def test_orders_without_payloads_rank_as_before_and_in_both_finds_marked_points(store):
    pair = prepare_order(store, _pair(store), "centroid-unsupervised")  # reads vectors, not payloads
    ids, payloads, vectors = read_all(store, "old", Where(), True)
    expected = ranks(order_keys("centroid-unsupervised", ids, [], vectors)).tolist()
    assert [p[RANK] for p in payloads] == expected
    pair = prepare_order(store, pair, "random")
    ids, payloads, _ = read_all(store, "old", Where(), False)
    assert [p[RANK] for p in payloads] == ranks(order_keys("random", ids, [])).tolist()
    assert read_all(store, "old", Where(), False, with_payloads=False)[1] == []

    # A step cut short: marked in old, written to new, not yet removed from old. in_both finds
    # it through the payload index on rmq_moving where the store has indexes (edge).
    if type(store).__name__ == "EdgeStore":
        assert store.payload_indexes("old")[MOVING] == "integer"
    store.mark("old", [3, 7, 11], {MOVING: 1})
    store.upsert("p-new", [3, 7], np.ones((2, 4), np.float32))
    assert sorted(in_both(store, pair)) == [3, 7]
    store.mark("old", [3, 7, 11], {MOVING: None})
    assert in_both(store, pair) == []
