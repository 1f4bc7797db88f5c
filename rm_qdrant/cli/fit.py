"""``rmq fit``: train ψ/ρ for a team's own models from its live gallery (needs PyTorch).

A sample of the pair's old collection gives (stored old vector, new backbone embedding)
pairs; heads are trained on them, checked against the naive merge on a held-out part,
and joined to the team's backbone as one graph (outputs ``new`` and ``rev``).
"""

from __future__ import annotations

from typing import Any

import click

from rm_qdrant.api.fitting import FIT_LOSSES, FitReport, fit
from rm_qdrant.api.training import informative  # noqa: F401 (where tests have always found it)
from rm_qdrant.cli.common import (
    EXIT_STATUS_HELP,
    FiniteFloat,
    Steps,
    emit,
    holdout_options,
    json_option,
    name_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.probe import curve_table
from rm_qdrant.cli.rerankopts import rerank_option
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.cli.threads import show_progress, threads_option
from rm_qdrant.errors import Refused
from rm_qdrant.sources import SourceConfig


@click.command(name="fit", epilog=EXIT_STATUS_HELP)
@name_option
@holdout_options
@click.option(
    "--backbone",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The team's new model (.onnx), described by 'rmq model stamp'.",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where the fitted graph goes.")
@click.option(
    "--label-field",
    help="Payload field with a class label ('meta.dept': nested): trains the paper's MCL + ρ.",
)
@click.option(
    "--loss",
    default="auto",
    show_default=True,
    type=click.Choice(FIT_LOSSES),
    help="auto: mcl with --label-field, else label-free; rqt and procrustes fit ψ alone.",
)
@click.option("--steps", type=click.IntRange(min=1), help="Optimizer steps [default: 2000].")
@click.option("--epochs", type=click.IntRange(min=1), help="Or: passes over the training part of the sample.")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), help="Adam learning rate [default: 1e-3].")
@click.option("--batch", type=click.IntRange(min=2), help="Pairs per step [default: 256].")
@click.option(
    "--force", is_flag=True, help="Write the graph even when it forecasts worse than the naive merge."
)
@threads_option("$OMP_NUM_THREADS, else 1: the same graph however busy the machine")
@rerank_option(
    "the guard (and the labels) weigh the graph with the re-rank against the naive merge with the "
    "re-rank, each ordering its first K by its own new model, as a pair serving --rerank K would "
    "[default: the plain merges]"
)
@source_options
@json_option
@click.pass_context
def fit_command(
    ctx: click.Context,
    name: str,
    backbone: str,
    out: str,
    size: int,
    label_field: str | None,
    loss: str,
    steps: int | None,
    epochs: int | None,
    lr: float | None,
    batch: int | None,
    holdout: float,
    k: int,
    seed: int,
    force: bool,
    threads: int | None,
    rerank: int | None,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Train ψ (and ρ) on pairs from the gallery: stored old vectors and the backbone's embeddings.

    No old model is needed, and no labels unless --label-field. Part of the sample is held
    out. Without labels, the fitted graph is written only if, at every backfill fraction t,
    its hits there are as near in both models' rankings as the naive merge's (calibrated
    where the pair is; at t = 0 the old model's), within two standard errors; with labels,
    if its area under mAP beats the naive merge's. Otherwise (unless --force) nothing is
    written, the one line says at which t and by how much, and rmq exits 3.

    The same --seed, gallery, backbone and thread count give the same graph; another thread
    count (--threads, OMP_NUM_THREADS; default 1) can change the last digits, and so the graph.
    """
    silent = as_json or quiet(ctx)
    show_progress(quiet=silent)  # the training's own log lines (epochs, parity checks)
    store = open_cli_store(ctx)
    with Steps(hidden=silent) as bars:
        try:
            report = fit(
                store,
                name,
                backbone=backbone,
                out=out,
                sample=size,
                holdout=holdout,
                k=k,
                seed=seed,
                label_field=label_field,
                loss=loss,
                steps=steps,
                epochs=epochs,
                lr=lr,
                batch=batch,
                force=force,
                threads=threads,
                source=source,
                on_step=bars,
                rerank=rerank,
            )
        except Refused as exc:
            if isinstance(exc.report, FitReport):  # what was judged, then the one line
                if as_json:
                    emit(exc.report.as_dict(), True, "")
                elif not silent:
                    click.echo("\n".join(selection_lines(exc.report.as_dict())), err=True)
            raise
    emit(report.as_dict(), as_json, _text(report.as_dict(), list(report.forecasts), report.new_holds_points))


def selection_lines(data: dict[str, Any]) -> list[str]:
    """What was judged on, each candidate's holdout evidence, one line each, and which won and why
    (label-free only)."""
    if not data["candidates"]:
        recipe = f"recipe: {data['recipe']}" + (f" ({data['why']})" if data.get("why") else "")
        return [data["judged_on"], recipe]
    lines = [
        data["judged_on"],
        "label-free candidates, a holdout of the training pairs querying all of them "
        "(guard: the hits' score by the new model's log rank; area: recall among the holdout):",
    ]
    for c in data["candidates"]:
        guard = c["guard"]
        if guard is None:
            lines.append(f"  {c['recipe']}: training diverged")
            continue
        worst = guard["fractions"].index(guard["min_margin_t"])
        lines.append(
            f"  {c['recipe']}: t=0 {guard['fitted'][0]:.3f} (old {guard['naive'][0]:.3f}), "
            f"min fitted-naive {guard['min_margin']:+.3f} at t={guard['min_margin_t']:g} "
            f"(fitted {guard['fitted'][worst]:.3f}, naive {guard['naive'][worst]:.3f}), area {c['area']:.3f}"
            + ("" if guard["passed"] else ", guard: no")
            + (", dips" if c["dips"] else "")
            + ("" if not c.get("labelled") or c["labelled"]["passed"] else ", below naive by the labels")
        )
    lines.append(f"won: {data['winner']}: {data['why']}")
    return lines


def _text(data: dict[str, Any], forecasts: list[Any], new_holds_points: bool) -> str:
    recall, maps = curve_table(forecasts)
    lines = [
        f"fitted {data['loss']} on {data['trained_on']} pairs in {data['train_seconds']:.0f} s "
        f"({data['held_out']} held out"
        + (f", {data['unreadable']} unreadable skipped" if data["unreadable"] else "")
        + ")",
        "",
        f"recall@{data['k']} on the held-out points against the new model's own neighbours:",
        *recall,
    ]
    if maps:
        lines += ["", "mAP on the held-out points (payload labels):", *maps]
    if data["decided_by"] == "guard":
        verdict = (
            "passes the guard against"
            if data["better_than_naive"]
            else "FAILS the guard (written with --force) against"
        )
    else:
        verdict = "better than" if data["better_than_naive"] else "WORSE than (written with --force)"
    lines += ["", *selection_lines(data)]
    reranked = (
        f", both re-ranking their first {data['rerank']} (on the sample, {data['rerank_depth']})"
        if data.get("rerank") is not None
        else ""
    )
    lines += [
        "",
        f"the fitted graph ({data['recipe']}) {verdict} the naive merge{reranked}: {data['measure']}",
        f"wrote {data['out']} (outputs new and rev; ONNX Runtime vs PyTorch {data['parity']:.1e})",
    ]
    if data["learned_rho"] and new_holds_points:
        lines.append(
            f"ρ was learned, so its 'new' differs from the vectors already in pair {data['pair']}'s new "
            f"collection: serve it in a new pair (rmq init --encoder {data['out']} ...), or refit with "
            "a loss that keeps ρ the identity to use rmq switch-encoder"
        )
    else:
        lines.append(f"serve it: rmq switch-encoder --name {data['pair']} --encoder {data['out']}")
    return "\n".join(lines)
