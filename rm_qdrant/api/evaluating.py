"""Measuring the paper's curves as a pair serves them: :func:`evaluate` (``rmq eval``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rm_qdrant.api.common import (
    Counted,
    OnStep,
    check_callback,
    image_items,
    pair_source,
    path_text,
    say,
)
from rm_qdrant.core.metrics import area
from rm_qdrant.core.ordering import check_order
from rm_qdrant.core.rerank import PAIR_DEFAULT, Rerank, as_rerank, recorded_rerank
from rm_qdrant.errors import ConfigError, TextError
from rm_qdrant.evaluation.baseline import (
    NO_PLAIN,
    Ends,
    NaiveCurve,
    ends_of_curve,
    measure_naive,
    plain_new_model,
)
from rm_qdrant.evaluation.evaluate import Query, ServedPoint, evaluate_served
from rm_qdrant.evaluation.queries import TextQuery, query_of, read_queries
from rm_qdrant.evaluation.sandbox import sandbox
from rm_qdrant.migration.migrate import MigrateOptions
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations.indexing import ImageItem
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import PairRecord, load_pair, open_encoder
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store

#: The backfill fractions :func:`evaluate` measures at by default (``rmq eval --at``).
FRACTIONS = "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1"

#: ``on_point``: each measured point, with the curve it belongs to (``"pair"`` or ``"naive"``).
OnPoint = Callable[[str, ServedPoint], None]


def summary(points: list[ServedPoint], ends: Ends | None = None) -> dict[str, Any]:
    """AUC_mAP and AUC_CMC over the measured fractions; the paper's Gain, (AUC − Old) / (New − Old),
    against ``ends`` (Old: the old model alone, New: the plain new model alone; None where unknown);
    and the curve's shape, the same ratio against the pair's own t = 0 and t = 1 points."""
    ts = [p.t for p in points]
    result: dict[str, Any] = {
        "auc_map": None,
        "auc_cmc": None,
        "gain_map": None,
        "gain_cmc": None,
        "old_map": None,
        "old_top1": None,
        "new_map": None,
        "new_top1": None,
        "gain_note": None if ends is None else ends.missing,
        "shape_map": None,
        "shape_cmc": None,
    }
    if ends is not None:
        for side, point in (("old", ends.old), ("new", ends.new)):
            if point is not None:
                result[f"{side}_map"], result[f"{side}_top1"] = point.map, point.top1
    if len(points) < 2 or ts[0] != 0.0 or ts[-1] != 1.0:
        return result  # an area over [0, 1] needs both ends
    for key, top in (("map", "map"), ("cmc", "top1")):
        values = [getattr(p, top) for p in points]
        auc = area(values, ts)
        result[f"auc_{key}"] = auc
        result[f"shape_{key}"] = _ratio(auc, values[0], values[-1])
        if result[f"old_{top}"] is not None and result[f"new_{top}"] is not None:
            result[f"gain_{key}"] = _ratio(auc, result[f"old_{top}"], result[f"new_{top}"])
    return result


def _ratio(auc: float, start: float, end: float) -> float | None:
    return (auc - start) / (end - start) if end != start else None


@dataclass(frozen=True)
class EvalReport:
    """What :func:`evaluate` measured (``rmq eval --json`` is :meth:`as_dict`).

    Attributes:
        pair: the pair's name.
        points: the pair's served mAP and top-1 at each fraction measured.
        totals: AUC_mAP and AUC_CMC (``auc_map``, ``auc_cmc``), Old and New (``old_map``,
            ``old_top1``, ``new_map``, ``new_top1``), the paper's Gain (``gain_map``,
            ``gain_cmc``, or ``gain_note``: why not), and the curve's shape against its own
            ends (``shape_map``, ``shape_cmc``); None where a value cannot be computed.
        in_place: whether the live pair itself was migrated.
        naive: an rm pair's naive curve, served on a copy at the same fractions (``missing``
            says why there is none); None for a naive pair, whose own curve it is.
        plain_new_model: whether a plain new model was known (given or recorded).
        rerank: the re-rank every search of the pair's curve made (None: the plain merge). The
            naive curve beside it, and so Old and New, are served without one.
    """

    pair: str
    points: tuple[ServedPoint, ...]
    totals: dict[str, Any]
    in_place: bool
    naive: NaiveCurve | None
    plain_new_model: bool
    rerank: Rerank | None = None

    @property
    def auc_map(self) -> float | None:
        return self.totals["auc_map"]

    @property
    def gain_map(self) -> float | None:
        return self.totals["gain_map"]

    def as_dict(self) -> dict[str, Any]:
        data = {
            "points": [dataclasses.asdict(p) for p in self.points],
            **self.totals,
            "in_place": self.in_place,
            "rerank": None if self.rerank is None else self.rerank.to_dict(),
        }
        return {**data, **_naive_data(self.points, self.naive)}


def _naive_data(points: Sequence[ServedPoint], naive: NaiveCurve | None) -> dict[str, Any]:
    """The naive curve beside the pair's (None for a naive pair, whose own curve it is)."""
    if naive is None or naive.missing is not None:
        return {"naive": None, "naive_note": naive.missing if naive else "the pair serves the naive merge"}
    auc = summary(list(naive.points))
    return {
        "naive": {
            "points": [dataclasses.asdict(p) for p in naive.points],
            "auc_map": auc["auc_map"],
            "auc_cmc": auc["auc_cmc"],
            "below_naive": [{"t": t, "map_margin": margin} for t, margin in naive.below(points)],
        },
        "naive_note": None,
    }


