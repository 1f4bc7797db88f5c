"""The calibrated naive merge: old-collection distances mapped onto the new model's scale (pure numpy).

A naive pair merges two collections by distance, but the old and the new model measure
distance on their own scales: when the old model's distances run smaller, old hits
crowd out the new ones, and the other way round. The map fixed here is monotone, so it
never changes the order within the old collection; it only says where an old hit sits
among new hits. It is fitted without labels on a sample of the gallery (the stored old
vectors, and the new model's embeddings of the same images): over random pairs of
sampled points, the mean new distance given the old distance, made non-decreasing
(isotonic regression by pool-adjacent-violators), on bins at log-spaced quantiles of
the old distances so that near neighbours, what a top-k merge compares, get most knots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.metrics import unit

#: Added slope: the map is strictly increasing, so ties never appear among old hits.
SLOPE = 1e-3


@dataclass(frozen=True)
class Calibration:
    """A monotone piecewise-linear map: ``old`` knots (increasing) to ``new`` knots (non-decreasing)."""

    old: tuple[float, ...]
    new: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.old) != len(self.new) or len(self.old) < 2:
            raise ValueError("a calibration needs two or more (old, new) knots")
        if np.any(np.diff(self.old) <= 0) or np.any(np.diff(self.new) < 0):
            raise ValueError("calibration knots must increase")

    def __call__(self, distances: np.ndarray) -> np.ndarray:
        """Old-side distances as the merge compares them (held flat beyond the end knots, plus the slope)."""
        d = np.asarray(distances, dtype=np.float64)
        return np.interp(d, self.old, self.new) + SLOPE * d

    def as_dict(self) -> dict[str, list[float]]:
        return {"old": list(self.old), "new": list(self.new)}

    @classmethod
    def from_dict(cls, data: dict[str, list[float]]) -> Calibration:
        return cls(tuple(data["old"]), tuple(data["new"]))


def pool_adjacent_violators(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest to ``values`` in weighted least squares."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    return np.concatenate([np.full(int(c), m) for m, _, c in blocks])


def fit_calibration(
    old: np.ndarray, new: np.ndarray, *, knots: int = 64, pairs: int = 1_000_000, seed: int = 0
) -> Calibration:
    """Fit the map on paired rows (the same images): stored old vectors and the new model's embeddings.

    Cosine distances. Raises:
        ValueError: fewer than three rows, or rows of different counts.
    """
    if len(old) != len(new) or len(old) < 3:
        raise ValueError(f"a calibration needs three or more paired rows; got {len(old)} and {len(new)}")
    o, n = unit(old), unit(new)
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(o), pairs), rng.integers(0, len(o), pairs)
    keep = i != j
    i, j = i[keep], j[keep]
    d_old = 1.0 - np.einsum("ij,ij->i", o[i], o[j], dtype=np.float64)
    d_new = 1.0 - np.einsum("ij,ij->i", n[i], n[j], dtype=np.float64)
    levels = np.unique(np.concatenate([[0.0], np.geomspace(1e-5, 1.0, knots)]))
    edges = np.quantile(d_old, levels)
    which = np.clip(np.searchsorted(edges, d_old, side="right") - 1, 0, len(edges) - 2)
    count = np.bincount(which, minlength=len(edges) - 1)
    full = count > 0
    xs = np.bincount(which, d_old, len(edges) - 1)[full] / count[full]
    ys = pool_adjacent_violators(np.bincount(which, d_new, len(edges) - 1)[full] / count[full], count[full])
    xs, first = np.unique(xs, return_index=True)
    if len(xs) < 2:
        raise ValueError("the sample's old distances are all equal: nothing to calibrate")
    return Calibration(tuple(map(float, xs)), tuple(map(float, np.maximum.accumulate(ys[first]))))
