"""The calibrated naive merge, fitted on a sample of the gallery with no training and no labels:
:func:`calibrate` (``rmq calibrate``) and :func:`clear_calibration` (``rmq calibrate --clear``).

A naive pair's two models measure distance on their own scales; the map fitted here
(:mod:`rm_qdrant.core.calibration`, under the pair's own metric) puts old-collection hits on the
new model's scale before the merge. It is kept in the pair record and applied by every search
while the pair is naive.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.api.common import OnStep, check_callback, draw_with_steps, pair_source, sample_line
from rm_qdrant.core.calibration import MAPS, default_map
from rm_qdrant.core.calibration_check import MapJudgement, alternatives_text, judge_map, other_maps
from rm_qdrant.core.forecast import ModeForecast, holdout_split
from rm_qdrant.core.guard import GuardVerdict
from rm_qdrant.errors import ConfigError, Refused
from rm_qdrant.pair.record import PairRecord, load_pair, save_pair
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store


@dataclass(frozen=True)
class CalibrationReport:
    """What :func:`calibrate` fitted and how it was judged (``rmq calibrate --json`` is
    :meth:`as_dict`). A refused map's report is ``Refused.report``.

    Attributes:
        pair: the pair's name.
        sample: points re-embedded (unreadable ones left out).
        sample_key: a digest of the sample: the same key, seed and map in use give the same
            verdict.
        judged_on: what the verdict was judged on, in one line.
        unreadable: sampled points whose image could not be read.
        fitted_on: points the map was fitted on.
        held_out: points held out to judge it.
        k: neighbours compared.
        knots: the map's knots.
        distance: the pair's metric.
        mapping: the map, ``isotonic`` or ``quantile``.
        forecasts: the plain merge's curve, the calibrated one, and the map in use's (if any).
        guard: the label-free guard's verdict on the map.
        refused: why the map is not kept on its merits (None: it passes).
        kept: whether the pair now merges with this map (it passes, or ``force``).
        alternatives: after a refusal, the other maps judged on the same split.
        had_calibration: whether the pair had a map before.
    """

    pair: str
    sample: int
    sample_key: str
    judged_on: str
    unreadable: int
    fitted_on: int
    held_out: int
    k: int
    knots: int
    distance: str
    mapping: str
    forecasts: tuple[ModeForecast, ...]
    guard: GuardVerdict
    refused: str | None
    kept: bool
    alternatives: tuple[MapJudgement, ...] = ()
    had_calibration: bool = False

    @property
    def better_than_plain(self) -> bool:
        """The forecast's word alone: the calibrated curve's area beats the plain merge's."""
        return self.forecasts[1].area > self.forecasts[0].area

    @property
    def better_than_in_use(self) -> bool | None:
        """Against the map the pair had (None: it had none)."""
        return self.forecasts[1].area > self.forecasts[2].area if len(self.forecasts) > 2 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair,
            "sample": self.sample,
            "sample_key": self.sample_key,
            "unreadable": self.unreadable,
            "fitted_on": self.fitted_on,
            "held_out": self.held_out,
            "k": self.k,
            "knots": self.knots,
            "distance": self.distance,
            "mapping": self.mapping,
            "forecasts": [f.as_dict() for f in self.forecasts],
            "better_than_plain": self.better_than_plain,
            "better_than_in_use": self.better_than_in_use,
            "guard": self.guard.as_dict(),
            "refused": self.refused,
            "kept": self.kept,
            "alternatives": [j.as_dict() for j in self.alternatives],
        }

    def areas(self) -> str:
        """The curves' areas in one clause: calibrated, plain, and the map in use's."""
        plain, calibrated, *in_use = self.forecasts
        return f"{calibrated.area:.3f} calibrated, {plain.area:.3f} plain" + (
            f", {in_use[0].area:.3f} the map in use" if in_use else ""
        )


