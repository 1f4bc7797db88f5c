"""Forecast a backfill's quality curve on a sample, without labels (pure numpy).

Each sample item is a query against the rest of the sample. The reference is the
new model's exhaustive top-k over the sample: the ranking the pair serves once the
backfill is done. At each fraction t, a share t of the sample has migrated (new
vectors) and the rest holds old vectors; a query's merged top-k is compared with
its reference top-k by recall@k and nDCG@k (binary relevance: in the reference
top-k or not). With labels, mAP and top-1 over the sample are added.

A query mode says what a query uses against the old half: ``naive``, the old
model's vector of the same image (the stored old vector); ``rm``, the encoder's
``rev`` output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.metrics import FRACTIONS, area, backfill_retrieval, migrated_at, unit

#: A map of old-side distances before the merge (the calibrated naive merge).
OldDistance = Callable[[np.ndarray], np.ndarray]

#: How far (recall@k) a curve may fall below its start before it counts as a dip.
DIP_TOLERANCE = 0.005


@dataclass(frozen=True)
class ModeForecast:
    """One query mode's forecast curve."""

    mode: str  # naive | rm
    fractions: tuple[float, ...]
    recall: tuple[float, ...]  # recall@k against the new model's neighbours
    ndcg: tuple[float, ...]
    maps: tuple[float, ...] | None = None  # with labels
    top1s: tuple[float, ...] | None = None

    @property
    def area(self) -> float:
        """Area under recall@k over t (1.0 would be the new model from the start)."""
        return area(self.recall, self.fractions)

    def dips(self, tolerance: float = DIP_TOLERANCE) -> list[float]:
        """The fractions t > 0 where recall@k is below its value at t = 0 (negative flips)."""
        return [
            t
            for t, r in zip(self.fractions[1:], self.recall[1:], strict=True)
            if r < self.recall[0] - tolerance
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "fractions": list(self.fractions),
            "recall": list(self.recall),
            "ndcg": list(self.ndcg),
            "area": self.area,
            "dips_at": self.dips(),
            **({"map": list(self.maps), "top1": list(self.top1s or ())} if self.maps is not None else {}),
        }