def fractions(at: str | Sequence[float]) -> list[float]:
    """The backfill fractions to measure at, sorted: ``"0,0.5,1"`` or a sequence of numbers.

    Raises:
        ConfigError: not numbers, none, or one outside [0, 1].
    """
    shown = at if isinstance(at, str) else list(at)
    try:
        points = sorted(float(t) for t in (at.split(",") if isinstance(at, str) else at))
    except (TypeError, ValueError):
        raise ConfigError(f"bad --at {shown!r}: expected fractions like 0,0.5,1") from None
    if not points or not all(0.0 <= t <= 1.0 for t in points):
        raise ConfigError(f"bad --at {shown!r}: fractions lie in [0, 1]")
    return points


def evaluate(
    store: Store,
    name: str,
    queries: str | os.PathLike[str] | Sequence[ImageItem] | Sequence[TextQuery | Mapping[str, Any]],
    *,
    at: str | Sequence[float] = FRACTIONS,
    order: str | None = None,
    k: int | None = None,
    batch: int = 1000,
    exact: bool = True,
    in_place: bool = False,
    new_model: str | os.PathLike[str] | None = None,
    source: SourceConfig | None = None,
    on_point: OnPoint | None = None,
    on_step: OnStep | None = None,
    on_copied: Callable[[], None] | None = None,
    rerank: Rerank | int | str | None = PAIR_DEFAULT,
    deadline: float | None = None,
    _measure: Callable[..., list[ServedPoint]] | None = None,
) -> EvalReport:
    """Measure mAP_t and top-1_t as the pair serves them at each backfill fraction, then AUC and
    the paper's Gain: ``rmq eval``.

    The pair is copied into a temporary embedded store and the copy is migrated from fraction
    to fraction, so the live pair is never moved (``in_place=True`` moves it instead). Gain is
    the paper's, against Old (the old model alone) and New (the plain new model alone). An rm
    pair with a plain new model (``new_model``, or the recorded one) is also served as the naive
    pair on another copy at the same fractions: its curve is the report's ``naive``.

    Args:
        queries: an image pair's labelled query images, a folder ``DIR/<label>/<image>`` or
            :class:`ImageItem`; a text pair's judged queries, a JSONL file (one object a line,
            ``{"text": ..., "label": ...}`` or ``{"text": ..., "relevant": [ids]}``; see
            :mod:`rm_qdrant.evaluation.queries`), :class:`TextQuery` or those objects as dicts.
        at: the fractions, ``"0,0.5,1"`` or numbers in [0, 1].
        order: backfill order (default: the pair's, else random).
        k: mAP@k instead of mAP over the full ranking.
        batch: migration batch size.
        exact: exact search (the offline protocol), or False for HNSW.
        in_place: migrate the live pair itself between the fractions (it stays migrated).
        new_model: the plain new model, for an rm pair's naive curve and the Gain.
        source: how images are fetched (default: the settings the pair recorded).
        on_point: told of each point measured, ``(curve, point)``; ``curve`` is ``"pair"`` or
            ``"naive"``.
        on_step: told of the copies' progress and of notes (:class:`Step`).
        on_copied: called once the pair is copied: from then on only the copy is read, so
            ``store`` may be closed (``rmq eval`` closes it, so other processes can open an
            embedded store while the measure runs).
        _measure: what measures the served curve (:func:`~rm_qdrant.evaluation.evaluate.evaluate_served`);
            not part of the API: ``rmq eval`` passes its own module's name, which a test replaces
            to hold the measure once the copy is made.

    Raises:
        ConfigError: bad fractions; the pair is not backfilling; a bad plain new model; a query
            file line that is not a query (named by its number); image queries for a text pair
            or text queries for an image pair.
        CollectionNotFound: no pair of that name.
        ImageError: no images in the query folder.

    Example:
        >>> report = rm_qdrant.evaluate(store, "photos", "queries/", at=[0, 0.5, 1])  # doctest: +SKIP
        >>> report.auc_map, report.gain_map  # doctest: +SKIP
        (0.71, 0.93)

        A text pair, its queries judged by label or by the ids of their relevant points::

            rm_qdrant.evaluate(store, "articles", "queries.jsonl")
            rm_qdrant.evaluate(store, "articles", [{"text": "storm at sea", "label": "weather"}])
    """
    points = fractions(at)
    check_callback(on_point, "on_point", "(curve, ServedPoint)")
    check_callback(on_step, "on_step", "one Step")
    check_callback(on_copied, "on_copied", "no arguments")
    pair = load_pair(store, name)
    if pair.state != "backfilling":
        raise ConfigError(f"pair {name!r} is {pair.state}: there is no backfill left to measure")
    plan = eval_rerank(pair, rerank, deadline)
    encoder = open_encoder(None, pair.encoder, name, "encoder", decode=pair.decode)
    items = query_items(queries, modality=encoder.info.modality, name=name)
    options = MigrateOptions(
        batch=batch, order=check_order(order) if order else None, source=pair_source(pair, source)
    )
    plain = plain_new_model(pair, path_text(new_model))
    shown: OnPoint = on_point or (lambda curve, point: None)
    naive = None  # a naive pair's curve is the naive curve, unless re-ranked
    served = {"options": options, "k": k, "exact": exact}
    if pair.mode != "naive":  # measured before the curve: in_place moves the pair
        naive = _rm_naive(
            store, pair, items, plain, points, on_step=on_step, on_point=lambda p: shown("naive", p), **served
        )
    elif plan is not None:  # Old and New are the naive pair served without the re-rank
        naive = _plain_curve(
            store, pair, items, points, encoder, on_step, lambda p: shown("naive", p), **served
        )
    measure = _measure or evaluate_served
    with contextlib.ExitStack() as stack:
        target = store
        if not in_place:
            target = stack.enter_context(_copy(store, pair, on_step))
            if on_copied is not None:
                on_copied()
        index = DualIndex.open(target, name, exact=exact, encoder=encoder, source=options.source)
        stack.callback(index.close)
        if index.progress() > points[0]:
            say(on_step, f"note: {index.progress():.1%} of the gallery is already in new")
        results = measure(
            index, items, points, options=options, k=k, rerank=plan, on_point=lambda p: shown("pair", p)
        )
    totals = summary(results, naive.ends() if naive is not None else ends_of_curve(pair, results))
    return EvalReport(name, tuple(results), totals, in_place, naive, plain is not None, plan)


