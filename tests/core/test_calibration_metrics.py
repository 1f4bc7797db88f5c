"""The calibration and the forecast under every distance (issue 23): like is compared with like.

Raw vectors keep their norms, so under dot or Euclid a model whose vectors are ten times
longer measures distances ten (Euclid) or a hundred (dot) times larger, and a plain merge
is decided by the scales alone. Each check here is against a brute-force reference: every
pair of points, every distance written out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rm_qdrant.core.advice import recommend
from rm_qdrant.core.calibration import fit_calibration
from rm_qdrant.core.forecast import forecast, merged_distances, top_k
from rm_qdrant.core.merge import score_to_distance
from rm_qdrant.core.metrics import migrated_at

METRICS = ("cosine", "dot", "euclid", "manhattan")


def by_hand(x: np.ndarray, y: np.ndarray, metric: str) -> float:
    """One distance as the merge means it (Qdrant's score turned into a distance), in plain Python."""
    x, y = [float(v) for v in x], [float(v) for v in y]
    dot = sum(a * b for a, b in zip(x, y))
    if metric == "cosine":
        score = dot / math.sqrt(sum(a * a for a in x) * sum(b * b for b in y))
    elif metric == "dot":
        score = dot
    elif metric == "euclid":
        score = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y)))
    else:
        score = sum(abs(a - b) for a, b in zip(x, y))
    return score_to_distance(score, metric)


def all_pairs(v: np.ndarray, metric: str) -> np.ndarray:
    return np.array([by_hand(v[i], v[j], metric) for i in range(len(v)) for j in range(len(v)) if i != j])


def two_models(n: int = 60, scale: float = 10.0, seed: int = 0, offset: float = 0.0):
    """An old model and a new one that extends it, its raw vectors ``scale`` times longer; with an
    ``offset`` the old vectors share a large common component (cosine distances compressed)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(8, 12))[rng.integers(0, 8, n)] + 0.5 * rng.normal(size=(n, 12))
    old = z @ rng.normal(size=(12, 6))
    new = scale * np.hstack([old, 0.5 * z @ rng.normal(size=(12, 4))])
    return old + offset * np.eye(6)[0], new


@pytest.mark.parametrize("metric", METRICS)
def test_the_map_sends_old_distances_to_the_new_ones_at_the_same_quantile(metric):
    old, new = two_models()
    d_old, d_new = all_pairs(old, metric), all_pairs(new, metric)
    cal = fit_calibration(old, new, metric=metric, method="quantile", pairs=200_000)
    levels = np.array([0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9])  # knots thin out towards 1
    span = d_new.max() - d_new.min()
    got, want = cal(np.quantile(d_old, levels)), np.quantile(d_new, levels)
    assert np.all(np.abs(got - want) < 0.02 * span), (got, want)
    ranked = cal(np.unique(d_old))
    assert np.all(np.diff(ranked) > 0)  # the order within old is kept, ties never made
    if metric != "dot":  # identical vectors are identical for both models
        assert abs(float(cal(np.array(0.0)))) < 1e-3 * span


@pytest.mark.parametrize("metric", METRICS)
def test_the_forecast_merges_each_metric_like_a_loop_over_the_points(metric):
    old, new = two_models(n=30, seed=1)
    migrated = migrated_at(np.random.default_rng(2).permutation(30), 0.5)
    found = top_k(merged_distances(new, old, new, old, migrated, metric=metric), 4)
    for q in range(30):
        d = [
            (by_hand(new[q], new[j], metric) if migrated[j] else by_hand(old[q], old[j], metric), j)
            for j in range(30)
            if j != q
        ]
        assert found[q].tolist() == [j for _, j in sorted(d)[:4]]


@pytest.mark.parametrize(
    ("metric", "crowded", "scale", "offset"),
    [("dot", "old", 10.0, 0.0), ("euclid", "new", 10.0, 0.0), ("cosine", "new", 1.0, 30.0)],
)
def test_a_side_crowded_out_by_scale_is_flagged_and_the_calibrated_merge_is_safe(
    metric, crowded, scale, offset
):
    old, new = two_models(n=300, scale=scale, offset=offset, seed=3)
    order = np.random.default_rng(4).permutation(300)
    (plain,) = forecast(old, new, order=order, k=10, metric=metric)
    half = plain.fractions.index(0.5)
    assert plain.old_gallery is not None and plain.old_gallery[half] == pytest.approx(0.5)
    assert {c.side for c in plain.crowded()} == {crowded}
    assert 0.5 in {c.t for c in plain.crowded()}
    advice = recommend([plain], k=10)
    assert "not safe" in advice and f"{crowded} hits are crowded out of the merged top 10" in advice
    assert "rmq calibrate" in advice
    cal = fit_calibration(old, new, metric=metric, method="quantile", pairs=200_000)
    (mapped,) = forecast(old, new, order=order, k=10, metric=metric, naive_distance=cal)
    assert mapped.old_share is not None and 0.35 < mapped.old_share[half] < 0.65  # in proportion
    assert not mapped.crowded() and mapped.area > plain.area + 0.2
    assert "crowded out of" not in recommend([mapped], calibrated=True, k=10)


@pytest.mark.parametrize("metric", ["dot", "euclid"])
def test_after_calibration_a_query_finds_its_own_old_point_first(metric):
    old, new = two_models(n=200, seed=5)
    cal = fit_calibration(old, new, metric=metric, method="quantile", pairs=200_000)
    migrated = migrated_at(np.random.default_rng(6).permutation(200), 0.5)
    merged = merged_distances(new, old, new, old, migrated, old_distance=cal, metric=metric)

    def clearly_first(q: int, v: np.ndarray) -> bool:  # under dot a longer neighbour can beat it
        d = np.array([by_hand(v[q], u, metric) for u in v])
        runner_up = np.min(np.delete(d, q))
        return bool(d[q] < runner_up - 0.05 * abs(runner_up))

    # Old points each model ranks first for their own image, by a margin.
    first = [q for q in np.flatnonzero(~migrated) if clearly_first(q, old) and clearly_first(q, new)]
    assert len(first) >= 5
    assert all(np.argmin(merged[q]) == q for q in first)
