"""``rmq eval``: the paper's curves measured through the pair as it serves, on a copy by default."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import click

from rm_qdrant.cli.common import (
    Progress,
    emit,
    json_option,
    name_option,
    new_model_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.metrics import area
from rm_qdrant.core.ordering import ORDERS, check_order
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.baseline import (
    NO_PLAIN,
    Ends,
    NaiveCurve,
    ends_of_curve,
    measure_naive,
    plain_new_model,
)
from rm_qdrant.evaluation.evaluate import ServedPoint, evaluate_served
from rm_qdrant.evaluation.sandbox import sandbox
from rm_qdrant.migration.migrate import MigrateOptions
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations.indexing import ImageItem, scan_image_folder
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store


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


class _Terminated(BaseException):
    """SIGTERM, raised where eval is: a BaseException, so no ``except Exception`` on the way stops it."""


@contextlib.contextmanager
def _sigterm_stops(name: str, in_place: bool) -> Iterator[None]:
    """SIGTERM unwinds eval like an error (its copy is removed on the way out), then one line, exit 1."""

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        after = (
            f"pair {name!r} stays as far as it was migrated ('rmq migrate' goes on from there)"
            if in_place
            else f"its copy of the pair was removed, pair {name!r} was not moved"
        )
        raise click.ClickException(f"eval stopped by SIGTERM: {after}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _copy(store: Store, pair: PairRecord, silent: bool) -> Iterator[Store]:
    """The pair copied into a temporary embedded store (a progress bar meanwhile), removed afterwards."""
    with contextlib.ExitStack() as stack:
        with Progress("copying the pair", hidden=silent, unit="points") as bar:
            bar.start(layout_of(pair).stored_points(store))
            copy, _ = stack.enter_context(sandbox(store, pair, on_points=bar.advance))
        yield copy


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


@click.command(name="eval")
@name_option
@click.option(
    "--queries",
    required=True,
    type=click.Path(file_okay=False),
    help="Labelled queries: DIR/<label>/<image>.",
)
@click.option(
    "--at",
    "fractions",
    default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1",
    show_default=True,
    help="Backfill fractions to measure at.",
)
@click.option("--order", help=f"Backfill order: {', '.join(ORDERS)} [default: the pair's, else random].")
@click.option("--k", type=click.IntRange(min=1), help="mAP@k instead of mAP over the full ranking.")
@click.option(
    "--batch", default=1000, show_default=True, type=click.IntRange(min=1), help="Migration batch size."
)
@click.option(
    "--exact/--hnsw", default=True, show_default=True, help="Exact search (the offline protocol) or HNSW."
)
@click.option(
    "--in-place",
    is_flag=True,
    help="Migrate the live pair itself between the fractions (it stays migrated); by default a "
    "temporary copy is migrated and the pair is left as it is.",
)
@new_model_option("New, for the paper's Gain")
@source_options
@json_option
@click.pass_context
def eval_command(
    ctx: click.Context,
    name: str,
    queries: str,
    fractions: str,
    order: str | None,
    k: int | None,
    batch: int,
    exact: bool,
    in_place: bool,
    new_model: str | None,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Measure mAP_t and top-1_t as the pair serves them at each backfill fraction, then AUC and Gain.

    The pair is copied into a temporary embedded store and the copy is migrated from
    fraction to fraction, so the live pair is never moved (--in-place moves it instead).
    Gain is the paper's, against Old (the old model alone) and New (the plain new model
    alone); the curve's shape against its own t = 0 and t = 1 points is printed apart. An rm
    pair with a plain new model (--new-model, or the recorded one) is also served as the naive
    pair on another copy at the same fractions: that naive curve is printed beside the pair's,
    and its t = 0 and t = 1 points are Old and New.
    """
    try:
        points = sorted(float(t) for t in fractions.split(","))
    except ValueError:
        raise ConfigError(f"bad --at {fractions!r}: expected fractions like 0,0.5,1") from None
    if not points or not all(0.0 <= t <= 1.0 for t in points):
        raise ConfigError(f"bad --at {fractions!r}: fractions lie in [0, 1]")
    items = scan_image_folder(queries)
    store = open_cli_store(ctx)
    pair = load_pair(store, name)
    if pair.state != "backfilling":
        raise ConfigError(f"pair {name!r} is {pair.state}: there is no backfill left to measure")
    options = MigrateOptions(batch=batch, order=check_order(order) if order else None, source=source)
    silent = quiet(ctx)
    plain = plain_new_model(pair, new_model)

    def show(point: ServedPoint, curve: str = "") -> None:
        if not silent:
            click.echo(
                f"{curve}t={point.t:<4} in new {point.fraction:6.1%}   mAP {100 * point.map:5.1f}   "
                f"top-1 {100 * point.top1:5.1f}",
                err=as_json,  # with --json, stdout is for the JSON
            )

    naive = None  # a naive pair's curve is the naive curve
    if pair.mode != "naive":  # measured before the curve: --in-place moves the pair
        naive = _rm_naive(
            store,
            pair,
            items,
            plain,
            points,
            options=options,
            k=k,
            exact=exact,
            silent=silent,
            on_point=lambda p: show(p, "naive "),
        )

    def measure(index: DualIndex) -> list[ServedPoint]:
        if index.progress() > points[0] and not silent:
            click.echo(f"note: {index.progress():.1%} of the gallery is already in new", err=True)
        return evaluate_served(index, items, points, options=options, k=k, on_point=show)

    with _sigterm_stops(name, in_place), contextlib.ExitStack() as stack:
        target = store
        if not in_place:
            target = stack.enter_context(_copy(store, pair, silent))
            store.close()  # measured on the copy: other commands may open the live store meanwhile
        results = measure(DualIndex.open(target, name, exact=exact))
    totals = summary(results, naive.ends() if naive is not None else ends_of_curve(pair, results))
    text = "\n".join(
        [
            *(_naive_lines(results, naive, plain is not None) if naive is not None else []),
            f"AUC_mAP {_percent(totals['auc_map'])}   AUC_CMC {_percent(totals['auc_cmc'])}"
            + ("" if in_place else f"; measured on a copy, pair {name!r} was not moved"),
            *_gain_lines(totals),
        ]
    )
    data = {"points": [dataclasses.asdict(p) for p in results], **totals, "in_place": in_place}
    emit({**data, **_naive_data(results, naive)}, as_json, text)


