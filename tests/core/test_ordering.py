from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import ConfigError
from rm_qdrant.core.ordering import (
    BUCKETS,
    ORDERS,
    bucket,
    check_order,
    needs_payloads,
    order_keys,
    ranks,
    shard_buckets,
)


def test_random_order_is_seeded_and_independent_of_listing_order():
    ids = list(range(100))
    a = order_keys("random", ids, [{}] * 100, seed=1)
    b = order_keys("random", ids[::-1], [{}] * 100, seed=1)[::-1]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, order_keys("random", ids, [{}] * 100, seed=2))


def test_confidence_and_payload_orders_go_low_first():
    payloads = [{"old_confidence": c, "age": -c} for c in (0.9, 0.2, 0.5)]
    assert ranks(order_keys("confidence", [1, 2, 3], payloads)).tolist() == [2, 0, 1]
    assert ranks(order_keys("payload:age", [1, 2, 3], payloads)).tolist() == [0, 2, 1]


def test_centroid_order_puts_atypical_points_first():
    rng = np.random.default_rng(0)
    cat = np.array([1.0, 0.0]) + 0.05 * rng.normal(size=(20, 2))
    dog = np.array([0.0, 1.0]) + 0.05 * rng.normal(size=(20, 2))
    odd = np.array([[0.7, 0.7]])  # labelled cat, but far from the cat centroid
    vectors = np.vstack([cat, dog, odd])
    payloads = [{"label": "cat"}] * 20 + [{"label": "dog"}] * 20 + [{"label": "cat"}]
    first = np.argmin(order_keys("centroid", list(range(41)), payloads, vectors))
    assert first == 40
    first_unsupervised = np.argmin(
        order_keys("centroid-unsupervised", list(range(41)), payloads, vectors, clusters=2)
    )
    assert first_unsupervised == 40


@pytest.mark.parametrize(
    ("spec", "payloads", "message"),
    [
        (
            "confidence",
            [{"old_confidence": 0.1}, {}],
            "1 of 2 points have no numeric payload 'old_confidence'",
        ),
        ("payload:size", [{"size": "big"}, {"size": 2}], "must be numbers or strings.*found int, str"),
        ("payload:size", [{}, {}], "must be numbers or strings.*found none"),
        ("centroid", [{"label": "a"}, {}], "use 'centroid-unsupervised'"),
        ("alphabetical", [{}, {}], "unknown backfill order"),
        ("payload:", [{}, {}], "unknown backfill order"),
    ],
)
def test_orders_say_what_they_miss(spec, payloads, message):
    with pytest.raises(ConfigError, match=message):
        order_keys(spec, [1, 2], payloads, np.ones((2, 3)))


def test_payload_orders_take_any_sortable_field_missing_last():
    payloads = [{"sku": "b-2"}, {}, {"sku": "a-9"}, {"sku": "c-1"}]
    assert np.argsort(order_keys("payload:sku", [1, 2, 3, 4], payloads)).tolist() == [2, 0, 3, 1]
    dates = [{"t": "2024-05-01T10:00:00Z"}, {"t": "2023-12-31T23:59:59Z"}]
    assert np.argsort(order_keys("payload:t", [1, 2], dates)).tolist() == [1, 0]
    numbers = [{"n": 3}, {"n": -1.5}, {"n": 2}]
    assert np.argsort(order_keys("payload:n", [1, 2, 3], numbers)).tolist() == [1, 2, 0]


def test_centroid_reads_the_pairs_label_field():
    vectors = np.random.default_rng(0).normal(size=(4, 3))
    payloads = [{"category": c} for c in "aabb"]
    keys = order_keys("centroid", [1, 2, 3, 4], payloads, vectors, label_field="category")
    assert keys.shape == (4,)
    with pytest.raises(ConfigError, match="no 'label' payload"):
        order_keys("centroid", [1, 2, 3, 4], payloads, vectors)


def test_shards_partition_the_buckets():
    owners = [shard_buckets(i, 3) for i in range(3)]
    assert sorted(b for own in owners for b in own) == list(range(BUCKETS))
    assert all(0 <= bucket(i) < BUCKETS for i in (0, 7, "a4b7c1de-0000-4000-8000-000000000000"))
    with pytest.raises(ConfigError):
        shard_buckets(2, 2)


@pytest.mark.parametrize("spec", ["random", "confidence", "centroid", "centroid-unsupervised", "payload:age"])
def test_orders_that_need_no_payloads_rank_the_same_without_them(spec):
    # prepare_order keeps no payloads (about 0.65 KB a point) for the orders that do not read them
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(12, 3))
    payloads = [{"label": "ab"[i % 2], "old_confidence": float(i), "age": -i} for i in range(12)]
    with_them = order_keys(spec, list(range(12)), payloads, vectors)
    assert needs_payloads(spec) == (spec not in ("random", "centroid-unsupervised"))
    if not needs_payloads(spec):
        assert np.array_equal(order_keys(spec, list(range(12)), [], vectors), with_them)


def test_iso_times_sort_by_the_moment_they_name_whatever_their_zone():
    payloads = [
        {"at": "2025-01-01T10:00:00+05:00"},  # 05:00 UTC
        {"at": "2025-01-01T06:00:00Z"},
        {"at": "2025-01-01T04:00:00+00:00"},
        {"at": "2025-01-01T01:00:00-08:00"},  # 09:00 UTC
        {},  # missing: last
        {"at": "2025-01-01T04:30:00"},  # no zone: UTC, as Qdrant reads it
        {"at": "2024-12-31"},  # a date: its midnight
    ]
    order = np.argsort(order_keys("payload:at", list(range(7)), payloads)).tolist()
    assert order == [6, 2, 5, 0, 1, 3, 4]


def test_strings_that_are_not_all_times_sort_as_text():
    payloads = [{"sku": "b"}, {"sku": "2025-01-01"}, {"sku": "a"}]
    assert np.argsort(order_keys("payload:sku", [1, 2, 3], payloads)).tolist() == [1, 2, 0]


def test_demand_order_puts_the_most_returned_first_then_the_rest_in_random_order():
    """What searches returned from old most often migrates first; the points never returned
    follow in the seeded random order, and a count a writer spoiled counts as none."""
    counts = {3: 5, 8: 1, 11: 9, 14: 2, 20: 1}
    ids = list(range(25))
    payloads = [{"rmq_demand": counts[i]} if i in counts else {} for i in ids]
    payloads[0] = {"rmq_demand": "many"}
    payloads[1] = {"rmq_demand": -4}
    payloads[2] = {"rmq_demand": True}
    order = np.argsort(order_keys("demand", ids, payloads, seed=4), kind="stable").tolist()
    assert order[:3] == [11, 3, 14] and set(order[3:5]) == {8, 20}
    rest = [i for i in ids if i not in counts]
    random_keys = order_keys("random", ids, [], seed=4)
    assert order[5:] == sorted(rest, key=lambda i: random_keys[i])
    assert needs_payloads("demand") and check_order("demand") == "demand"
    assert "demand" in ORDERS
