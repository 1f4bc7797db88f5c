"""Labels win where they exist (issue 39): rm against the naive merge is decided by the labelled
mAP curves when the forecasts carry them, and the recommendation says when the label-free
forecast (recall@k against the new model's own neighbours) would have picked the other mode."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.advice import LABEL_FIXED_TOLERANCE, advise, recommend
from rm_qdrant.core.forecast import ModeForecast

T = (0.0, 0.5, 1.0)


def curve(
    mode: str, recall: tuple[float, ...], maps: tuple[float, ...] | None = None, **extra
) -> ModeForecast:
    """A forecast that neither dips nor crowds a side out, unless ``recall`` says otherwise."""
    return ModeForecast(mode, T, recall, recall, maps, maps, **extra)


RISING = (0.4, 0.7, 1.0)  # recall that never dips
HIGHER = (0.6, 0.8, 1.0)


def test_without_labels_the_label_free_forecast_decides_in_the_words_it_always_used():
    advice = advise([curve("naive", RISING), curve("rm", HIGHER)], k=10)
    assert advice.serve == "rm" and advice.decided_by == "label-free"
    assert advice.text.startswith("serve rm (area 0.800 vs naive 0.700); the naive merge is safe")
    assert advice.as_dict()["disagreement"] is None


def test_rm_above_naive_at_every_t_is_served_and_the_forecasts_agree():
    naive, rm = curve("naive", RISING, (0.5, 0.6, 0.7)), curve("rm", HIGHER, (0.6, 0.65, 0.7))
    advice = advise([naive, rm], k=10)
    assert (advice.serve, advice.decided_by, advice.labels, advice.label_free) == ("rm", "labels", "rm", "rm")
    assert advice.text.startswith("serve rm by the labelled forecast (mAP area 0.650 vs naive 0.600)")
    assert "the label-free forecast agrees (recall@k area 0.800 vs naive 0.700)" in advice.text
    assert advice.as_dict()["disagreement"] is None and advice.as_dict()["rm_below_naive"] == []


def test_rm_below_naive_at_one_t_is_refused_though_its_areas_are_larger():
    """The issue's case: a larger area under mAP and under recall, but below naive at t = 0."""
    naive, rm = curve("naive", RISING, (0.53, 0.55, 0.65)), curve("rm", HIGHER, (0.46, 0.70, 0.80))
    advice = advise([naive, rm], k=10)
    assert advice.serve == "naive" and advice.decided_by == "labels" and advice.label_free == "rm"
    assert "rm's mAP falls below the naive merge's at t = 0, by up to 0.070 at t = 0" in advice.text
    assert (
        "the label-free forecast (recall@k against the new model's own neighbours) would have picked rm "
        "(area 0.800 vs naive 0.700), but the labels say otherwise"
    ) in advice.text
    out = advice.as_dict()
    assert out["disagreement"] == {"labels": "naive", "label_free": "rm"}
    assert [g["t"] for g in out["rm_below_naive"]] == [0.0]
    assert recommend([naive, rm], k=10) == advice.text


def test_a_dip_below_naive_within_the_tolerance_does_not_refuse_rm():
    below = 0.5 - LABEL_FIXED_TOLERANCE / 2
    advice = advise([curve("naive", RISING, (0.5, 0.6, 0.7)), curve("rm", HIGHER, (below, 0.7, 0.75))])
    assert advice.serve == "rm" and advice.as_dict()["rm_below_naive"] == []


@pytest.mark.parametrize(("rm_recall", "picked"), [(HIGHER, "rm"), ((0.3, 0.6, 1.0), "naive")])
def test_a_tie_on_the_labels_goes_to_the_label_free_pick(rm_recall, picked):
    maps = (0.5, 0.6, 0.7)
    advice = advise([curve("naive", RISING, maps), curve("rm", rm_recall, maps)])
    assert advice.serve == picked and advice.decided_by == "labels"
    assert advice.as_dict()["disagreement"] is None and "the label-free forecast agrees" in advice.text


def test_naive_with_the_larger_labelled_area_wins_where_rm_is_never_refused():
    """rm within the tolerance at every t, but below all along: the larger area, naive's, wins."""
    near = 0.8 * LABEL_FIXED_TOLERANCE
    maps = (0.5, 0.7, 0.8)
    naive, rm = curve("naive", RISING, maps), curve("rm", HIGHER, tuple(m - near for m in maps))
    advice = advise([naive, rm], k=10)
    assert advice.serve == "naive" and not advice.as_dict()["rm_below_naive"]
    assert advice.text.startswith("serve naive by the labelled forecast (mAP area 0.675 vs rm 0.671)")
    assert "would have picked rm" in advice.text


@pytest.mark.parametrize(("spread", "refused"), [(0.001, True), (0.5, False)])
def test_the_tolerance_is_two_standard_errors_of_the_per_query_difference(spread, refused):
    """rm 0.01 below naive at t = 0 on 100 queries: refused when every query agrees it is worse,
    kept when the per-query differences scatter so widely that 0.01 is noise."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, size=100)
    noise = spread * np.where(np.arange(100) % 2, 1.0, -1.0)
    naive_q = (base, base, base)
    rm_q = (base - 0.01 + noise, base + 0.1, base + 0.1)
    naive = curve("naive", RISING, tuple(float(q.mean()) for q in naive_q), query_maps=naive_q)
    rm = curve("rm", HIGHER, tuple(float(q.mean()) for q in rm_q), query_maps=rm_q)
    advice = advise([naive, rm])
    assert (advice.serve == "naive") == refused
    gap = advice.gaps[0]
    assert gap.margin == pytest.approx(-0.01)
    expected = 2 * np.std(rm_q[0] - naive_q[0], ddof=1) / np.sqrt(100)
    assert gap.tolerance == pytest.approx(max(0.002, expected))
