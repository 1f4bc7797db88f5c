"""The re-rank applied to rows of a merged distance matrix (pure numpy: no store, no clock).

A forecast (``rmq probe``, ``rmq fit``'s guard) and the offline benchmarks score a backfill from
a query × gallery matrix of merged distances, not from hit lists. The re-rank a search makes
(:func:`rm_qdrant.core.rerank.reranked`: the merged list's first K ordered by the new model's
distances, the rest after them as they were) is, on such a row, a new matrix whose ascending
order is the re-ranked order. Every old item among the K is taken as read and embedded in time:
a forecast of the re-rank at its best, which the served curve (``rmq eval --rerank``) measures
with the deadline and the fetch budget.
"""

from __future__ import annotations

import numpy as np


def reranked_rows(
    merged: np.ndarray,
    rescored: np.ndarray,
    k: int,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """``merged`` (queries × items, lower is closer) re-ranked: each row's ``k`` closest items
    (the query itself left out) take their distance in ``rescored`` (the new model's, query ×
    items) and come first, the others follow in their merged order.

    The values of the result rank, they are not distances: the head's are the new model's, the
    rest's are shifted past them. The query's own cell (``rows[i]`` of row i; ``i`` when
    ``rows`` is None) is infinite.

    Args:
        merged: the merged distances, one row per query.
        rescored: the new model's distances, the same shape (migrated items: the same values).
        k: how many of each row's closest items are re-ranked (>= 1).
        rows: the item each query row is (None: row i is item i).

    Raises:
        ValueError: ``k`` below 1, or matrices of different shapes.

    >>> merged = np.array([[0.0, 0.1, 0.2, 0.3]])
    >>> rescored = np.array([[0.0, 0.9, 0.5, 0.0]])
    >>> np.argsort(reranked_rows(merged, rescored, 2), axis=1)[0, :3].tolist()
    [2, 1, 3]
    """
    if k < 1:
        raise ValueError(f"a re-rank takes k >= 1 items, got {k}")
    if np.shape(merged) != np.shape(rescored):
        raise ValueError(f"merged {np.shape(merged)} and rescored {np.shape(rescored)} differ in shape")
    out = np.array(merged, dtype=np.float64)
    at = np.arange(len(out))
    out[at, at if rows is None else rows] = np.inf
    k = min(k, out.shape[1] - 1)
    if k < 1 or not len(out):
        return out
    head = np.argpartition(out, k - 1, axis=1)[:, :k]
    new_head = np.take_along_axis(np.asarray(rescored, dtype=np.float64), head, axis=1)
    finite = np.where(np.isfinite(out), out, np.nan)
    low = np.nanmin(finite, axis=1, keepdims=True)
    shift = np.maximum(0.0, np.nanmax(new_head, axis=1, keepdims=True) - low) + 1.0
    out += shift  # every item past the head now ranks after all of the head's new distances
    np.put_along_axis(out, head, new_head, axis=1)
    return out


def sample_depth(k: int, sample: int, gallery: int) -> int:
    """The depth on a sample of ``sample`` items that stands for a re-rank of the first ``k`` of a
    gallery of ``gallery`` items: the same share of the items, ``k · sample / gallery`` rounded
    (at least 1, at most ``sample - 1``). A gallery's first 100 of 10,000 hold the nearest 1 %;
    on a sample of 2,000 that is its first 20.

    >>> sample_depth(100, 2000, 10000)
    20
    """
    share = k * sample / max(gallery, sample, 1)
    return max(1, min(sample - 1, round(share)))
