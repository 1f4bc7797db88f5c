"""Old and New, the paper's references: the old model alone and the plain new model alone.

An rm pair serves its graph from t = 0 (ψ's queries against the old vectors) to t = 1 (ρ's
gallery), so its own ends are not the two systems the paper compares against: Old is the
old model's queries on the old gallery, New the plain new model (no ψ, no ρ) on a gallery it
embedded whole. A naive pair's ends are those two. For an rm pair, :func:`measure_naive` serves
the naive pair of the same gallery on a copy (old model on old, the plain new model on new)
at the fractions ``rmq eval`` measures the pair at, so the naive curve stands beside the pair's
and its t = 0 and t = 1 points are Old and New; :func:`forecast_with_plain` gives ``rmq probe``
the same naive merge.

A naive pair's encoder is its plain new model; an rm pair records one as ``new_model`` (``rmq
init --new-model``, or the graph a naive pair served before ``rmq switch-encoder`` moved it to ψ),
and a caller's ``--new-model`` overrides it for that run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.forecast import ModeForecast, compare_fitted
from rm_qdrant.core.ordering import order_keys
from rm_qdrant.errors import ConfigError, EncoderError
from rm_qdrant.evaluation.evaluate import ServedPoint, evaluate_served
from rm_qdrant.evaluation.probe import ProbeSample
from rm_qdrant.evaluation.sandbox import sandbox
from rm_qdrant.migration.migrate import MigrateOptions
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import load_encoder
from rm_qdrant.operations.create import plain_model_ref
from rm_qdrant.operations.indexing import ImageItem
from rm_qdrant.pair.layouts import count_new
from rm_qdrant.pair.record import ModelRef, PairRecord, open_encoder, save_pair
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.store import Store

#: Why an rm pair has no New without the plain new model.
NO_PLAIN = (
    "pair {name!r} is an rm pair and records no plain new model (its graph's new output has ρ): "
    "give the plain new model with --new-model PATH (or record it: rmq switch-encoder --new-model)"
)


@dataclass(frozen=True)
class Ends:
    """Old and New as served (mAP and top-1), or why they could not be measured."""

    old: ServedPoint | None
    new: ServedPoint | None
    missing: str | None = None  # why Old or New is unknown


def plain_new_model(pair: PairRecord, given: str | None) -> OnnxEncoder | None:
    """The plain new model: ``given``, else a naive pair's encoder (None: the pair's own), else the
    one an rm pair recorded, else None.

    Raises:
        ConfigError: ``given`` for a naive pair whose encoder is another model; for an rm pair,
            one with ψ or made for another distance; the recorded model's file is another now.
        DimensionMismatch: ``given`` makes vectors of another size than the pair's new ones.
        EncoderError: the model (given or recorded) cannot be read.
    """
    if pair.mode == "naive":
        if given is not None:
            model = load_encoder(given, decode=pair.decode)
            if model.fingerprint != pair.encoder.fingerprint:
                raise ConfigError(
                    f"pair {pair.name!r} is naive: its encoder {pair.encoder.name} is the plain new model, "
                    f"and --new-model {given} is another one"
                )
            return model
        return None  # the pair's own encoder already is the plain new model
    if given is not None:  # the checks rmq init --new-model makes: no ψ, the pair's size and distance
        model = load_encoder(given, decode=pair.decode)
        plain_model_ref(model, pair.name, dim=pair.encoder.dim, distance=pair.distance)
        return model
    if pair.new_model is not None:
        try:
            return open_encoder(
                None, pair.new_model, pair.name, "the recorded plain new model", decode=pair.decode
            )
        except EncoderError as exc:
            raise EncoderError(
                f"pair {pair.name!r}'s recorded plain new model: {exc}; give it with --new-model PATH"
            ) from exc
    return None


@dataclass(frozen=True)
class NaiveCurve:
    """The naive merge of an rm pair's gallery as served at each fraction, or why it is unknown."""

    points: tuple[ServedPoint, ...] = ()
    missing: str | None = None  # why it was not measured

    def ends(self) -> Ends:
        """Old and New: the naive curve's t = 0 and t = 1 points."""
        if self.missing is not None:
            return Ends(None, None, self.missing)
        if not self.points or self.points[0].t != 0.0 or self.points[-1].t != 1.0:
            return Ends(None, None, "the curve needs both t = 0 and t = 1 (--at 0,...,1)")
        return Ends(self.points[0], self.points[-1])

    def below(self, points: Sequence[ServedPoint]) -> list[tuple[float, float]]:
        """(t, naive − pair mAP) where the pair's served mAP (``points``, the same fractions) is
        below the naive merge's."""
        return [(a.t, b.map - a.map) for a, b in zip(points, self.points, strict=True) if a.map < b.map]


