"""DualIndex.search's per-call ``search_params`` (qdrant-client's ``models.SearchParams``),
``timeout`` and ``consistency``, on both stores and both layouts.

The old collection has scalar (int8) quantization, made directly with each store's own API,
and an HNSW index built (qdrant-edge: ``optimize``). Without rescoring qdrant-edge ranks by
the quantized vectors, so its scores drift from the float ones: rescoring (or ignoring the
quantization) must give the brute-force ranking and scores again. qdrant-client's local mode
always searches exactly: there every setting must give the brute-force answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import models

from rm_qdrant import ConfigError, DualIndex, create_pair
from rm_qdrant.store.client import ClientStore
from rm_qdrant.store.client_query import merged_requests, query_options
from rm_qdrant.store.edge import EdgeStore
from tests.serving.test_dual import linear_rm_with_dims, unit

N, DIM = 300, 16
Q = unit(3, DIM, 11)


def quantized_collection(store, name: str) -> None:
    """A cosine collection with int8 scalar quantization, made with the store's own library."""
    if isinstance(store, EdgeStore):  # a team's shard, placed where the store adopts it
        config = qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine),
            quantization_config=qe.ScalarQuantizationConfig(
                qe.ScalarType.Int8, quantile=0.5, always_ram=True
            ),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=1),
        )
        folder = store.path / "collections" / name
        folder.mkdir(parents=True)
        qe.EdgeShard.create(str(folder / "shard"), config).close()
    else:
        store._client.create_collection(
            name,
            vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE),
            quantization_config=models.ScalarQuantization(
                scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.5)
            ),
        )


@pytest.fixture
def encoder(models):
    return linear_rm_with_dims(models, DIM)


@pytest.fixture(params=["paired", "single-collection"])
def index(request, store, encoder):
    quantized_collection(store, "photos")
    gallery = unit(N, DIM, 1)
    store.upsert("photos", list(range(N)), gallery, [{"i": i} for i in range(N)])
    options = {"layout": "single-collection", "new_vector": "new"} if request.param != "paired" else {}
    create_pair(store, "p", old_collection="photos", encoder=encoder, **options)
    index = DualIndex.open(store, "p")
    moved = list(range(0, N, 3))
    index.upsert_vectors(moved, gallery[moved], [{"i": i} for i in moved])
    if isinstance(store, EdgeStore):  # qdrant-edge builds the index (and quantizes) only when asked
        for name in {index.pair.old_collection, index.pair.new_collection}:
            store.optimize(name)
    return index, gallery


def brute(gallery, q, limit):
    scores = gallery @ q
    order = np.argsort(-scores, kind="stable")[:limit]
    return [int(i) for i in order], scores[order]


def drift(hits, gallery, q):
    """How far the hits' scores are from the float scores of their points."""
    return max(abs(h.score - float(gallery[h.id] @ q)) for h in hits)


EXACT_ENOUGH = [
    models.SearchParams(
        hnsw_ef=N, quantization=models.QuantizationSearchParams(rescore=True, oversampling=3.0)
    ),
    models.SearchParams(hnsw_ef=N, quantization=models.QuantizationSearchParams(ignore=True)),
    {"hnsw_ef": N, "quantization": {"rescore": True, "oversampling": 2.0}},
    models.SearchParams(exact=True),
    models.SearchParams(
        hnsw_ef=N, indexed_only=True, quantization=models.QuantizationSearchParams(ignore=True)
    ),
]


def test_rescored_or_unquantized_search_gives_the_brute_force_ranking_and_scores(index):
    index, gallery = index
    for case, params in enumerate(EXACT_ENOUGH):
        for q in Q:
            want, scores = brute(gallery, q, 10)
            hits = index.search_vectors(q, q, limit=10, search_params=params)
            assert [h.id for h in hits] == want, case
            assert np.allclose([h.score for h in hits], scores, atol=1e-5), case


def test_without_rescoring_the_quantized_scores_are_what_ranks(index, store):
    index, gallery = index
    quick = models.SearchParams(hnsw_ef=N, quantization=models.QuantizationSearchParams(rescore=False))
    rescored = models.SearchParams(hnsw_ef=N, quantization=models.QuantizationSearchParams(rescore=True))
    for q in Q:
        assert drift(index.search_vectors(q, q, limit=10, search_params=rescored), gallery, q) < 1e-5
    worst = max(drift(index.search_vectors(q, q, limit=10, search_params=quick), gallery, q) for q in Q)
    if isinstance(store, EdgeStore):
        assert worst > 1e-3  # the int8 scores: the parameter reached the engine, on both sides
    else:
        assert worst < 1e-5  # qdrant-client's local mode searches exactly, whatever it is asked


