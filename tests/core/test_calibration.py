"""The calibrated naive merge's map: monotone, fitted without labels, and what it does to a merge."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.calibration import Calibration, default_map, fit_calibration, pool_adjacent_violators
from rm_qdrant.core.forecast import merged_distances, top_k
from rm_qdrant.core.merge import Hit, merge
from rm_qdrant.core.metrics import migrated_at


def test_where_the_models_disagree_each_side_still_gets_its_share_of_the_top_k():
    # Two models that share little: the isotonic map (the mean new distance given the old
    # one) pulls old near neighbours towards the average distance, so with half the gallery
    # old, old hits fill about 7 % of the merged top 10. The quantile map keeps each side's
    # near neighbours as near as the other side's.
    rng = np.random.default_rng(0)
    z = rng.normal(size=(10, 32))[rng.integers(0, 10, 600)] + 0.8 * rng.normal(size=(600, 32))
    old = z @ rng.normal(size=(32, 12)) + 30 * np.eye(12)[0]  # compressed cosine distances
    new = (z + 0.5 * rng.normal(size=z.shape)) @ rng.normal(size=(32, 20))
    cal = fit_calibration(old[:300], new[:300], method="quantile", pairs=200_000)
    old, new = old[300:], new[300:]
    for t in (0.3, 0.5, 0.7):
        migrated = migrated_at(np.random.default_rng(1).permutation(300), t)
        found = top_k(merged_distances(new, old, new, old, migrated, cal), 10)
        assert abs((~migrated)[found].mean() - (1 - t)) < 0.1


def test_pool_adjacent_violators_gives_the_nearest_non_decreasing_sequence():
    got = pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 2.0, 5.0]), np.ones(5))
    assert np.allclose(got, [1.0, 7 / 3, 7 / 3, 7 / 3, 5.0])


def test_cosine_pairs_get_the_isotonic_map_and_raw_metrics_the_quantile_one():
    assert [default_map(m) for m in ("cosine", "dot", "euclid", "manhattan")] == [
        "isotonic",
        "quantile",
        "quantile",
        "quantile",
    ]
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 8))
    old, new = z @ rng.normal(size=(8, 6)), (z + rng.normal(size=z.shape)) @ rng.normal(size=(8, 6))
    chosen = fit_calibration(old, new, pairs=20_000)
    assert chosen == fit_calibration(old, new, method="isotonic", pairs=20_000)
    assert chosen != fit_calibration(old, new, method="quantile", pairs=20_000)
    with pytest.raises(ValueError, match="unknown calibration map 'mean'"):
        fit_calibration(old, new, method="mean")


@pytest.mark.parametrize("method", ["isotonic", "quantile"])
def test_the_map_is_the_identity_for_one_model_and_shrinks_for_a_tighter_one(method):
    rng = np.random.default_rng(0)
    old = rng.normal(size=(400, 16))
    d = np.linspace(0.3, 1.2, 8)  # inside the sampled distances
    same = fit_calibration(old, old, method=method, pairs=20_000)
    assert np.allclose(same(d), d, atol=0.05)
    # A new model whose embeddings share a large common component: every distance is smaller.
    tighter = fit_calibration(old, np.hstack([old, np.full((400, 1), 8.0)]), method=method, pairs=20_000)
    assert np.all(tighter(d) < 0.5 * d) and np.all(np.diff(tighter(d)) > 0)  # order within old kept


def test_calibrated_old_hits_move_behind_new_ones_they_would_have_beaten():
    cal = Calibration((0.0, 0.5, 2.0), (0.0, 0.9, 2.0))  # old distances run small: 0.3 is 0.54 for new
    old = [Hit("a", 0.7, float(cal(np.array(0.3))), "old", {})]
    new = [Hit("b", 0.5, 0.5, "new", {})]
    assert [h.id for h in merge(old, new, 2)] == ["b", "a"]
    assert [h.id for h in merge([Hit("a", 0.7, 0.3, "old", {})], new, 2)] == ["a", "b"]


def test_bad_knots_are_refused():
    with pytest.raises(ValueError, match="increase"):
        Calibration((0.0, 0.0), (0.1, 0.2))
    with pytest.raises(ValueError, match="three or more"):
        fit_calibration(np.ones((2, 3)), np.ones((2, 3)))