def ends_of_curve(pair: PairRecord, points: Sequence[ServedPoint]) -> Ends:
    """A naive pair's Old and New: its own served t = 0 (nothing in new yet) and t = 1 points."""
    if not points or points[0].t != 0.0 or points[-1].t != 1.0:
        return Ends(None, None, "the curve needs both t = 0 and t = 1 (--at 0,...,1)")
    if points[0].fraction > 0.0:
        return Ends(
            None,
            points[-1],
            f"{points[0].fraction:.1%} of the gallery was already in new when eval began, so its t = 0 "
            "is not the old model alone",
        )
    return Ends(points[0], points[-1])


def measure_naive(
    store: Store,
    pair: PairRecord,
    queries: Sequence[ImageItem],
    plain: OnnxEncoder | None,
    fractions: Sequence[float],
    *,
    options: MigrateOptions,
    k: int | None,
    exact: bool,
    on_points: Callable[[int], None] | None = None,
    on_point: Callable[[ServedPoint], None] | None = None,
) -> NaiveCurve:
    """An rm pair's naive curve: the naive pair of the same gallery (the old model, the plain new
    model) served on a copy at each of ``fractions``, migrated in the same order; its t = 0 and
    t = 1 points are Old and New. ``store`` is left as it was."""
    if pair.mode == "naive":
        raise ValueError("a naive pair's naive curve is its own: ends_of_curve")
    missing = _cannot_measure(store, pair, plain)
    if missing is not None or plain is None:
        return NaiveCurve(missing=missing)
    gallery = plain.info.gallery_output()
    with contextlib.ExitStack() as stack:
        copy, record = stack.enter_context(sandbox(store, pair, on_points=on_points))
        naive = dataclasses.replace(
            record, mode="naive", encoder=ModelRef.of(plain, gallery), calibration=None
        )
        save_pair(copy, naive)
        index = DualIndex.open(copy, pair.name, encoder=plain, exact=exact)
        points = evaluate_served(index, queries, fractions, options=options, k=k, on_point=on_point)
    return NaiveCurve(tuple(points))


def _cannot_measure(store: Store, pair: PairRecord, plain: OnnxEncoder | None) -> str | None:
    if plain is None:
        return NO_PLAIN.format(name=pair.name)
    if pair.old_encoder is None:
        return f"pair {pair.name!r} records no old model to query old with (rmq init --old-encoder)"
    if count_new(store, pair):
        return (
            f"pair {pair.name!r} already holds points in new, embedded by its graph: the plain new "
            "model's gallery cannot be served beside them"
        )
    gallery = plain.info.gallery_output()
    dim = store.collection(pair.new_collection, pair.new_using).dim
    if plain.info.outputs[gallery] != dim:
        return (
            f"the plain new model makes {plain.info.outputs[gallery]}-d vectors, "
            f"new collection {pair.new_collection!r} holds {dim}-d"
        )
    return None


def forecast_with_plain(
    sample: ProbeSample,
    plain: ProbeSample,
    *,
    order: str,
    seed: int,
    k: int,
    label_field: str,
    metric: str,
    order_field: str | None = None,
    rerank: int | None = None,
) -> list[ModeForecast]:
    """``rmq probe``'s curves for an rm pair: the naive merge of the plain new model (old vectors
    queried by the old model) and the pair's graph, both scored against the plain new model's
    neighbours, on the points both samples read (``rerank``: each re-ranking its merged first
    ``rerank`` of the sample by its own new model)."""
    if sample.rev is None:
        raise ValueError("the pair's sample has no rev output: not an rm graph")
    rows = {pid: i for i, pid in enumerate(plain.ids)}
    both = [i for i, pid in enumerate(sample.ids) if pid in rows]
    if len(both) < 2:
        raise ConfigError("fewer than two sampled images could be read by both models")
    other = [rows[sample.ids[i]] for i in both]
    ids = [sample.ids[i] for i in both]
    payloads = [sample.payloads[i] for i in both]
    old = sample.old[both]
    keys = order_keys(order, ids, payloads, old, seed=seed, label_field=order_field or label_field)
    labelled = dataclasses.replace(sample, ids=ids, payloads=payloads).labels(label_field)
    naive, fitted = compare_fitted(
        old,
        plain.new[other],
        sample.new[both],
        sample.rev[both],
        order=np.argsort(keys, kind="stable"),
        labels=labelled,
        k=k,
        metric=metric,
        rerank=rerank,
    )
    return [naive, dataclasses.replace(fitted, mode="rm")]
