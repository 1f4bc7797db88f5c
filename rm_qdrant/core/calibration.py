"""The calibrated naive merge: old-collection distances mapped onto the new model's scale (pure numpy).

A naive pair merges two collections by distance, but the old and the new model measure
distance on their own scales: when the old model's distances run smaller, old hits
crowd out the new ones, and the other way round. Raw vectors make it worse: under dot
or Euclid, a model whose vectors are ten times longer has distances ten (Euclid) or a
hundred (dot) times larger, and one side never reaches the top k.

Two monotone maps onto the new side's scale, fitted without labels on a sample of the
gallery (the stored old vectors, and the new model's embeddings of the same images) over
random pairs of sampled points, under the collection's own metric, with the distances
:func:`rm_qdrant.core.merge.score_to_distance` gives (cosine ``1 - cos``, dot ``-x·y``,
Euclid ``‖x-y‖``, Manhattan ``Σ|x-y|``), so they take the distances DualIndex computes
from Qdrant's scores:

- **isotonic**: the mean new distance given the old distance, made non-decreasing
  (pool-adjacent-violators), on bins at log-spaced quantiles of the old distances;
- **quantile**: an old distance at quantile q of the old model's distances goes to the
  new model's distance at the same q, so each side's near neighbours are as near as the
  other's and each side holds about its share of the gallery in a merged top k.

Both are monotone, so neither changes the order within the old collection; they only
say where an old hit sits among new hits. Knots sit at log-spaced quantiles, so near
neighbours (what a top-k merge compares) get most of them. Identical vectors (distance 0
under every metric but dot) map to 0; beyond its end knots a map goes on straight at the
ratio of the two sides' spans. :func:`default_map` says which one a metric gets, and why.
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


#: The maps :func:`fit_calibration` fits.
MAPS = ("isotonic", "quantile")


def default_map(metric: str) -> str:
    """``isotonic`` for cosine, ``quantile`` for the raw-scale metrics (dot, Euclid, Manhattan).

    On the cosine pairs measured (docs/benchmarks.md, "rmq fit and rmq calibrate on six
    pairs") the isotonic map served a higher
    mAP than the quantile one on two of three pairs (+1.5 and +0.6 AUC points) and the same
    on the third: where the new model is the better one, ranking old hits at the mean new
    distance of their old distance pushes them back, rightly. Under dot or Euclid with raw
    vectors of other scales, that mean regression of two disagreeing models flattens every
    old distance towards the average and the old side still never reaches the top k (the
    crowding ``rmq calibrate`` is there to fix); the quantile map gives each side about its
    share of the gallery in the merged top k.
    """
    return "isotonic" if metric == "cosine" else "quantile"


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


def _isotonic(d_old: np.ndarray, d_new: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean new distance given the old one, on bins at the old distances' ``levels``
    quantiles, made non-decreasing (pool-adjacent-violators)."""
    edges = np.quantile(d_old, levels)
    which = np.clip(np.searchsorted(edges, d_old, side="right") - 1, 0, len(edges) - 2)
    count = np.bincount(which, minlength=len(edges) - 1)
    full = count > 0
    xs = np.bincount(which, d_old, len(edges) - 1)[full] / count[full]
    ys = pool_adjacent_violators(np.bincount(which, d_new, len(edges) - 1)[full] / count[full], count[full])
    xs, first = np.unique(xs, return_index=True)
    return xs, ys[first]


def fit_calibration(
    old: np.ndarray,
    new: np.ndarray,
    *,
    metric: str = "cosine",
    method: str | None = None,
    knots: int = 64,
    pairs: int = 1_000_000,
    seed: int = 0,
) -> Calibration:
    """Fit the map on paired rows (the same images): stored old vectors and the new model's.

    ``metric`` is the collection's distance (cosine, dot, euclid, manhattan); ``method``
    one of :data:`MAPS`: ``isotonic`` (the mean new distance given the old one) or
    ``quantile`` (the new distance at the old one's quantile); None: :func:`default_map`.

    Raises:
        ValueError: fewer than three rows, rows of different counts, vectors that are not
            finite, or old distances that are all equal.
    """
    if len(old) != len(new) or len(old) < 3:
        raise ValueError(f"a calibration needs three or more paired rows; got {len(old)} and {len(new)}")
    o, n = np.asarray(old, dtype=np.float32), np.asarray(new, dtype=np.float32)
    if not (np.isfinite(o).all() and np.isfinite(n).all()):
        raise ValueError("the sample's vectors are not all finite numbers: nothing to calibrate")
    method = method or default_map(metric)
    if method not in MAPS:
        raise ValueError(f"unknown calibration map {method!r}; expected one of {', '.join(MAPS)}")
    d_old, d_new = _pair_distances(o, n, metric, pairs, seed)
    levels = np.unique(np.concatenate([[0.0], np.geomspace(1e-5, 1.0, knots)]))
    if method == "isotonic":
        xs, ys = _isotonic(d_old, d_new, levels)
    else:
        xs, first = np.unique(np.quantile(d_old, levels), return_index=True)
        ys = np.quantile(d_new, levels)[first]
    ys = np.maximum.accumulate(ys)
    if len(xs) < 2:
        raise ValueError("the sample's old distances are all equal: nothing to calibrate")
    if nonnegative(metric) and xs[0] > 0:
        xs, ys = np.concatenate([[0.0], xs]), np.concatenate([[0.0], np.maximum(ys, 0.0)])
    return Calibration(tuple(map(float, xs)), tuple(map(float, ys)))