def _rm_naive(
    store: Store,
    pair: PairRecord,
    items: list[ImageItem],
    plain: OnnxEncoder | None,
    points: list[float],
    *,
    options: MigrateOptions,
    k: int | None,
    exact: bool,
    silent: bool,
    on_point: Callable[[ServedPoint], None],
) -> NaiveCurve:
    """An rm pair's naive curve (and so Old and New), served as the naive pair (old model, plain
    new model) on a copy at the same fractions."""
    if plain is None:
        return NaiveCurve(missing=NO_PLAIN.format(name=pair.name))
    with Progress("copying the pair for the naive curve", hidden=silent, unit="points") as bar:
        bar.start(layout_of(pair).stored_points(store))
        return measure_naive(
            store,
            pair,
            items,
            plain,
            points,
            options=options,
            k=k,
            exact=exact,
            on_points=bar.advance,
            on_point=on_point,
        )


def _naive_data(points: list[ServedPoint], naive: NaiveCurve | None) -> dict[str, Any]:
    """--json: the naive curve beside the pair's (None for a naive pair, whose own curve it is)."""
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


def _naive_lines(points: list[ServedPoint], naive: NaiveCurve, plain: bool) -> list[str]:
    """The pair's curve and the naive merge's, a column per t (mAP and top-1, %, and AUC), and
    where the pair falls below naive; or one line on why there is no naive curve."""
    if not plain:
        return ["no naive curve beside this pair's: it needs the plain new model (--new-model PATH)"]
    if naive.missing is not None:
        return [f"no naive curve beside this pair's: {naive.missing}"]
    lines = [
        "served mAP and top-1 (%), this pair beside the naive merge (the old model, the plain new model):",
        f"{'t':12}" + "".join(f"{p.t:>7g}" for p in points) + f"{'AUC':>8}",
    ]
    for metric, attr, key in (("mAP", "map", "auc_map"), ("top-1", "top1", "auc_cmc")):
        for label, curve in (("rm", points), ("naive", list(naive.points))):
            row = "".join(f"{100 * getattr(p, attr):7.1f}" for p in curve)
            lines.append(f"{f'{label} {metric}':12}{row}{_percent(summary(curve)[key]):>8}")
    below = naive.below(points)
    if not below:
        lines.append("rm's mAP is not below the naive merge's at any measured t")
    else:
        t, margin = max(below, key=lambda b: b[1])
        lines.append(
            f"rm's mAP falls below the naive merge's at t = {', '.join(f'{b[0]:g}' for b in below)}, "
            f"by up to {100 * margin:.1f} points (at t = {t:g})"
        )
    return lines


def _gain_lines(totals: dict[str, Any]) -> list[str]:
    """Old and New, the paper's Gain (or why there is none), and the curve's shape, each named."""
    lines = []
    sides = [
        f"{label} mAP {_percent(totals[f'{key}_map'])} top-1 {_percent(totals[f'{key}_top1'])}"
        for key, label in (("old", "Old (the old model alone)"), ("new", "New (the plain new model alone)"))
        if totals[f"{key}_map"] is not None
    ]
    if sides:
        lines.append("; ".join(sides))
    if totals["gain_map"] is None and totals["gain_cmc"] is None:
        why = totals["gain_note"] or "Old and New score the same, or the curve lacks t = 0 or t = 1"
        lines.append(f"the paper's Gain cannot be computed: {why}")
    else:
        lines.append(
            f"the paper's Gain (AUC − Old) / (New − Old): {_percent(totals['gain_map'])} % (mAP) "
            f"{_percent(totals['gain_cmc'])} % (top-1)"
        )
    lines.append(
        f"shape (AUC − t=0) / (t=1 − t=0), against this pair's own t = 0 and t = 1 points (not the gain): "
        f"{_percent(totals['shape_map'])} % (mAP) {_percent(totals['shape_cmc'])} % (top-1)"
    )
    return lines
