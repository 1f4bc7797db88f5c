"""Forecasting a backfill before it runs: :func:`probe` (``rmq probe``), and the estimate
:func:`~rm_qdrant.api.inspecting.status` shows from the last probe's sample."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.api.common import OnStep, check_callback, draw_with_steps, pair_source, path_text, store_key
from rm_qdrant.core.advice import Advice, advise, crowding_text
from rm_qdrant.core.calibration_check import CHEAPEST_FIRST, judge_map
from rm_qdrant.core.forecast import ModeForecast, holdout_split
from rm_qdrant.core.inputspec import check_decode
from rm_qdrant.core.ordering import check_order
from rm_qdrant.core.paths import check_path
from rm_qdrant.core.rerank import as_rerank
from rm_qdrant.core.rerank_rows import sample_depth
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.baseline import forecast_with_plain, plain_new_model
from rm_qdrant.evaluation.probe import (
    ProbeSample,
    cache_path,
    check_probe,
    estimate_now,
    forecast_sample,
    load_sample,
    save_sample,
)
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store

#: The curve that merges an rm graph's new output with the stored old vectors, queried by the old
#: model: ψ left out, but not the naive merge (that uses the plain new model, ρ left out too).
NO_PSI = "no-psi"
CURVES = {
    "naive": "the naive merge: the old model queries the stored old vectors, the plain new model new ones",
    "rm": "this pair's graph: its rev output (ψ) queries the stored old vectors, its new output the new ones",
    NO_PSI: "this pair's new output merged with the stored old vectors without ψ (the old model queries "
    "old); not the naive merge, which uses the plain new model (--new-model PATH)",
}


@dataclass(frozen=True)
class ProbeReport:
    """What :func:`probe` forecast (``rmq probe --json`` is :meth:`as_dict`).

    Attributes:
        pair: the pair's name.
        mode: its query mode (``rm`` or ``naive``).
        decode: how the sample's images were decoded (``exact`` or ``fast``).
        recorded_decode: the pair's recorded mode (another than ``decode``: a what-if forecast,
            not kept for :func:`status`).
        sample: points re-embedded (unreadable ones left out).
        gallery: points the sample was drawn from (those still in old).
        unreadable: sampled points whose image could not be read.
        order: the backfill order simulated.
        k: neighbours compared.
        label_field: the payload field whose labels forecast mAP too (None: no labels).
        forecasts: one curve per mode (``naive``, ``rm``, or ``no-psi``; see :data:`CURVES`).
        advice: the recommendation and what decided it.
        cache: the file the sample is kept in for :func:`status`'s estimate (None: the store
            names no location to key it by, and nothing was kept).
        modality: what the pair's models read, ``image`` or ``text`` (documents are tokenised
            by the model's tokenizer: ``decode`` does not apply).
    """

    pair: str
    mode: str
    sample: int
    gallery: int
    unreadable: int
    order: str
    k: int
    label_field: str | None
    forecasts: tuple[ModeForecast, ...]
    advice: Advice
    cache: str | None
    decode: str = "exact"
    recorded_decode: str = "exact"
    modality: str = "image"
    rerank: int | None = None
    rerank_depth: int | None = None

    @property
    def recommendation(self) -> str:
        return self.advice.text

    def as_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair,
            "sample": self.sample,
            "gallery": self.gallery,
            "unreadable": self.unreadable,
            "order": self.order,
            "k": self.k,
            "label_field": self.label_field,
            "forecasts": [{**f.as_dict(), "curve": CURVES[f.mode]} for f in self.forecasts],
            "recommendation": self.advice.text,
            **self.advice.as_dict(),
            "cache": self.cache,
            "decode": self.decode,
            "recorded_decode": self.recorded_decode,
            "modality": self.modality,
            "rerank": self.rerank,
            "rerank_depth": self.rerank_depth,
        }


def probe(
    store: Store,
    name: str,
    *,
    sample: int = 2000,
    k: int = 10,
    order: str | None = None,
    seed: int = 0,
    source: SourceConfig | None = None,
    encoder: str | os.PathLike[str] | None = None,
    new_model: str | os.PathLike[str] | None = None,
    label_field: str | None = None,
    on_step: OnStep | None = None,
    decode: str | None = None,
    cache: bool = True,
    rerank: int | None = None,
) -> ProbeReport:
    """Forecast the backfill curve on a re-embedded sample of the gallery: ``rmq probe``.

    Nothing is written to the store. Quality is recall@k and nDCG@k against the new model's own
    neighbours over the sample (no labels needed); with payload labels (the pair's label field,
    or ``label_field``), mAP and top-1 too, and then mAP decides rm against the naive merge. The
    sample is kept in a local cache file, from which :func:`status` estimates the merge served now.

    Args:
        store: the store holding the pair.
        name: the pair's name.
        sample: points to re-embed (at least 2).
        k: neighbours compared.
        order: backfill order (``random``, ``centroid``, ...; default: the pair's, else random).
        seed: seed of the sample and of the random order.
        source: how images are fetched (default: the settings the pair recorded).
        encoder: the pair's encoder file, where it moved since ``init``.
        new_model: the plain new model (no ψ/ρ) of an rm pair, for its naive curve (default: the
            one the pair records; a naive pair's own encoder).
        label_field: payload field with class labels (``meta.dept``: nested; default: the pair's).
        on_step: told of each image re-embedded (:class:`Step`).
        decode: decode the sample's images ``exact`` or ``fast`` (default: as the pair records):
            the forecast of serving with that decoding. Nothing is recorded; a forecast decoded
            otherwise than the pair is not kept for :func:`status`'s estimate.
        cache: keep the sample for :func:`status`'s estimate (False: nothing is kept anywhere,
            as for the forecast of ``rmq plan``).
        rerank: forecast the curves of searches that re-rank their merged first ``rerank`` with
            the new model (``rmq eval --rerank`` serves them). On the sample the depth is the same
            share of the items, ``rerank · sample / gallery`` (at least 1: the report's
            ``rerank_depth``), and every old hit is taken as read in time. The forecast is not
            kept for :func:`status`'s estimate, which is of the plain merge.

    Raises:
        CollectionNotFound: no pair of that name.
        ConfigError: the pair is not backfilling, its old collection is gone, too few images could
            be read, ``label_field`` names no labels on the sample, or a bad option.
        EncoderError: a model cannot be read.

    Example:
        >>> report = rm_qdrant.probe(store, "photos", sample=500)  # doctest: +SKIP
        >>> report.advice.serve, report.forecasts[-1].area  # doctest: +SKIP
        ('rm', 0.912)
    """
    _check_probe_options(sample, k, seed, on_step)
    as_rerank(rerank)  # K checked before anything is read
    if decode is not None:
        check_decode(decode)
    check_probe(store, load_pair(store, name))  # before the encoders load: a finished pair says so
    index = DualIndex.open(store, name, encoder=path_text(encoder))
    pair = index.pair
    modality = index.encoder.info.modality if index.encoder is not None else "image"
    if decode is not None and modality == "text":
        raise ConfigError(
            f"pair {name!r} reads text: --decode says how images are decoded, and a text pair's "
            "documents are tokenised one way, by the model's tokenizer"
        )
    decode = decode or pair.decode
    spec = check_order(order) if order else (pair.order or "random")
    field = check_path(label_field, "--label-field") if label_field is not None else pair.label_field
    plain = plain_new_model(pair, path_text(new_model))  # before the sample: a wrong path stops at once
    plain = None if plain is None else plain.decoding_as(decode)
    images = pair_source(pair, source)
    model = None if index.encoder is None else index.encoder.decoding_as(decode)
    drawn = draw_with_steps(index.store, pair, model, sample, seed=seed, source=images, on_step=on_step)
    labelled = drawn.labels(field) is not None
    if label_field is not None and not labelled:  # asked for (as fit's label_field): an error
        raise ConfigError(
            f"payload field {label_field!r} is missing on some sampled points, or holds a list, an object or "
            "true/false instead of a class name (a string or a number): no labels to forecast mAP with"
        )
    depth = None if rerank is None else sample_depth(rerank, len(drawn.ids), drawn.gallery)
    forecasts, advice = _curves(
        index,
        drawn,
        plain,
        spec=spec,
        seed=seed,
        k=k,
        source=images,
        on_step=on_step,
        label_field=field,
        rerank=depth,
    )
    kept = cache and decode == pair.decode and rerank is None  # a what-if is not kept
    key = store_key(store) if kept else None
    cached = None if key is None else save_sample(drawn, cache_path(key, name), k=k)
    return ProbeReport(
        pair=name,
        mode=pair.mode,
        sample=len(drawn.ids),
        gallery=drawn.gallery,
        unreadable=drawn.failed,
        order=spec,
        k=k,
        label_field=field if labelled else None,
        forecasts=tuple(forecasts),
        advice=advice,
        cache=None if cached is None else str(cached),
        decode=decode,
        recorded_decode=pair.decode,
        modality=modality,
        rerank=rerank,
        rerank_depth=depth,
    )


def _check_probe_options(sample: int, k: int, seed: int, on_step: object) -> None:
    for value, what, low in ((sample, "sample", 2), (k, "k", 1), (seed, "seed", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{what} is a whole number >= {low}, got {value!r}")
    check_callback(on_step, "on_step", "one Step")


def _curves(
    index: DualIndex,
    sample: ProbeSample,
    plain: OnnxEncoder | None,
    *,
    spec: str,
    seed: int,
    k: int,
    source: SourceConfig,
    on_step: OnStep | None,
    label_field: str,
    rerank: int | None = None,
) -> tuple[list[ModeForecast], Advice]:
    """The forecasts and the advice. An rm pair's naive curve needs the plain new model (its own
    sample); without one, the curve of the graph's new output is named for what it is (no-psi)."""
    pair = index.pair
    if plain is not None and sample.rev is not None:
        size = len(sample.ids) + sample.failed  # the same points: draw_sample picks by the seed
        again = draw_with_steps(
            index.store,
            pair,
            plain,
            size,
            seed=seed,
            source=source,
            on_step=on_step,
            label="the plain new model",
        )
        forecasts = forecast_with_plain(
            sample,
            again,
            order=spec,
            seed=seed,
            k=k,
            label_field=label_field,
            metric=pair.distance,
            order_field=pair.label_field,  # the order rmq migrate will move it in
            rerank=rerank,
        )
        return forecasts, advise(forecasts, k=k)
    forecasts = forecast_sample(
        sample,
        order=spec,
        seed=seed,
        k=k,
        label_field=label_field,
        calibration=pair.old_distance,
        metric=pair.distance,
        order_field=pair.label_field,
        rerank=rerank,
    )
    if sample.rev is None:
        calibrated = pair.old_distance is not None
        naive = forecasts[0]
        maps = (
            () if calibrated or not naive.crowded() else calibrate_maps(sample, pair.distance, k=k, seed=seed)
        )
        return forecasts, advise(forecasts, calibrated=calibrated, k=k, maps=maps)
    forecasts = [dataclasses.replace(f, mode=NO_PSI) if f.mode == "naive" else f for f in forecasts]
    rm = forecasts[-1]
    return forecasts, Advice(
        without_plain_advice(forecasts, k), None if rm.dips() or rm.crowded() else "rm", "label-free"
    )


def calibrate_maps(sample: ProbeSample, metric: str, *, k: int, seed: int) -> tuple[tuple[str, bool], ...]:
    """Whether ``rmq calibrate``'s guard would keep each of its maps, cheapest first, judged on
    this sample as calibrate judges its own (its default holdout, else half; () when too few)."""
    for holdout in (0.1, 0.5):
        try:
            fit, held = holdout_split(len(sample.ids), holdout, seed, k=k)
        except ValueError:
            continue
        order = np.random.default_rng(seed).permutation(len(held))
        split = {"order": order, "k": k, "metric": metric, "seed": seed}
        try:
            return tuple(
                (
                    m,
                    judge_map(
                        m, (sample.old[fit], sample.new[fit]), (sample.old[held], sample.new[held]), **split
                    ).kept,
                )
                for m in CHEAPEST_FIRST
            )
        except ValueError:
            return ()
    return ()


def without_plain_advice(forecasts: list[ModeForecast], k: int) -> str:
    """An rm pair's advice when the plain new model is unknown: the graph's curve, the no-ψ curve
    named for what it is, and no verdict on the naive merge, which was not forecast."""
    by_mode = {f.mode: f for f in forecasts}
    rm, other = by_mode["rm"], by_mode[NO_PSI]
    problems = [f"rm dips at t = {', '.join(f'{t:g}' for t in rm.dips())}"] if rm.dips() else []
    problems += [f"in rm, {crowding_text(rm.crowded(), k)}"] if rm.crowded() else []
    verdict = (
        f"rm is not safe ({'; '.join(problems)}" if problems else "serve rm (it never dips below its start"
    )
    return (
        f"{verdict}; area {rm.area:.3f}, {NO_PSI} {other.area:.3f}: this graph's new output without ψ). "
        "The naive merge was not forecast: give the plain new model with --new-model PATH, or record it "
        "(rmq switch-encoder --new-model PATH)"
    )


def status_estimate(
    store: Store, pair: PairRecord, *, fraction: float | None = None
) -> dict[str, Any] | None:
    """The label-free estimate for the current state (``fraction`` of the gallery migrated), from
    the last probe's sample (None without one, or one probed with another model)."""
    key = store_key(store)
    loaded = None if key is None else load_sample(cache_path(key, pair.name))
    if loaded is None:
        return None
    sample, k = loaded
    if sample.encoder != pair.encoder.fingerprint or sample.decode != pair.decode:
        return None  # probed with another model, or decoded otherwise: not this pair's forecast
    return estimate_now(store, pair, sample, k=k, fraction=fraction)