def eval_rerank(pair: PairRecord, rerank: Rerank | int | str | None, deadline: float | None) -> Rerank | None:
    """The re-rank an evaluation serves with: ``rerank`` (K or a :class:`Rerank`), the pair's
    recorded one for :data:`PAIR_DEFAULT`, or None; ``deadline`` replaces its deadline.

    Raises:
        ConfigError: K out of range, a bad deadline, or a deadline without a re-rank.
    """
    if isinstance(rerank, str):
        if rerank != PAIR_DEFAULT:
            raise ConfigError(f"rerank is K (an integer), a Rerank, or None, got {rerank!r}")
        rerank = recorded_rerank(pair.rerank, pair.name)
    plan = as_rerank(rerank)
    if deadline is None:
        return plan
    if plan is None:
        raise ConfigError(f"a re-rank deadline needs a re-rank: pair {pair.name!r} records none (give K)")
    return dataclasses.replace(plan, deadline=deadline)


def query_items(queries: Any, *, modality: str, name: str) -> list[Query]:
    """The queries of pair ``name``, whose models read ``modality`` (``image`` or ``text``): an image
    pair's folder of labelled images or list of :class:`ImageItem`; a text pair's JSONL file
    (:func:`~rm_qdrant.evaluation.queries.read_queries`) or list of :class:`TextQuery` or of the
    JSON objects a query file holds (``{"text": ..., "label": ...}``).

    Raises:
        ConfigError: queries of the other modality; a path that does not exist; a query that is
            not one (named by its line, or its position in a list).
    """
    text = modality == "text"
    if isinstance(queries, (str, bytes, os.PathLike)):
        path = os.fsdecode(queries)
        if not os.path.exists(path):
            raise ConfigError(f"queries {path} do not exist: {_QUERIES[text]}")
        if os.path.isfile(path) != text:
            raise ConfigError(
                f"pair {name!r} reads {_READS[text]}: its queries are {_QUERIES[text]}, not {path}"
            )
        return list(read_queries(path)) if text else list(image_items(path))
    items = list(image_items(queries))
    for position, item in enumerate(items):
        if text and isinstance(item, Mapping):
            try:
                items[position] = query_of(item)
            except (ConfigError, TextError) as exc:
                raise ConfigError(f"query {position}: {exc}") from None
    wanted = TextQuery if text else ImageItem
    stray = next((item for item in items if not isinstance(item, wanted)), None)
    if stray is not None:
        raise ConfigError(
            f"pair {name!r} reads {_READS[text]}: its queries are {wanted.__name__}, "
            f"not {type(stray).__name__}"
        )
    return items  # type: ignore[return-value]