def top_k(distances: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's ``k`` smallest distances, nearest first (the diagonal excluded)."""
    d = distances.copy()
    np.fill_diagonal(d, np.inf)
    k = min(k, d.shape[1] - 1)
    part = np.argpartition(d, k - 1, axis=1)[:, :k]
    order = np.argsort(np.take_along_axis(d, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def merged_distances(
    query_new: np.ndarray,
    query_old: np.ndarray,
    new: np.ndarray,
    old: np.ndarray,
    migrated: np.ndarray,
    old_distance: OldDistance | None = None,
) -> np.ndarray:
    """Cosine distances from every sample query to every sample item, as the merge sees them."""
    d = np.empty((len(new), len(new)), dtype=np.float32)
    qn, qo = unit(query_new), unit(query_old)
    d[:, migrated] = 1.0 - qn @ unit(new[migrated]).T
    old_side = 1.0 - qo @ unit(old[~migrated]).T
    d[:, ~migrated] = old_side if old_distance is None else old_distance(old_side)
    return d


def agreement(found: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Mean recall@k and nDCG@k of ``found`` (n, k) against ``reference`` (n, k)."""
    k = reference.shape[1]
    hit = (found[:, :, None] == reference[:, None, :]).any(axis=2)
    gains = 1.0 / np.log2(np.arange(2, k + 2))
    return float(hit.mean()), float((hit * gains).sum(axis=1).mean() / gains.sum())


def reference_top_k(new: np.ndarray, k: int) -> np.ndarray:
    """The new model's own top-k over the sample: what the pair serves once the backfill is done."""
    return top_k(1.0 - unit(new) @ unit(new).T, k)


def merged_agreement(
    new: np.ndarray,
    query_old: np.ndarray,
    old: np.ndarray,
    migrated: np.ndarray,
    reference: np.ndarray,
    old_distance: OldDistance | None = None,
) -> tuple[float, float]:
    """recall@k and nDCG@k of the merged top-k against ``reference`` (``migrated`` items served from new)."""
    found = top_k(merged_distances(new, query_old, new, old, migrated, old_distance), reference.shape[1])
    return agreement(found, reference)


def label_codes(labels: Sequence[object] | None) -> np.ndarray | None:
    """Labels as integers when every item has one, else None."""
    if labels is None or not all(label is not None for label in labels):
        return None
    return np.unique([str(label) for label in labels], return_inverse=True)[1]


@dataclass(frozen=True)
class _Backfill:
    """What every curve of one forecast shares: the order, the reference top-k, labels, fractions."""

    order: np.ndarray
    reference: np.ndarray
    y: np.ndarray | None
    fractions: Sequence[float]

    @classmethod
    def of(
        cls,
        old: np.ndarray,
        base: np.ndarray,
        *others: np.ndarray | None,
        order: np.ndarray,
        labels: Sequence[object] | None,
        k: int,
        fractions: Sequence[float],
    ) -> _Backfill:
        """Checked rows (two or more, one per item in every array); the reference is ``base``'s top-k.

        Raises:
            ValueError: fewer than two items, or arrays of different lengths.
        """
        n = len(old)
        if n < 2 or any(a is not None and len(a) != n for a in (base, *others, order)):
            raise ValueError(f"a forecast needs two or more items and one row each; got {n} old")
        return cls(order, reference_top_k(base, k), label_codes(labels), fractions)

    def curve(
        self,
        mode: str,
        new: np.ndarray,
        query_old: np.ndarray,
        old: np.ndarray,
        old_distance: OldDistance | None = None,
    ) -> ModeForecast:
        """One query mode: ``new`` fills (and queries) the new side, ``query_old`` queries the old."""
        recall, ndcg, maps, tops = [], [], [], []
        for t in self.fractions:
            migrated = migrated_at(self.order, t)
            r, g = merged_agreement(new, query_old, old, migrated, self.reference, old_distance)
            recall.append(r)
            ndcg.append(g)
            if self.y is not None:
                served = backfill_retrieval(
                    new, query_old, new, old, self.y, migrated, workers=1, old_distance=old_distance
                )
                maps.append(served.map)
                tops.append(served.top1)
        labelled = self.y is not None
        return ModeForecast(
            mode,
            tuple(self.fractions),
            tuple(recall),
            tuple(ndcg),
            tuple(maps) if labelled else None,
            tuple(tops) if labelled else None,
        )


def forecast(
    old: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray | None = None,
    *,
    order: np.ndarray,
    labels: Sequence[object] | None = None,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
    naive_distance: OldDistance | None = None,
) -> list[ModeForecast]:
    """The naive mode's forecast, and the rm mode's when ``rev`` is given.

    ``naive_distance`` is a calibrated naive pair's map of old distances (naive mode only).

    Args:
        old: the sample's stored old vectors (n, d_old).
        new: the encoder's gallery output for the same images (n, d_new).
        rev: the encoder's ``rev`` output for them (n, d_old), or None.
        order: the sample indices in migration order.
        labels: one label per item (None where unknown), or None for no labels.
        k: the neighbours compared.

    Raises:
        ValueError: fewer than two items, or arrays of different lengths.
    """
    backfill = _Backfill.of(old, new, rev, order=order, labels=labels, k=k, fractions=fractions)
    curves = [backfill.curve("naive", new, old, old, naive_distance)]
    if rev is not None:
        curves.append(backfill.curve("rm", new, rev, old))
    return curves


def holdout_split(n: int, holdout: float, seed: int, *, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices to fit on and to hold out (at least 2 of each), from a seeded shuffle.

    Raises:
        ValueError: a sample too small to split, or a holdout too small to compare top-``k`` lists.
    """
    held = max(2, round(n * holdout))
    if n - held < 2:
        raise ValueError(f"{n} sampled points are too few to fit on and hold some out")
    if held <= 2 * k:
        needed = math.ceil((2 * k + 1) / holdout)
        raise ValueError(
            f"{n} sampled points leave {held} held out, too few to compare top-{k} lists: "
            f"--k {k} --holdout {holdout:g} needs {needed} or more (a larger --sample or gallery, "
            "a larger --holdout, or a smaller --k)"
        )
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


def compare_fitted(
    old: np.ndarray,
    base: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray,
    *,
    order: np.ndarray,
    labels: Sequence[object] | None = None,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
) -> list[ModeForecast]:
    """The naive merge of the plain new model (``base``) beside a fitted encoder (``new``, ``rev``).

    Both curves are scored against ``base``'s own top-k, the team's new model: a fitted ρ
    that drifts away from the new model's neighbours is not rewarded for agreeing with itself.
    """
    backfill = _Backfill.of(old, base, new, rev, order=order, labels=labels, k=k, fractions=fractions)
    return [backfill.curve("naive", base, old, old), backfill.curve("fitted", new, rev, old)]


def compare_calibrated(
    old: np.ndarray,
    new: np.ndarray,
    calibration: OldDistance,
    *,
    order: np.ndarray,
    labels: Sequence[object] | None = None,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
) -> list[ModeForecast]:
    """The naive merge beside the calibrated one (old-side distances mapped by ``calibration``)."""
    backfill = _Backfill.of(old, new, order=order, labels=labels, k=k, fractions=fractions)
    return [backfill.curve("naive", new, old, old), backfill.curve("calibrated", new, old, old, calibration)]


def recommend(forecasts: Sequence[ModeForecast]) -> str:
    """A plain recommendation: which mode to serve, and whether the naive merge is safe."""
    by_mode = {f.mode: f for f in forecasts}
    naive, rm = by_mode["naive"], by_mode.get("rm")
    naive_dips = naive.dips()
    if naive_dips:
        safety = (
            f"the naive merge is not safe: its recall@k falls below its start ({naive.recall[0]:.3f}) "
            f"at t = {', '.join(f'{t:g}' for t in naive_dips)}"
        )
    else:
        safety = "the naive merge is safe: its recall@k never falls below its start"
    if rm is None:
        choice = (
            "serve naive" if not naive_dips else "do not serve the naive merge; train ψ/ρ heads (rm mode)"
        )
        return f"{choice}; {safety}."
    candidates = [f for f in (rm, naive) if not f.dips()] or [rm, naive]
    best = max(candidates, key=lambda f: f.area)
    other = naive if best is rm else rm
    return (
        f"serve {best.mode} (area {best.area:.3f} vs {other.mode} {other.area:.3f}"
        + (f"; rm dips at t = {', '.join(f'{t:g}' for t in rm.dips())}" if rm.dips() else "")
        + f"); {safety}."
    )