def calibrate(
    store: Store,
    name: str,
    *,
    sample: int = 20000,
    holdout: float = 0.1,
    k: int = 10,
    seed: int = 0,
    mapping: str = "auto",
    force: bool = False,
    source: SourceConfig | None = None,
    on_step: OnStep | None = None,
) -> CalibrationReport:
    """Map the old model's distances onto the new model's scale for a naive pair's merge:
    ``rmq calibrate``.

    A sample of the old collection is re-embedded with the pair's new model; the map is fitted
    on part of it and kept only if, on the rest, it forecasts better than the plain merge and
    the label-free guard passes it (its hits as near in both models' eyes as the plain merge's,
    at every t); or with ``force``. Otherwise the pair is left as it was and :class:`Refused` is
    raised, its ``report`` naming the map that would be kept, if one would.

    Args:
        sample: points to sample (at least 8).
        holdout: the share of the sample kept out of the fit, in (0, 0.5].
        k: neighbours compared.
        seed: of the sample and the split.
        mapping: ``isotonic``, ``quantile``, or ``auto`` (isotonic for cosine, else quantile).
        force: keep the map even when it forecasts worse than the plain merge or the guard
            refuses it.
        source: how images are fetched (default: the settings the pair recorded).
        on_step: told of each image re-embedded (:class:`Step`).

    Raises:
        Refused: the map is not kept (the pair is left as it was).
        ConfigError: the pair is not a backfilling naive pair; a bad option.
        CollectionNotFound: no pair of that name.

    Example:
        >>> rm_qdrant.calibrate(store, "photos", sample=5000).kept  # doctest: +SKIP
        True
    """
    _check_options(sample, holdout, k, seed, mapping, on_step)
    pair = load_pair(store, name)
    if pair.mode != "naive" or pair.state != "backfilling":
        raise ConfigError(
            f"pair {name!r} is {pair.state} in {pair.mode} mode: the calibration maps the old model's own "
            "distances, for a backfilling naive pair (an rm pair's ψ already puts them on the new scale)"
        )
    index = DualIndex.open(store, name)
    images = pair_source(pair, source)
    drawn = draw_with_steps(store, pair, index.encoder, sample, seed=seed, source=images, on_step=on_step)
    try:
        fit_idx, held_idx = holdout_split(len(drawn.ids), holdout, seed, k=k)
        method = mapping if mapping != "auto" else default_map(pair.distance)
        order = np.random.default_rng(seed).permutation(len(held_idx))
        split = {
            "fit": (drawn.old[fit_idx], drawn.new[fit_idx]),
            "held": (drawn.old[held_idx], drawn.new[held_idx]),
            "order": order,
            "k": k,
            "metric": pair.distance,
            "seed": seed,
            "in_use": pair.old_distance,
        }
        judged = judge_map(method, **split)
        # A refusal says which map the guard would take, each tried on the same split, cheapest first.
        others = other_maps(method, **split) if not judged.kept and not force else []
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    in_use = len(judged.forecasts) > 2  # the map the pair had, judged beside the new one
    report = CalibrationReport(
        pair=name,
        sample=len(drawn.ids),
        sample_key=drawn.key,  # the same key, seed and map in use: the same verdict
        judged_on=sample_line(drawn, seed, "the map in use" if in_use else "the plain merge"),
        unreadable=drawn.failed,
        fitted_on=len(fit_idx),
        held_out=len(held_idx),
        k=k,
        knots=len(judged.calibration.old),
        distance=pair.distance,
        mapping=method,
        forecasts=tuple(judged.forecasts),
        guard=judged.verdict,
        refused=judged.refused or None,
        kept=not judged.refused or force,
        alternatives=tuple(others),
        had_calibration=bool(pair.calibration),
    )
    if not report.kept:
        raise _refusal(report)
    # Re-read: another command may have changed the pair while the sample was embedded, and
    # writing back the record read at the start would silently undo it (a switch-encoder).
    current = load_pair(store, name)
    if _judged_on(current) != _judged_on(pair):
        raise ConfigError(
            f"pair {name!r} changed while it was being calibrated (now {current.state}, {current.mode} "
            f"mode, {current.encoder.name}, decoded {current.decode}): the map is not recorded; run rmq "
            "calibrate again"
        )
    save_pair(store, dataclasses.replace(current, calibration=judged.calibration.as_dict()))
    return report


def _judged_on(pair: PairRecord) -> tuple[object, ...]:
    """What a calibration was fitted under: the same graph, mode, state and decode mode."""
    return (pair.state, pair.mode, pair.encoder, pair.old_encoder, pair.decode)


def _check_options(sample: int, holdout: float, k: int, seed: int, mapping: str, on_step: object) -> None:
    """The checks ``rmq calibrate``'s options make, for a Python caller."""
    for value, what, low in ((sample, "sample", 8), (k, "k", 1), (seed, "seed", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{what} is a whole number >= {low}, got {value!r}")
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout <= 0.5:
        raise ConfigError(f"holdout is a share of the sample in (0, 0.5], got {holdout!r}")
    if mapping not in ("auto", *MAPS):
        raise ConfigError(f"mapping is one of auto, {', '.join(MAPS)}, not {mapping!r}")
    check_callback(on_step, "on_step", "one Step")


def _refusal(report: CalibrationReport) -> Refused:
    instead = alternatives_text(report.alternatives)
    return Refused(
        f"on the {report.held_out} held-out points the {report.mapping} map is refused: {report.refused} "
        f"(area {report.areas()}); pair {report.pair!r} "
        + ("keeps the map it had" if report.had_calibration else "still merges plain distances")
        + " (--force keeps the new map anyway)"
        + (f"; {instead}" if instead else ""),
        report=report,
    )


def clear_calibration(store: Store, name: str) -> PairRecord:
    """Remove pair ``name``'s calibration: its searches merge plain distances again (``rmq
    calibrate --clear``). Returns the pair's record.

    Raises:
        CollectionNotFound: no pair of that name.
    """
    pair = dataclasses.replace(load_pair(store, name), calibration=None)
    save_pair(store, pair)
    return pair