_READS = {False: "images", True: "text"}
_QUERIES = {
    False: "a folder DIR/<label>/<image>",
    True: 'a JSONL file, one object a line: "text" and "label" or "relevant" (ids)',
}


@contextlib.contextmanager
def _copy(store: Store, pair: PairRecord, on_step: OnStep | None) -> Iterator[Store]:
    """The pair copied into a temporary embedded store (one counted step), removed afterwards."""
    with contextlib.ExitStack() as stack:
        with Counted(on_step, "copying the pair", "points") as step:
            step.start(layout_of(pair).stored_points(store))
            copy, _ = stack.enter_context(sandbox(store, pair, on_points=step.advance))
        yield copy


def _plain_curve(
    store: Store,
    pair: PairRecord,
    items: list[Query],
    points: list[float],
    encoder: OnnxEncoder,
    on_step: OnStep | None,
    on_point: Callable[[ServedPoint], None],
    **served: Any,
) -> NaiveCurve:
    """A naive pair's own curve without the re-rank, on a copy: its t = 0 and t = 1 are Old and New."""
    with Counted(on_step, "copying the pair for the curve without the re-rank", "points") as step:
        step.start(layout_of(pair).stored_points(store))
        with sandbox(store, pair, on_points=step.advance) as (copy, _):
            index = DualIndex.open(copy, pair.name, exact=served["exact"], encoder=encoder)
            try:
                found = evaluate_served(
                    index, items, points, options=served["options"], k=served["k"], on_point=on_point
                )
            finally:
                index.close()
    return NaiveCurve(tuple(found))


def _rm_naive(
    store: Store,
    pair: PairRecord,
    items: list[Query],
    plain: OnnxEncoder | None,
    points: list[float],
    *,
    on_step: OnStep | None,
    on_point: Callable[[ServedPoint], None],
    **served: Any,
) -> NaiveCurve:
    """An rm pair's naive curve (and so Old and New), served as the naive pair (old model, plain
    new model) on a copy at the same fractions."""
    if plain is None:
        return NaiveCurve(missing=NO_PLAIN.format(name=pair.name))
    with Counted(on_step, "copying the pair for the naive curve", "points") as step:
        step.start(layout_of(pair).stored_points(store))
        return measure_naive(
            store, pair, items, plain, points, on_points=step.advance, on_point=on_point, **served
        )
