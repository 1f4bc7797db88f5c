from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import ConfigError, Hit, merge, score_to_distance
from rm_qdrant.core.merge import id_key, settled


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


def test_ties_are_ordered_by_id_whichever_side_and_order_they_come_in():
    old = [hit(9, 0.5), hit(2, 0.5), hit(10, 0.5)]
    new = [hit(5, 0.5, "new")]
    assert [h.id for h in merge(old, new, 4)] == [2, 5, 9, 10]  # numbers, not their text
    assert [h.id for h in merge(list(reversed(old)), new, 4)] == [2, 5, 9, 10]
    assert [h.id for h in merge(new, old, 2)] == [2, 5]


def test_id_order_puts_integers_first_then_uuids_by_value():
    low, high = "00000000-0000-0000-0000-00000000000a", "10000000-0000-0000-0000-000000000000"
    ids = [high, 2**63, low, 0, 7]
    assert sorted(ids, key=id_key) == [0, 7, 2**63, low, high]
    assert [h.id for h in merge([hit(high, 0.1), hit(3, 0.1)], [hit(low, 0.1, "new")], 3)] == [3, low, high]


def test_settled_asks_for_more_while_a_full_side_ends_in_the_tie_at_the_cut():
    # each side searched for 3; the merged list keeps 2, whose last is at 0.5
    a, b, c, d = hit(1, 0.2), hit(2, 0.5), hit(3, 0.5), hit(4, 0.9, "new")
    merged = merge([a, b, c], [d], 2)
    assert [h.id for h in merged] == [1, 2]
    assert not settled([[a, b, c], [d]], 3, merged, 2)  # old may hold another point at 0.5
    assert settled([[a, b], [d]], 3, merged, 2)  # old gave all it has
    assert settled([[a, b, hit(5, 0.6)], [d]], 3, merged, 2)  # old reaches past 0.5
    assert settled([[a, b, c], [d]], 3, merged, 2, bound=0.4)  # the threshold cuts 0.5 anyway
    assert not settled([[a, b, c], [d]], 3, merged, 2, bound=0.5)


def test_settled_wants_every_side_exhausted_where_the_list_is_short():
    a = hit(1, 0.2)
    assert settled([[a], []], 3, [a], 2)
    assert not settled([[a, a, a], []], 3, [a], 2)  # a side full of one point (a copy): not all of it


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