def test_the_calls_own_exact_wins_over_the_indexs(index):
    index, gallery = index
    index.exact = True
    q = Q[0]
    quick = models.SearchParams(exact=False, quantization=models.QuantizationSearchParams(ignore=True))
    hits = index.search_vectors(q, q, limit=10, search_params=quick, hnsw_ef=N)
    assert [h.id for h in hits] == brute(gallery, q, 10)[0]


def test_timeout_and_consistency_are_accepted_and_change_nothing_in_process(index):
    index, gallery = index
    q = Q[1]
    for consistency in (2, models.ReadConsistencyType.MAJORITY, "quorum"):
        hits = index.search_vectors(q, q, limit=10, timeout=5, consistency=consistency)
        assert [h.id for h in hits] == [h.id for h in index.search_vectors(q, q, limit=10)]


BAD = [
    ({"search_params": "fast"}, "search_params is a qdrant_client.models.SearchParams"),
    ({"search_params": {"hnsw_ef": "wide"}}, "bad search_params: hnsw_ef"),
    ({"search_params": {"quantization": {"rescore": "maybe"}}}, "bad search_params: quantization"),
    ({"search_params": models.SearchParams(hnsw_ef=0)}, "search_params.hnsw_ef"),
    (
        {"search_params": {"quantization": {"oversampling": 0.5}}},
        "search_params.quantization.oversampling",
    ),
    (
        {"search_params": {"quantization": {"oversampling": float("nan")}}},
        "search_params.quantization.oversampling",
    ),
    ({"search_params": {"idf": "global"}}, "search_params.idf"),
    ({"search_params": models.SearchParams(exact=False), "exact": True}, "contradicts"),
    ({"search_params": models.SearchParams(hnsw_ef=64), "hnsw_ef": 32}, "contradicts"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": 1.5}, "timeout"),
    ({"timeout": "5"}, "timeout"),
    ({"timeout": True}, "timeout"),
    ({"consistency": 0}, "consistency"),
    ({"consistency": "most"}, "consistency"),
    ({"consistency": True}, "consistency"),
]


def test_bad_values_are_one_clear_error(index):
    index, _ = index
    for options, message in BAD:
        with pytest.raises(ConfigError, match=message):
            index.search_vectors(Q[0], Q[0], **options)


def test_agreeing_values_are_no_conflict(index):
    index, gallery = index
    q = Q[2]
    params = models.SearchParams(exact=True, hnsw_ef=64)
    hits = index.search_vectors(q, q, limit=10, search_params=params, exact=True, hnsw_ef=64)
    assert [h.id for h in hits] == brute(gallery, q, 10)[0]


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_qdrant_client_gets_the_timeout_and_consistency_of_each_search(encoder, monkeypatch, layout):
    """What a server would receive: its query calls carry both (the local mode drops them)."""
    store = ClientStore(":memory:")
    store.create_collection("photos", dim=DIM, distance="cosine")
    store.upsert("photos", list(range(20)), unit(20, DIM, 1))
    options = {"layout": "single-collection", "new_vector": "new"} if layout != "paired" else {}
    create_pair(store, "p", old_collection="photos", encoder=encoder, **options)
    index = DualIndex.open(store, "p")
    index.upsert_vectors([0, 1], unit(2, DIM, 3))
    seen = []
    query_batch_points = store._client.query_batch_points

    def spy(name, requests, **kwargs):
        seen.append(kwargs)
        return query_batch_points(name, requests, **kwargs)

    monkeypatch.setattr(store._client, "query_batch_points", spy)
    index.search_vectors(Q[0], Q[0], limit=5, timeout=7, consistency="majority")
    assert seen and all(s == {"timeout": 7, "consistency": models.ReadConsistencyType.MAJORITY} for s in seen)
    store.close()


def test_a_server_gets_the_search_params_on_both_prefetches_of_a_merged_query():
    from rm_qdrant.store.base import MergedQuery

    given = models.SearchParams(indexed_only=True, quantization=models.QuantizationSearchParams(rescore=True))
    query = MergedQuery("", "new", "cosine", 5, exact=True, hnsw_ef=40, search_params=given, timeout=3)
    params, options = query_options(given, True, 40, 3, None, remote=True)
    assert (params.exact, params.hnsw_ef, params.indexed_only, params.quantization.rescore) == (
        True,
        40,
        True,
        True,
    )
    assert options == {"timeout": 3, "consistency": None}
    assert query_options(given, True, 40, 3, None, remote=False)[0] is None  # the local mode warns
    (request,) = merged_requests(query, [[0.1] * DIM], [[0.2] * DIM], params)
    assert [p.params for p in request.prefetch] == [params, params]
