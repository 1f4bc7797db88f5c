"""Distances under a collection's metric, as the merge compares them (pure numpy).

The convention is :func:`rm_qdrant.core.merge.score_to_distance`'s, so a map fitted on
these distances applies to the ones DualIndex computes from Qdrant's scores: lower is
closer, and

- cosine: ``1 - cos(x, y)`` (Qdrant normalises cosine vectors, so the scale is gone),
- dot: ``-x·y`` (raw vectors keep their norms: the model's scale is in the distance),
- euclid: ``‖x - y‖``,
- manhattan: ``Σ|x - y|``.
"""

from __future__ import annotations

import numpy as np

from rm_qdrant.core.merge import check_distance
from rm_qdrant.core.metrics import unit

#: Query × gallery × dimension cells a Manhattan block may hold at once.
_CELLS = 4_000_000


def distance_matrix(query: np.ndarray, gallery: np.ndarray, metric: str = "cosine") -> np.ndarray:
    """Distances from every query row to every gallery row, (len(query), len(gallery)), float32.

    >>> distance_matrix(np.array([[3.0, 4.0]]), np.array([[0.0, 0.0], [3.0, 4.0]]), "euclid")
    array([[5., 0.]], dtype=float32)
    """
    name = check_distance(metric)
    q, g = np.asarray(query, dtype=np.float32), np.asarray(gallery, dtype=np.float32)
    if name == "cosine":
        return 1.0 - unit(q) @ unit(g).T
    if name == "dot":
        return -(q @ g.T)
    if name == "euclid":
        squared = (q * q).sum(1)[:, None] + (g * g).sum(1)[None, :] - 2.0 * (q @ g.T)
        return np.sqrt(np.maximum(squared, 0.0))
    out = np.empty((len(q), len(g)), dtype=np.float32)
    step = max(1, _CELLS // max(1, len(g) * max(1, q.shape[1])))
    for start in range(0, len(q), step):
        out[start : start + step] = np.abs(q[start : start + step, None, :] - g[None, :, :]).sum(2)
    return out


def paired_distances(a: np.ndarray, b: np.ndarray, metric: str = "cosine") -> np.ndarray:
    """The distance of each row of ``a`` to the same row of ``b`` (float64).

    >>> paired_distances(np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]]), "dot")
    array([-11.])
    """
    name = check_distance(metric)
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if name == "cosine":
        return 1.0 - np.einsum("ij,ij->i", unit(x).astype(np.float64), unit(y).astype(np.float64))
    if name == "dot":
        return -np.einsum("ij,ij->i", x, y)
    if name == "euclid":
        return np.linalg.norm(x - y, axis=1)
    return np.abs(x - y).sum(axis=1)


def nonnegative(metric: str) -> bool:
    """Whether the metric's distances are never negative, with 0 for identical vectors (not dot)."""
    return check_distance(metric) != "dot"
