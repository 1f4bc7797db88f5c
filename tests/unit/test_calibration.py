"""The calibrated naive merge's map: monotone, fitted without labels, and what it does to a merge."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.calibration import Calibration, fit_calibration, pool_adjacent_violators
from rm_qdrant.core.merge import Hit, merge


def test_pool_adjacent_violators_gives_the_nearest_non_decreasing_sequence():
    got = pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 2.0, 5.0]), np.ones(5))
    assert np.allclose(got, [1.0, 7 / 3, 7 / 3, 7 / 3, 5.0])


def test_the_map_is_the_identity_for_one_model_and_shrinks_for_a_tighter_one():
    rng = np.random.default_rng(0)
    old = rng.normal(size=(400, 16))
    d = np.linspace(0.3, 1.2, 8)  # inside the sampled distances (the map is flat beyond its end knots)
    same = fit_calibration(old, old, pairs=20_000)
    assert np.allclose(same(d), d, atol=0.05)
    # A new model whose embeddings share a large common component: every distance is smaller.
    tighter = fit_calibration(old, np.hstack([old, np.full((400, 1), 8.0)]), pairs=20_000)
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
