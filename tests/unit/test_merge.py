from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import ConfigError, Hit, merge, score_to_distance
from rm_qdrant.core.merge import merge_batches


def hit(pid, distance, source="old"):
    return Hit(pid, 1 - distance, distance, source, {})


def test_merge_orders_by_distance_across_both_lists():
    old = [hit(1, 0.1), hit(2, 0.4)]
    new = [hit(3, 0.2, "new"), hit(4, 0.3, "new")]
    assert [h.id for h in merge(old, new, 3)] == [1, 3, 4]


def test_point_in_both_collections_is_returned_once_as_its_new_copy():
    # A crash between "upsert into new" and "remove from old" leaves a point in both.
    old = [hit(1, 0.05), hit(2, 0.3)]
    new = [hit(1, 0.2, "new")]
    merged = merge(old, new, 10)
    assert [(h.id, h.source) for h in merged] == [(1, "new"), (2, "old")]


def test_ties_are_broken_deterministically_new_first_then_id():
    old = [hit(9, 0.5), hit(2, 0.5)]
    new = [hit(5, 0.5, "new")]
    assert [h.id for h in merge(old, new, 3)] == [5, 2, 9]
    assert [h.id for h in merge(list(reversed(old)), new, 3)] == [5, 2, 9]


def test_limit_and_bad_limit():
    assert merge([hit(1, 0.1)], [hit(2, 0.2, "new")], 0) == []
    with pytest.raises(ConfigError):
        merge([], [], -1)


def test_merged_top_k_equals_brute_force_over_the_union():
    rng = np.random.default_rng(0)
    for _ in range(50):
        dist = rng.random(40)
        ids = rng.permutation(1000)[:40]
        in_new = rng.random(40) < 0.5
        old = [hit(int(i), float(d)) for i, d, n in zip(ids, dist, in_new) if not n]
        new = [hit(int(i), float(d), "new") for i, d, n in zip(ids, dist, in_new) if n]
        k = 10
        # Each collection answers its own top-k, as Qdrant would.
        top_old = sorted(old, key=lambda h: h.distance)[:k]
        top_new = sorted(new, key=lambda h: h.distance)[:k]
        expected = [int(ids[j]) for j in np.argsort(dist)[:k]]
        assert [h.id for h in merge(top_old, top_new, k)] == expected


@pytest.mark.parametrize(
    ("score", "distance", "expected"),
    [(0.75, "cosine", 0.25), (3.0, "dot", -3.0), (2.5, "euclid", 2.5), (1.5, "Manhattan", 1.5)],
)
def test_score_to_distance(score, distance, expected):
    assert score_to_distance(score, distance) == pytest.approx(expected)


def test_unknown_distance_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown distance 'hamming'"):
        score_to_distance(0.1, "hamming")


def test_merge_batches_requires_equal_lengths():
    assert merge_batches([[hit(1, 0.1)]], [[hit(2, 0.0, "new")]], 1)[0][0].id == 2
    with pytest.raises(ConfigError, match="batch sizes differ"):
        merge_batches([[]], [], 1)
