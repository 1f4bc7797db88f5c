"""Retrieval metrics against slow references (and scikit-learn's average precision)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from rm_qdrant.core.metrics import (
    FRACTIONS,
    area,
    backfill_curve,
    backfill_retrieval,
    gain,
    migrated_at,
    retrieval,
    unit,
)


def slow_map(dist, labels, k=None):
    aps, tops = [], []
    for q in range(len(labels)):
        others = sorted((dist[q, j], j) for j in range(len(labels)) if j != q)
        rel = [labels[j] == labels[q] for _, j in others]
        tops.append(rel[0])
        cut = rel if k is None else rel[:k]
        denominator = sum(rel) if k is None else min(sum(rel), k)
        hits, total = 0, 0.0
        for rank, r in enumerate(cut, 1):
            if r:
                hits += 1
                total += hits / rank
        aps.append(total / denominator if denominator else 0.0)
    return np.mean(aps), np.mean(tops)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=60)
    centres = rng.normal(size=(4, 6))
    old_centres = rng.normal(size=(4, 5))
    return (
        labels,
        centres[labels] + rng.normal(size=(60, 6)),
        old_centres[labels] + 2 * rng.normal(size=(60, 5)),
    )


@pytest.mark.parametrize("k", [None, 5])
def test_map_and_top1_match_a_slow_reference(data, k):
    labels, x, _ = data
    dist = 1.0 - unit(x) @ unit(x).T
    want_map, want_top1 = slow_map(dist, labels, k)
    got = retrieval(x, x, labels, k=k)
    assert got.map == pytest.approx(want_map, abs=1e-6) and got.top1 == pytest.approx(want_top1)
    assert backfill_retrieval(x, None, x, None, labels, np.ones(60, bool), k=k, chunk=7).map == pytest.approx(
        got.map
    )


def test_map_agrees_with_scikit_learn(data):
    labels, x, _ = data
    sims = unit(x) @ unit(x).T
    per_query = [
        average_precision_score(np.delete(labels == labels[q], q), np.delete(sims[q], q)) for q in range(60)
    ]
    assert retrieval(x, x, labels).map == pytest.approx(np.mean(per_query), abs=1e-6)


def test_curve_runs_from_old_to_new_and_counts_flips(data):
    labels, new, old = data
    order = np.random.default_rng(1).permutation(60)
    old_sys, new_sys = retrieval(old, old, labels), retrieval(new, new, labels)
    curve = backfill_curve(new, old, new, old, labels, order, old_hits=old_sys.hits)
    assert curve.maps[0] == pytest.approx(old_sys.map) and curve.maps[-1] == pytest.approx(new_sys.map)
    brute = np.zeros(60, bool)
    for t in FRACTIONS:
        r = backfill_retrieval(new, old, new, old, labels, migrated_at(order, t))
        brute |= old_sys.hits & ~r.hits
    assert curve.flips == brute.sum()
    assert curve.auc_map == pytest.approx(np.trapezoid(curve.maps, FRACTIONS))


def test_small_helpers():
    assert area([0.0, 1.0], [0.0, 1.0]) == pytest.approx(0.5)
    assert gain(0.6, 0.4, 0.8) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        gain(0.5, 0.4, 0.4)
    assert migrated_at(np.array([3, 1, 0, 2]), 0.5).tolist() == [False, True, False, True]


def test_a_tie_counts_against_the_query():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    labels = np.array([0, 0, 1])
    got = backfill_retrieval(x, None, x, None, labels, np.ones(3, bool), workers=1)
    # Query 0 sees item 1 (relevant) and item 2 (not) at one distance: the relevant one ranks second.
    # Query 1's relevant item is second; query 2 has none. No query's nearest is strictly relevant.
    assert got.map == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert got.top1 == 0.0
