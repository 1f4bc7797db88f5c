"""The label-free backfill forecast: it sees the naive merge's dip, and calibrated heads without one."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.advice import recommend
from rm_qdrant.core.forecast import agreement, forecast, merged_distances, top_k
from rm_qdrant.core.metrics import migrated_at


def models(seed: int = 0, n: int = 400):
    """A spread-out new model, and an old one whose distances are all compressed (a shared offset)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 8, size=n)
    z = rng.normal(size=(8, 16))[labels] + 0.6 * rng.normal(size=(n, 16))
    w = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    offset = 12.0 * np.eye(16)[0]
    old = z @ w + 0.4 * rng.normal(size=(n, 16)) + offset
    new = z + 0.1 * rng.normal(size=(n, 16))
    calibrated = new @ w + offset  # ρ puts the new vectors on the old model's scale; ψ(ρ(x)) = ρ(x) here
    return old, new, calibrated, labels, rng.permutation(n)


def test_different_distance_scales_make_the_naive_merge_dip():
    old, new, _, labels, order = models()
    (naive,) = forecast(old, new, order=order, labels=labels)
    assert naive.recall[-1] == pytest.approx(1.0)  # fully migrated: the new model's own neighbours
    assert naive.dips() and naive.dips()[0] == pytest.approx(0.1)
    assert min(naive.recall) < naive.recall[0] - 0.05
    assert naive.maps is not None and min(naive.maps) < naive.maps[0]  # the labels agree: a real dip
    advice = recommend([naive])
    assert "not safe" in advice and "train ψ/ρ heads" in advice


def test_calibrated_heads_forecast_no_dip_and_are_recommended():
    old, _, calibrated, labels, order = models()
    naive, rm = forecast(old, calibrated, rev=calibrated, order=order, labels=labels)
    assert rm.mode == "rm" and not rm.dips()
    assert all(b >= a - 0.005 for a, b in zip(rm.recall, rm.recall[1:]))
    assert rm.area > 0.5 and recommend([naive, rm]).startswith("serve rm")


def test_merged_top_k_and_agreement_against_a_loop():
    rng = np.random.default_rng(3)
    old, new = rng.normal(size=(30, 5)), rng.normal(size=(30, 7))
    migrated = migrated_at(rng.permutation(30), 0.4)
    found = top_k(merged_distances(new, old, new, old, migrated), 4)
    unit = lambda x: x / np.linalg.norm(x)  # noqa: E731
    for q in range(30):
        d = [
            (1 - unit(new[q]) @ unit(new[j]) if migrated[j] else 1 - unit(old[q]) @ unit(old[j]), j)
            for j in range(30)
            if j != q
        ]
        assert found[q].tolist() == [j for _, j in sorted(d)[:4]]
    reference = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    recall, ndcg = agreement(np.array([[1, 2, 9, 9], [9, 9, 9, 9]]), reference)
    assert recall == pytest.approx(2 / 8)
    gains = 1 / np.log2(np.arange(2, 6))
    assert ndcg == pytest.approx((gains[0] + gains[1]) / gains.sum() / 2)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="two or more items"):
        forecast(np.zeros((1, 3)), np.zeros((1, 3)), order=np.arange(1))


@pytest.mark.parametrize(
    ("labels", "named"),
    [
        (["cat", 3, 2.5, "dog"], True),  # strings and numbers name classes
        (["cat", None], False),  # missing on a point
        (["cat", ["cat"]], False),  # a list would be a class of its own, "['cat']"
        (["cat", {"n": "cat"}], False),
        (["cat", True], False),
    ],
)
def test_a_sample_has_labels_only_when_every_point_names_a_class(labels, named) -> None:
    """rmq fit --label-field and rmq probe read these; a list or an object became a class of its
    own through str() without a word (found by an adversarial run)."""
    from rm_qdrant.evaluation.probe import ProbeSample

    n = len(labels)
    sample = ProbeSample(
        list(range(n)),
        [{"meta": {"label": v}} for v in labels],
        np.zeros((n, 2)),
        np.zeros((n, 2)),
        None,
        "",
        0,
    )
    assert (sample.labels("meta.label") == labels) if named else sample.labels("meta.label") is None
