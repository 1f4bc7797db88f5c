"""DualIndex.search in qdrant-client's vocabulary (filters, score_threshold, offset,
with_payload, with_vectors, exact, hnsw_ef), against a brute-force reference.

A gallery with numeric, datetime, keyword, list and nested payload fields, half of it
migrated, on both stores (the ``store`` fixture) and both layouts: each filter's hits must be
the points that match it in Python, ranked by exact distance.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from qdrant_client import models

from rm_qdrant import ConfigError, DualIndex, create_pair
from tests.conftest import OLD_DIM
from tests.serving.test_dual import linear_rm_with_dims, unit

N = 120
START = datetime(2025, 1, 1, tzinfo=UTC)


def payload(i):
    body = {
        "price": float(i % 37),
        "created_at": (START + timedelta(days=i)).isoformat(),
        "label": ["cat", "dog", "bird"][i % 3],
        "tags": [f"t{i % 4}", f"t{i % 5}"][: 1 + i % 2],
        "meta": {"dept": ["a", "b"][i % 2], "rank": i % 7},
    }
    if i % 6 == 0:
        body["note"] = None
    if i % 4 == 0:
        del body["tags"]
    return body


PAYLOADS = [payload(i) for i in range(N)]


def field(body, key):
    for part in key.split("."):
        body = body.get(part) if isinstance(body, dict) else None
    return body


def when(body):
    return datetime.fromisoformat(body["created_at"])


#: (filter, the same predicate in Python)
CASES = [
    ({"label": "cat"}, lambda b: b["label"] == "cat"),
    ({"price": {"gte": 10, "lt": 20}}, lambda b: 10 <= b["price"] < 20),
    ({"created_at": {"gte": "2025-02-01"}}, lambda b: when(b) >= datetime(2025, 2, 1, tzinfo=UTC)),
    (
        models.Filter(must=[models.FieldCondition(key="price", range=models.Range(gt=5, lte=30))]),
        lambda b: 5 < b["price"] <= 30,
    ),
    (
        models.Filter(
            must=[
                models.FieldCondition(
                    key="created_at", range=models.DatetimeRange(lt=START + timedelta(days=40))
                )
            ]
        ),
        lambda b: when(b) < START + timedelta(days=40),
    ),
    (
        models.Filter(
            should=[
                models.FieldCondition(key="label", match=models.MatchValue(value="dog")),
                models.FieldCondition(key="meta.rank", match=models.MatchAny(any=[0, 1])),
            ]
        ),
        lambda b: b["label"] == "dog" or b["meta"]["rank"] in (0, 1),
    ),
    (
        models.Filter(
            min_should=models.MinShould(
                conditions=[
                    models.FieldCondition(key="label", match=models.MatchValue(value="bird")),
                    models.FieldCondition(key="meta.dept", match=models.MatchValue(value="a")),
                    models.FieldCondition(key="price", range=models.Range(lt=10)),
                ],
                min_count=2,
            )
        ),
        lambda b: (b["label"] == "bird") + (b["meta"]["dept"] == "a") + (b["price"] < 10) >= 2,
    ),
    (
        models.Filter(
            must_not=[models.FieldCondition(key="label", match=models.MatchExcept(**{"except": ["cat"]}))]
        ),
        lambda b: b["label"] == "cat",
    ),
    (
        models.Filter(must=[models.IsEmptyCondition(is_empty=models.PayloadField(key="tags"))]),
        lambda b: not b.get("tags"),
    ),
    (
        models.Filter(must=[models.IsNullCondition(is_null=models.PayloadField(key="note"))]),
        lambda b: "note" in b and b["note"] is None,
    ),
    (
        models.Filter(must=[models.HasIdCondition(has_id=list(range(0, N, 7)))]),
        lambda b: PAYLOADS.index(b) % 7 == 0,
    ),
    (
        models.Filter(must=[models.FieldCondition(key="tags", values_count=models.ValuesCount(gte=2))]),
        lambda b: len(b.get("tags", [])) >= 2,
    ),
    (
        models.Filter(must=[models.FieldCondition(key="tags", match=models.MatchAny(any=["t1"]))]),
        lambda b: "t1" in b.get("tags", []),
    ),
    (
        models.Filter(
            must=[models.FieldCondition(key="meta.dept", match=models.MatchValue(value="b"))],
            must_not=[models.Filter(must=[models.FieldCondition(key="price", range=models.Range(gte=20))])],
        ),
        lambda b: b["meta"]["dept"] == "b" and b["price"] < 20,
    ),
]


@pytest.fixture(params=["paired", "single-collection"])
def index(request, store, models):
    store.create_collection("photos", dim=OLD_DIM, distance="cosine")
    gallery = unit(N, OLD_DIM, 1)
    store.upsert("photos", list(range(N)), gallery, PAYLOADS)
    options = {"layout": "single-collection", "new_vector": "new"} if request.param != "paired" else {}
    create_pair(store, "p", old_collection="photos", encoder=linear_rm_with_dims(models, OLD_DIM), **options)
    index = DualIndex.open(store, "p", exact=True)
    moved = list(range(0, N, 2))
    index.upsert_vectors(moved, gallery[moved], [PAYLOADS[i] for i in moved])
    return index, gallery


def reference(gallery, query, keep, limit):
    ids = [i for i in range(N) if keep(PAYLOADS[i])]
    return sorted(ids, key=lambda i: -float(gallery[i] @ query))[:limit]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_filter_gives_the_points_that_match_it_ranked_by_distance(index, case):
    index, gallery = index
    filter, keep = CASES[case]
    for seed in (2, 3):
        q = unit(1, OLD_DIM, seed)[0]
        hits = index.search_vectors(q, q, limit=8, filter=filter)
        assert [h.id for h in hits] == reference(gallery, q, keep, 8)


def test_a_dict_that_is_not_a_range_is_refused_in_one_line(index):
    index, _ = index
    q = unit(1, OLD_DIM, 2)[0]
    with pytest.raises(ConfigError, match="gt, gte, lt, lte"):
        index.search_vectors(q, q, filter={"meta": {"dept": "a"}})


Q = unit(1, OLD_DIM, 7)[0]


def ranked(gallery, query):
    return sorted(range(N), key=lambda i: -float(gallery[i] @ query))


def test_offset_skips_the_first_merged_hits(index):
    index, gallery = index
    want = ranked(gallery, Q)
    assert [h.id for h in index.search_vectors(Q, Q, limit=5, offset=7)] == want[7:12]
    assert [h.id for h in index.search_vectors(Q, Q, limit=5, offset=N - 2)] == want[N - 2 :]


def test_score_threshold_keeps_the_hits_at_least_that_similar(index):
    index, gallery = index
    want = ranked(gallery, Q)
    cut = float(gallery[want[9]] @ Q) - 1e-6  # cosine: score >= threshold, as Qdrant's
    hits = index.search_vectors(Q, Q, limit=30, score_threshold=cut)
    assert [h.id for h in hits] == want[:10]
    assert all(h.score >= cut for h in hits)
    assert [h.id for h in index.search_vectors(Q, Q, limit=4, offset=8, score_threshold=cut)] == want[8:10]


def test_with_payload_false_or_a_selection(index):
    index, _ = index
    assert all(h.payload == {} for h in index.search_vectors(Q, Q, limit=5, with_payload=False))
    for h in index.search_vectors(Q, Q, limit=5, with_payload=["label", "meta.dept", "missing"]):
        body = PAYLOADS[h.id]
        assert h.payload == {"label": body["label"], "meta": {"dept": body["meta"]["dept"]}}


def test_with_vectors_gives_each_hit_its_stored_vector(index):
    index, gallery = index
    hits = index.search_vectors(Q, Q, limit=10)
    assert all(h.vector is None for h in hits)
    hits = index.search_vectors(Q, Q, limit=10, with_vectors=True)
    assert {h.source for h in hits} == {"old", "new"}
    for h in hits:
        assert np.allclose(h.vector, gallery[h.id], atol=1e-5)


def test_per_call_exact_and_hnsw_ef_give_the_exact_ranking(index):
    index, gallery = index
    index.exact = False
    hits = index.search_vectors_batch([Q], [Q], limit=6, exact=True, hnsw_ef=64)[0]
    assert [h.id for h in hits] == ranked(gallery, Q)[:6]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"offset": -1}, "offset"),
        ({"score_threshold": "high"}, "score_threshold"),
        ({"with_payload": "label"}, "with_payload"),
        ({"with_payload": None}, "with_payload"),  # was a TypeError from iterating None
        ({"score_threshold": float("nan")}, "not a number a score"),  # was no hit at all, and no word
        ({"score_threshold": 10**400}, "not a number a score"),  # was an OverflowError
        ({"with_payload": ["a..b"]}, "not a payload path"),  # was an empty payload
        ({"with_payload": ['"unclosed']}, "not a payload path"),
        ({"with_vectors": "yes"}, "with_vectors"),
        ({"hnsw_ef": 0}, "hnsw_ef"),
        ({"exact": 1}, "exact"),
        ({"limit": -1}, "limit"),
    ],
)
def test_bad_values_are_one_clear_error(index, options, message):
    index, _ = index
    with pytest.raises(ConfigError, match=message):
        index.search_vectors(Q, Q, **options)


def test_a_search_for_no_hit_gives_none(index):
    """limit 0: qdrant-client's local mode raised 'limit value 0 is invalid' as a StoreError."""
    index, _ = index
    assert index.search_vectors(Q, Q, limit=0) == []
    assert index.search_vectors_batch([Q, Q], [Q, Q], limit=0) == [[], []]
