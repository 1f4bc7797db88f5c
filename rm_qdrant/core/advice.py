"""What a forecast advises, in words: which mode to serve, whether the naive merge is safe,
what a crowded merge needs (pure: the forecasts in, one line out)."""

from __future__ import annotations

from collections.abc import Sequence

from rm_qdrant.core.forecast import Crowding, ModeForecast


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


def recommend(
    forecasts: Sequence[ModeForecast],
    *,
    calibrated: bool = False,
    k: int | None = None,
    maps: Sequence[tuple[str, bool]] = (),
) -> str:
    """A plain recommendation: which mode to serve, and whether the naive merge is safe.

    A merge is unsafe where its recall@k dips below its start, or where one side is crowded out
    of the merged top k (:meth:`ModeForecast.crowded`); ``calibrated``: the naive curve is
    a calibrated pair's; ``maps``: calibrate's maps tried on the sample (:func:`crowding_fix`).
    """
    by_mode = {f.mode: f for f in forecasts}
    naive, rm = by_mode["naive"], by_mode.get("rm")
    safety = _naive_safety(naive, calibrated, k)
    unsafe = bool(naive.dips() or naive.crowded())
    calibrate = bool(naive.crowded()) and not calibrated
    if rm is None:
        if not unsafe:
            return f"serve naive; {safety}."
        fix = crowding_fix(calibrate, maps)
        return f"do not serve the naive merge as it is: {fix}; {safety}."
    candidates = [f for f in (rm, naive) if not (f.dips() or f.crowded())] or [rm, naive]
    best = max(candidates, key=lambda f: f.area)
    other = naive if best is rm else rm
    return (
        f"serve {best.mode} (area {best.area:.3f} vs {other.mode} {other.area:.3f}"
        + (f"; rm dips at t = {', '.join(f'{t:g}' for t in rm.dips())}" if rm.dips() else "")
        + (f"; in rm, {crowding_text(rm.crowded(), k)}" if rm.crowded() else "")
        + f"); {safety}"
        + ("; rmq calibrate puts its old distances on the new model's scale." if calibrate else ".")
    )
