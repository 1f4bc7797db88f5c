"""What a forecast advises, in words: which mode to serve, whether the naive merge is safe,
what a crowded merge needs (pure: the forecasts in, one line out).

Labels win where they exist: when the forecasts carry labelled mAP curves, rm against the
naive merge is decided by them (:func:`labelled_gaps`), and the label-free forecast (recall@k
against the new model's own neighbours, blind to classes) is named beside it, with a word
when it would have picked the other mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rm_qdrant.core.forecast import Crowding, ModeForecast
from rm_qdrant.core.guard import GUARD_MIN_TOLERANCE, labelled_verdict
from rm_qdrant.core.metrics import area

#: Areas under mAP this close tie: the least tolerance of rmq fit's guards (core/guard.py).
LABEL_MIN_TOLERANCE = GUARD_MIN_TOLERANCE
#: The tolerance where the forecasts carry no per-query APs (curves built by hand, or read back
#: from JSON): DIP_TOLERANCE's size.
LABEL_FIXED_TOLERANCE = 0.005


def crowding_text(crowded: Sequence[Crowding], k: int | None = None) -> str:
    """One clause: which side is crowded out of the merged top k, where, and how far."""
    top = f"top {k}" if k else "top k"
    worst = min(crowded, key=lambda c: c.top_k / c.gallery)
    sides = " and ".join(sorted({c.side for c in crowded}))
    at = ", ".join(f"{t:g}" for t in sorted({c.t for c in crowded}))
    return (
        f"{sides} hits are crowded out of the merged {top} at t = {at} (at t = {worst.t:g} {worst.side} "
        f"holds {worst.gallery:.0%} of the sample but {worst.top_k:.0%} of the merged {top}): the two "
        "models' distance scales differ"
    )


def crowding_fix(calibrate: bool, maps: Sequence[tuple[str, bool]] = ()) -> str:
    """What a crowded (or dipping) naive merge needs: ``calibrate`` where it has no map yet;
    ``maps``: each of calibrate's maps, cheapest first, and whether its guard would keep it on
    the sample (none given: not tried)."""
    if not calibrate:
        return "train ψ/ρ heads (rm mode)"
    if not maps:
        return "run rmq calibrate, or train ψ/ρ heads (rm mode)"
    kept = [m for m, ok in maps if ok]
    each = ", ".join(f"{m} {'kept' if ok else 'refused'}" for m, ok in maps)
    if kept:
        return (
            f"run rmq calibrate --map {kept[0]} (tried on this sample: {each}), or train ψ/ρ heads (rm mode)"
        )
    return f"train ψ/ρ heads (rm mode): on this sample rmq calibrate would keep none of its maps ({each})"


def _naive_safety(naive: ModeForecast, calibrated: bool, k: int | None) -> str:
    problems = []
    if naive.dips():
        problems.append(
            f"its recall@k falls below its start ({naive.recall[0]:.3f}) "
            f"at t = {', '.join(f'{t:g}' for t in naive.dips())}"
        )
    if naive.crowded():
        problems.append(crowding_text(naive.crowded(), k) + (" even calibrated" if calibrated else ""))
    merge = "the calibrated naive merge" if calibrated else "the naive merge"
    if not problems:
        return f"{merge} is safe: its recall@k never falls below its start and neither side is crowded out"
    return f"{merge} is not safe: " + "; ".join(problems)


@dataclass(frozen=True)
class LabelledGap:
    """rm's labelled mAP against the naive merge's at one t, and how far below it may fall."""

    t: float
    margin: float  # rm − naive
    tolerance: float

    @property
    def below(self) -> bool:
        return self.margin < -self.tolerance

    def as_dict(self) -> dict[str, float]:
        return {"t": self.t, "margin": self.margin, "tolerance": self.tolerance}


def labelled_gaps(rm: ModeForecast, naive: ModeForecast) -> list[LabelledGap]:
    """rm − naive labelled mAP at each t, with its tolerance: rmq fit's labelled guard's
    (:func:`rm_qdrant.core.guard.labelled_verdict`: two standard errors of the per-query AP
    difference, at least GUARD_MIN_TOLERANCE; the two curves rank the same queries), or
    LABEL_FIXED_TOLERANCE where the curves carry no per-query APs.
    [] without labels on both curves.

    >>> a = ModeForecast("rm", (0.0, 1.0), (0.5, 1.0), (0.5, 1.0), maps=(0.40, 0.70))
    >>> b = ModeForecast("naive", (0.0, 1.0), (0.4, 1.0), (0.4, 1.0), maps=(0.50, 0.70))
    >>> [(g.t, round(g.margin, 2), g.below) for g in labelled_gaps(a, b)]
    [(0.0, -0.1, True), (1.0, 0.0, False)]
    """
    if rm.maps is None or naive.maps is None:
        return []
    tolerances = [LABEL_FIXED_TOLERANCE] * len(rm.fractions)
    per_query = rm.query_maps is not None and naive.query_maps is not None
    if per_query and all(
        len(qa) == len(qb) > 1 for qa, qb in zip(rm.query_maps, naive.query_maps, strict=True)
    ):
        tolerances = list(labelled_verdict(naive, rm).tolerances)  # the rule of rmq fit's labelled guard
    return [
        LabelledGap(t, a - b, tolerance)
        for t, a, b, tolerance in zip(rm.fractions, rm.maps, naive.maps, tolerances, strict=True)
    ]


@dataclass(frozen=True)
class Advice:
    """A recommendation and what decided it (``rmq probe --json``)."""

    text: str
    serve: str | None  # the mode to serve; None: not the naive merge as it is (no rm curve)
    decided_by: str  # labels | label-free
    label_free: str | None = None  # the mode the label-free forecast picks (with an rm curve)
    labels: str | None = None  # the mode the labels pick (with labelled rm and naive curves)
    gaps: tuple[LabelledGap, ...] = ()

    def as_dict(self) -> dict[str, object]:
        disagree = self.labels is not None and self.labels != self.label_free
        return {
            "serve": self.serve,
            "decided_by": self.decided_by,
            "disagreement": {"labels": self.labels, "label_free": self.label_free} if disagree else None,
            "rm_below_naive": [g.as_dict() for g in self.gaps if g.below],
        }


def recommend(
    forecasts: Sequence[ModeForecast],
    *,
    calibrated: bool = False,
    k: int | None = None,
    maps: Sequence[tuple[str, bool]] = (),
) -> str:
    """A plain recommendation: which mode to serve, and whether the naive merge is safe
    (:func:`advise`'s text)."""
    return advise(forecasts, calibrated=calibrated, k=k, maps=maps).text


def advise(
    forecasts: Sequence[ModeForecast],
    *,
    calibrated: bool = False,
    k: int | None = None,
    maps: Sequence[tuple[str, bool]] = (),
) -> Advice:
    """Which mode to serve, why, and whether the naive merge is safe.

    A merge is unsafe where its recall@k dips below its start, or where one side is crowded out
    of the merged top k (:meth:`ModeForecast.crowded`); ``calibrated``: the naive curve is
    a calibrated pair's; ``maps``: calibrate's maps tried on the sample (:func:`crowding_fix`).

    rm against naive: with labelled mAP curves on both, the labels decide. rm is refused where
    its mAP falls below the naive merge's at any t beyond the tolerance of :func:`labelled_gaps`,
    else the larger area under mAP wins (areas within LABEL_MIN_TOLERANCE tie, and a tie goes to
    the label-free forecast's pick, so that the last digits never make the two disagree). Without
    labels, the label-free forecast decides: of the curves that neither dip nor crowd a side
    out (else of both), the larger area under recall@k.
    """
    by_mode = {f.mode: f for f in forecasts}
    naive, rm = by_mode["naive"], by_mode.get("rm")
    safety = _naive_safety(naive, calibrated, k)
    unsafe = bool(naive.dips() or naive.crowded())
    calibrate = bool(naive.crowded()) and not calibrated
    if rm is None:
        if not unsafe:
            return Advice(f"serve naive; {safety}.", "naive", "label-free")
        fix = crowding_fix(calibrate, maps)
        return Advice(f"do not serve the naive merge as it is: {fix}; {safety}.", None, "label-free")
    candidates = [f for f in (rm, naive) if not (f.dips() or f.crowded())] or [rm, naive]
    free = max(candidates, key=lambda f: f.area)
    end = f"; {safety}" + (
        "; rmq calibrate puts its old distances on the new model's scale." if calibrate else "."
    )
    gaps = labelled_gaps(rm, naive)
    if not gaps:
        other = naive if free is rm else rm
        text = f"serve {free.mode} (area {free.area:.3f} vs {other.mode} {other.area:.3f}{_rm_flaws(rm, k)})"
        return Advice(text + end, free.mode, "label-free", free.mode)
    below = [g for g in gaps if g.below]
    margin = area(rm.maps or (), rm.fractions) - area(naive.maps or (), naive.fractions)
    pick = naive if below else free if abs(margin) <= LABEL_MIN_TOLERANCE else rm if margin > 0 else naive
    text = _labelled_text(pick, rm, naive, below) + _label_free_text(pick, free, rm, naive, k)
    return Advice(text + end, pick.mode, "labels", free.mode, pick.mode, tuple(gaps))


def _rm_flaws(rm: ModeForecast, k: int | None) -> str:
    return (f"; rm dips at t = {', '.join(f'{t:g}' for t in rm.dips())}" if rm.dips() else "") + (
        f"; in rm, {crowding_text(rm.crowded(), k)}" if rm.crowded() else ""
    )


def _labelled_text(
    pick: ModeForecast, rm: ModeForecast, naive: ModeForecast, below: list[LabelledGap]
) -> str:
    other = naive if pick is rm else rm
    text = (
        f"serve {pick.mode} by the labelled forecast (mAP area {area(pick.maps or (), pick.fractions):.3f} "
        f"vs {other.mode} {area(other.maps or (), other.fractions):.3f}"
    )
    if below:
        worst = min(below, key=lambda g: g.margin)
        text += (
            f"; rm's mAP falls below the naive merge's at t = {', '.join(f'{g.t:g}' for g in below)}, "
            f"by up to {-worst.margin:.3f} at t = {worst.t:g} (tolerance {worst.tolerance:.3f})"
        )
    return text + ")"


def _label_free_text(
    pick: ModeForecast, free: ModeForecast, rm: ModeForecast, naive: ModeForecast, k: int | None
) -> str:
    other = naive if free is rm else rm
    scores = f"area {free.area:.3f} vs {other.mode} {other.area:.3f}{_rm_flaws(rm, k)}"
    if free is pick:
        return f"; the label-free forecast agrees (recall@k {scores})"
    return (
        "; the label-free forecast (recall@k against the new model's own neighbours) would have picked "
        f"{free.mode} ({scores}), but the labels say otherwise"
    )
