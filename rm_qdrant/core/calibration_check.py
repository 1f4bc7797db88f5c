"""Whether ``rmq calibrate`` keeps a map, and which of the maps it knows the guard would take (pure numpy).

A map is fitted on one part of a sample and judged on the held-out rest: its forecast
against the plain merge (and the map in use), and the label-free guard
(:func:`rm_qdrant.core.guard.guard`). A refusal names the maps the command did not try:
each is fitted and judged on the same split, cheapest first (``quantile``: quantiles of
the pair distances; ``isotonic``: pool-adjacent-violators over bins of them besides), so a
team is told which ``--map`` passes instead of finding it by trial, a sample each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.calibration import Calibration, fit_calibration
from rm_qdrant.core.forecast import ModeForecast, OldDistance, compare_calibrated
from rm_qdrant.core.guard import GuardVerdict, calibration_refusal, guard

#: The maps in the order a refusal tries them: cheapest first.
CHEAPEST_FIRST = ("quantile", "isotonic")


@dataclass(frozen=True)
class MapJudgement:
    """One map fitted on the fit part and judged on the held-out part.

    Attributes:
        forecasts: plain, calibrated and (where the pair has a map) in-use curves.
        refused: why the map is not kept ("" when it is).
    """

    method: str
    calibration: Calibration
    forecasts: list[ModeForecast]
    verdict: GuardVerdict
    refused: str

    @property
    def kept(self) -> bool:
        return not self.refused

    def as_dict(self) -> dict[str, object]:
        plain, calibrated, *_ = self.forecasts
        return {
            "map": self.method,
            "area": calibrated.area,
            "plain_area": plain.area,
            "guard_passed": self.verdict.passed,
            "refused": self.refused or None,
        }


def judge_map(
    method: str,
    fit: tuple[np.ndarray, np.ndarray],
    held: tuple[np.ndarray, np.ndarray],
    *,
    order: np.ndarray,
    k: int,
    metric: str,
    seed: int,
    in_use: OldDistance | None = None,
) -> MapJudgement:
    """Fit ``method`` on ``fit`` (old, new rows) and judge it on ``held``, backfilled in ``order``.

    Raises:
        ValueError: a sample :func:`~rm_qdrant.core.calibration.fit_calibration` cannot fit.
    """
    calibration = fit_calibration(*fit, metric=metric, method=method, seed=seed)
    old, new = held
    forecasts = compare_calibrated(old, new, calibration, order=order, k=k, metric=metric, in_use=in_use)
    plain, calibrated, *current = forecasts
    # The calibrated merge against the plain one, each hit judged by both models (see calibration_refusal).
    verdict = guard(
        old,
        new,
        new,
        old,
        order=order,
        k=k,
        metric=metric,
        fitted_distance=calibration,
        subject="the calibrated merge",
        baseline="the plain merge",
    )
    why = calibration_refusal(calibrated.area, plain.area, verdict, current[0].area if current else None)
    return MapJudgement(method, calibration, forecasts, verdict, why)


def other_maps(
    tried: str,
    fit: tuple[np.ndarray, np.ndarray],
    held: tuple[np.ndarray, np.ndarray],
    *,
    order: np.ndarray,
    k: int,
    metric: str,
    seed: int,
    in_use: OldDistance | None = None,
    maps: Sequence[str] = CHEAPEST_FIRST,
) -> list[MapJudgement]:
    """Every map but ``tried``, cheapest first, each judged as :func:`judge_map` judges it."""
    return [
        judge_map(m, fit, held, order=order, k=k, metric=metric, seed=seed, in_use=in_use)
        for m in maps
        if m != tried
    ]


def alternatives_text(judged: Sequence[MapJudgement]) -> str:
    """One clause: the first map the guard would take, as the option to give, and each map tried."""
    if not judged:
        return ""
    tried = "; ".join(
        f"--map {j.method}: " + ("would be kept" if j.kept else f"also refused ({j.refused})") for j in judged
    )
    passing = next((j for j in judged if j.kept), None)
    head = (
        f"--map {passing.method} would be kept (rerun with it)"
        if passing
        else "no map this command knows would be kept"
    )
    return f"{head}; tried on the same held-out points: {tried}"
