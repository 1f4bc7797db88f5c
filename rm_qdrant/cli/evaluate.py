"""``rmq eval``: the paper's curves measured through the pair as it serves, on a copy by default."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import click

from rm_qdrant.api.evaluating import FRACTIONS, evaluate, summary
from rm_qdrant.cli.common import (
    Steps,
    emit,
    json_option,
    name_option,
    new_model_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.rerankopts import deadline_option, no_rerank_alone, rerank_option
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.ordering import ORDERS
from rm_qdrant.core.rerank import PAIR_DEFAULT, Rerank
from rm_qdrant.evaluation.baseline import NaiveCurve
from rm_qdrant.evaluation.evaluate import ServedPoint, evaluate_served
from rm_qdrant.sources import SourceConfig

__all__ = ["eval_command", "summary"]  # summary: the pure totals, where tests have always found them


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


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _rerank_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--rerank K``, ``--no-rerank`` and ``--rerank-deadline``; the command gets ``rerank`` as
    :func:`evaluate` takes it (K, None, or the pair's), checked before the store is read."""

    @functools.wraps(command)
    def run(*args: Any, rerank: int | None, no_rerank: bool, **kwargs: Any) -> Any:
        no_rerank_alone(
            no_rerank, rerank is not None or kwargs["rerank_deadline"] is not None, "serves without a re-rank"
        )
        chosen = None if no_rerank else PAIR_DEFAULT if rerank is None else rerank
        return command(*args, rerank=chosen, **kwargs)

    options = [
        rerank_option(
            "the pair's curve is served so, each old hit among the K read from its source and "
            "embedded [default: the pair's recorded re-rank, rmq init --rerank]"
        ),
        click.option(
            "--no-rerank", is_flag=True, help="Serve the curve without a re-rank, whatever the pair records."
        ),
        deadline_option(
            "Seconds each query waits for its re-rank's images [default: the re-rank's own, 0.5]."
        ),
    ]
    for option in reversed(options):
        run = option(run)
    return run


@click.command(name="eval")
@name_option
@click.option(
    "--queries",
    required=True,
    type=click.Path(),
    help="An image pair's labelled queries, DIR/<label>/<image>; a text pair's, a JSONL file: one "
    'object a line, {"text": ..., "label": ...} (relevant: the gallery points of that label) or '
    '{"text": ..., "relevant": [ids]}, and "id" where the query is a gallery point (left out of '
    "its own ranking).",
)
@click.option(
    "--at",
    "fractions",
    default=FRACTIONS,
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
@_rerank_options
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
    rerank: Rerank | int | str | None,
    rerank_deadline: float | None,
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
    and its t = 0 and t = 1 points are Old and New. With a re-rank (--rerank K, or the pair's
    recorded one) every search of the pair's curve re-ranks its merged first K with the new
    model; the naive curve, Old and New are served without it.
    """
    store = open_cli_store(ctx)
    silent = quiet(ctx)

    def show(curve: str, point: ServedPoint) -> None:
        if not silent:
            click.echo(
                f"{'naive ' if curve == 'naive' else ''}t={point.t:<4} in new {point.fraction:6.1%}   "
                f"mAP {100 * point.map:5.1f}   top-1 {100 * point.top1:5.1f}",
                err=as_json,  # with --json, stdout is for the JSON
            )

    with _sigterm_stops(name, in_place), Steps(hidden=silent) as steps:
        report = evaluate(
            store,
            name,
            queries,
            at=fractions,
            order=order,
            k=k,
            batch=batch,
            exact=exact,
            in_place=in_place,
            new_model=new_model,
            source=source,
            on_point=show,
            on_step=steps,
            on_copied=store.close,  # measured on the copy: other commands may open the live store meanwhile
            rerank=rerank,
            deadline=rerank_deadline,
            _measure=evaluate_served,  # this module's name: a test holds the measure through it
        )
    results, totals, naive = list(report.points), report.totals, report.naive
    text = "\n".join(
        [
            _rerank_line(report.rerank, results),
            *(_naive_lines(results, naive, report.plain_new_model) if naive is not None else []),
            f"AUC_mAP {_percent(totals['auc_map'])}   AUC_CMC {_percent(totals['auc_cmc'])}"
            + ("" if in_place else f"; measured on a copy, pair {name!r} was not moved"),
            *_gain_lines(totals),
        ]
    )
    emit(report.as_dict(), as_json, text)


def _rerank_line(plan: Rerank | None, points: list[ServedPoint]) -> str:
    """With what re-rank the pair's curve was served, and how many old hits missed it."""
    if plan is None:
        return "served without a re-rank (the merged distances)"
    missed = sum(p.missed for p in points)
    return (
        f"served with the re-rank at K = {plan.k} (deadline {plan.deadline:g} s, fetch budget "
        f"{plan.reads} a query): {missed:,} old hits among the first K kept their merged distance "
        "(late, over budget or unreadable); the naive curve, Old and New are served without it"
    )


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
