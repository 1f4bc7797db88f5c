"""The forecast and the guard hold a bounded slice of the (holdout × holdout) matrices.

``rmq calibrate --sample 200000`` holds out 20,000 points: whole (n, n) matrices took
15-20 GB and were killed for memory on smaller machines. Scored in query chunks, the
results are the same and the memory is the chunk's, whatever the sample size.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from rm_qdrant.core import forecast as fc
from rm_qdrant.core.guard import guard
from rm_qdrant.core.metrics import migrated_at

pytestmark = pytest.mark.slow

FRACTIONS = (0.0, 0.3, 0.7, 1.0)


def pair(n: int, metric: str, seed: int = 0):
    """Two unnormalised models of the same n images (norms matter under dot and Euclid)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, size=n)
    z = rng.normal(size=(6, 12))[labels] + 0.8 * rng.normal(size=(n, 12))
    old = (z @ rng.normal(size=(12, 8)) + rng.normal(size=(n, 8))) * rng.uniform(0.5, 3.0, size=(n, 1))
    new = z @ rng.normal(size=(12, 16)) * rng.uniform(0.5, 2.0, size=(n, 1))
    rev = new @ rng.normal(size=(16, 8)) * 0.3
    return old.astype(np.float32), new.astype(np.float32), rev.astype(np.float32), labels, rng.permutation(n)


def everything(old, new, rev, labels, order, metric: str):
    """Each entry point that compares a holdout with itself."""

    def mapped(d):
        return 1.5 * d + 0.2

    curves = fc.forecast(old, new, rev, order=order, labels=labels, fractions=FRACTIONS, metric=metric)
    calibrated = fc.compare_calibrated(old, new, mapped, order=order, fractions=FRACTIONS, metric=metric)
    verdict = guard(
        old, new, new, rev, order=order, fractions=FRACTIONS, metric=metric, naive_distance=mapped
    )
    reference = fc.reference_top_k(new, 5, metric)
    now = fc.merged_agreement(new, rev, old, migrated_at(order, 0.5), reference, mapped, metric)
    return [c.as_dict() for c in (*curves, *calibrated)], verdict.as_dict(), reference.tolist(), now


@pytest.mark.parametrize("metric", ["cosine", "dot", "euclid", "manhattan"])
@pytest.mark.parametrize("rows_per_chunk", [1, 7])
def test_chunked_scoring_gives_what_whole_matrices_give(
    monkeypatch, metric: str, rows_per_chunk: int
) -> None:
    n = 90
    data = pair(n, metric)
    whole = everything(*data, metric)
    monkeypatch.setattr(fc, "ROW_CELLS", rows_per_chunk * n)  # uneven last chunk at 7 rows
    chunked = everything(*data, metric)
    assert chunked[2] == whole[2]  # the new model's own neighbours, item for item
    for a, b in zip(chunked[0], whole[0], strict=True):
        for key in ("recall", "ndcg", "map", "top1", "old_share_top_k"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-9), (a["mode"], key)
    assert chunked[1]["naive"] == pytest.approx(whole[1]["naive"], abs=1e-9)
    assert chunked[1]["fitted"] == pytest.approx(whole[1]["fitted"], abs=1e-9)
    assert chunked[1]["passed"] == whole[1]["passed"]
    assert chunked[3] == pytest.approx(whole[3], abs=1e-9)


def test_no_holdout_by_holdout_matrix_is_ever_held(monkeypatch) -> None:
    n = 1200
    data = pair(n, "cosine", seed=1)
    monkeypatch.setattr(fc, "ROW_CELLS", 20 * n)
    tracemalloc.start()
    try:
        everything(*data, "cosine")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_matrix = n * n * 4  # a single float32 (n, n) array: 5.8 MB; whole matrices held several float64 ones
    assert peak < one_matrix, f"peak {peak / 1e6:.1f} MB"
