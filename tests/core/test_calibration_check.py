"""A refused calibration names the map the guard would take (issue 38, item 3): on a dot-product
pair whose new vectors are ten times longer (the old half crowded out), the guard refuses the
isotonic map and the quantile map passes; the refusal says ``--map quantile``, having tried it
on the same held-out points."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.calibration_check import alternatives_text, judge_map, other_maps

pytestmark = pytest.mark.slow

N, K = 120, 3


def _crowded_dot_pair() -> dict:
    """Old vectors and new ones that mostly agree (95 %) but are ten times longer, split in half;
    seed 0 is a draw on which the guard refuses isotonic and passes quantile."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(N, 16)), rng.normal(size=(N, 16))
    old = a * rng.uniform(0.5, 1.5, size=(N, 1))
    new = 10 * np.hstack([0.95 * a + 0.05 * b, 0.5 * rng.normal(size=(N, 8))]) * rng.uniform(0.5, 1.5, (N, 1))
    idx = rng.permutation(N)
    fit, held = idx[: N // 2], idx[N // 2 :]
    order = rng.permutation(N // 2)
    return {
        "fit": (old[fit], new[fit]),
        "held": (old[held], new[held]),
        "order": order,
        "k": K,
        "metric": "dot",
        "seed": 0,
    }


def test_a_refused_isotonic_map_names_quantile_which_the_guard_takes() -> None:
    split = _crowded_dot_pair()
    isotonic = judge_map("isotonic", **split)
    assert not isotonic.kept and isotonic.refused.startswith("the guard refuses it")
    others = other_maps("isotonic", **split)
    assert [(j.method, j.kept) for j in others] == [("quantile", True)]
    text = alternatives_text(others)
    assert text.startswith("--map quantile would be kept")
    # Judged again on the same split, the same verdict: nothing in it is drawn afresh.
    assert judge_map("isotonic", **split).verdict == isotonic.verdict
