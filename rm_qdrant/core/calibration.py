"""The calibrated naive merge: old-collection distances mapped onto the new model's scale (pure numpy).

A naive pair merges two collections by distance, but the old and the new model measure
distance on their own scales: when the old model's distances run smaller, old hits
crowd out the new ones, and the other way round. Raw vectors make it worse: under dot
or Euclid, a model whose vectors are ten times longer has distances ten (Euclid) or a
hundred (dot) times larger, and one side never reaches the top k.

The map fixed here is a **quantile map** onto the new side's scale: an old distance at
quantile q of the old model's distances between random pairs of sampled points goes to
the new model's distance at the same quantile q over the same pairs. It is monotone, so
it never changes the order within the old collection; it only says where an old hit sits
among new hits, and since each side's near neighbours are then as near as the other's,
each side holds about its share of the gallery in a merged top k. Knots sit at
log-spaced quantiles, so near neighbours (what a top-k merge compares) get most of them.
It is fitted without labels on a sample of the gallery (the stored old vectors, and the
new model's embeddings of the same images), under the collection's own metric, with the
distances :func:`rm_qdrant.core.merge.score_to_distance` gives (cosine ``1 - cos``, dot
``-x·y``, Euclid ``‖x-y‖``, Manhattan ``Σ|x-y|``), so it takes the distances DualIndex
computes from Qdrant's scores. Identical vectors (distance 0 under every metric but dot)
map to 0; beyond its end knots the map goes on straight at the ratio of the two sides'
spans (a dot product of a point with itself lies below every pair's).

An earlier map regressed the new distance on the old one (isotonic, the mean new
distance given the old): a mean pulls near neighbours' distances towards the average,
so where the two models disagree, old near neighbours ranked behind new ones and old
hits rarely reached the top k. Maps stored by it still load and apply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.spaces import nonnegative, paired_distances

#: Added slope, as a share of the map's own ratio: the map is strictly increasing, so ties
#: never appear among old hits.
SLOPE = 1e-3
#: Random pairs × vector dimension read at once while fitting.
_CELLS = 8_000_000


@dataclass(frozen=True)
class Calibration:
    """A monotone piecewise-linear map: ``old`` knots (increasing) to ``new`` knots (non-decreasing)."""

    old: tuple[float, ...]
    new: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.old) != len(self.new) or len(self.old) < 2:
            raise ValueError("a calibration needs two or more (old, new) knots")
        if not np.all(np.isfinite(self.old)) or not np.all(np.isfinite(self.new)):
            raise ValueError("calibration knots must be finite numbers")
        if np.any(np.diff(self.old) <= 0) or np.any(np.diff(self.new) < 0):
            raise ValueError("calibration knots must increase")

    @property
    def ratio(self) -> float:
        """The new side's span over the old side's: how the map scales distances on the whole."""
        spread = (self.new[-1] - self.new[0]) / (self.old[-1] - self.old[0])
        return spread if spread > 0 else 1.0

    def __call__(self, distances: np.ndarray) -> np.ndarray:
        """Old-side distances as the merge compares them (straight on beyond the end knots)."""
        d = np.asarray(distances, dtype=np.float64)
        lo, hi, ratio = self.old[0], self.old[-1], self.ratio
        mapped = np.interp(d, self.old, self.new)
        mapped = np.where(d < lo, self.new[0] + (d - lo) * ratio, mapped)
        mapped = np.where(d > hi, self.new[-1] + (d - hi) * ratio, mapped)
        return mapped + SLOPE * ratio * (d - lo)

    def as_dict(self) -> dict[str, list[float]]:
        return {"old": list(self.old), "new": list(self.new)}

    @classmethod
    def from_dict(cls, data: dict[str, list[float]]) -> Calibration:
        return cls(tuple(data["old"]), tuple(data["new"]))


def _pair_distances(
    old: np.ndarray, new: np.ndarray, metric: str, pairs: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Old and new distances over the same random pairs of distinct rows, read in blocks."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(old), pairs), rng.integers(0, len(old), pairs)
    keep = i != j
    i, j = i[keep], j[keep]
    step = max(1, _CELLS // max(old.shape[1], new.shape[1], 1))
    parts = [
        (
            paired_distances(old[i[s : s + step]], old[j[s : s + step]], metric),
            paired_distances(new[i[s : s + step]], new[j[s : s + step]], metric),
        )
        for s in range(0, len(i), step)
    ]
    return np.concatenate([o for o, _ in parts]), np.concatenate([n for _, n in parts])


def fit_calibration(
    old: np.ndarray,
    new: np.ndarray,
    *,
    metric: str = "cosine",
    knots: int = 64,
    pairs: int = 1_000_000,
    seed: int = 0,
) -> Calibration:
    """Fit the quantile map on paired rows (the same images): stored old vectors and the new model's.

    ``metric`` is the collection's distance (cosine, dot, euclid, manhattan).

    Raises:
        ValueError: fewer than three rows, rows of different counts, vectors that are not
            finite, or old distances that are all equal.
    """
    if len(old) != len(new) or len(old) < 3:
        raise ValueError(f"a calibration needs three or more paired rows; got {len(old)} and {len(new)}")
    o, n = np.asarray(old, dtype=np.float32), np.asarray(new, dtype=np.float32)
    if not (np.isfinite(o).all() and np.isfinite(n).all()):
        raise ValueError("the sample's vectors are not all finite numbers: nothing to calibrate")
    d_old, d_new = _pair_distances(o, n, metric, pairs, seed)
    levels = np.unique(np.concatenate([[0.0], np.geomspace(1e-5, 1.0, knots)]))
    xs, first = np.unique(np.quantile(d_old, levels), return_index=True)
    ys = np.maximum.accumulate(np.quantile(d_new, levels)[first])
    if len(xs) < 2:
        raise ValueError("the sample's old distances are all equal: nothing to calibrate")
    if nonnegative(metric) and xs[0] > 0:
        xs, ys = np.concatenate([[0.0], xs]), np.concatenate([[0.0], np.maximum(ys, 0.0)])
    return Calibration(tuple(map(float, xs)), tuple(map(float, ys)))
