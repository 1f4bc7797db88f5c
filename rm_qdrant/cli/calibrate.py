"""``rmq calibrate``: the calibrated naive merge, fitted on a sample of the gallery (no training, no labels).

A naive pair's two models measure distance on their own scales; the map fitted here
(:mod:`rm_qdrant.core.calibration`, a quantile map under the pair's own metric: cosine,
dot, Euclid or Manhattan) puts old-collection hits on the new model's scale before the
merge. It is kept in the pair record and applied by every search while the
pair is naive; ``--clear`` removes it.
"""

from __future__ import annotations

import click

from rm_qdrant.api.calibrating import CalibrationReport, calibrate, clear_calibration
from rm_qdrant.cli.common import (
    EXIT_STATUS_HELP,
    Steps,
    emit,
    holdout_options,
    json_option,
    name_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.probe import curve_table, share_table
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.calibration import MAPS
from rm_qdrant.core.calibration_check import alternatives_text
from rm_qdrant.errors import Refused
from rm_qdrant.sources import SourceConfig


@click.command(name="calibrate", epilog=EXIT_STATUS_HELP)
@name_option
@holdout_options
@click.option(
    "--map",
    "mapping",
    type=click.Choice(["auto", *MAPS]),
    default="auto",
    show_default=True,
    help="isotonic: the mean new distance given the old one; quantile: the new distance at the old "
    "one's quantile (each side about its share of the top k); auto: isotonic for cosine, quantile "
    "for dot, Euclid and Manhattan (see docs/guides/fit-calibrate.md).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Keep the map even when it forecasts worse than the plain merge or the guard refuses it.",
)
@click.option("--clear", is_flag=True, help="Remove the pair's calibration and merge plain distances again.")
@source_options
@json_option
@click.pass_context
def calibrate_command(
    ctx: click.Context,
    name: str,
    size: int,
    holdout: float,
    k: int,
    seed: int,
    mapping: str,
    force: bool,
    clear: bool,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Map the old model's distances onto the new model's scale for a naive pair's merge.

    A sample of the old collection is re-embedded with the pair's new model; the map is
    fitted on part of it and kept only if, on the rest, it forecasts better than the plain merge
    and the label-free guard passes it (its hits as near in both models' eyes as the plain
    merge's, at every t); or with --force. Otherwise the pair is left as it was and rmq exits 3.
    """
    store = open_cli_store(ctx)
    if clear:
        clear_calibration(store, name)
        emit({"pair": name, "calibration": None}, as_json, f"pair {name!r} merges plain distances again")
        return
    with Steps(hidden=as_json or quiet(ctx)) as bars:
        try:
            report = calibrate(
                store,
                name,
                sample=size,
                holdout=holdout,
                k=k,
                seed=seed,
                mapping=mapping,
                force=force,
                source=source,
                on_step=bars,
            )
        except Refused as exc:
            if isinstance(exc.report, CalibrationReport):  # the report, then the one line
                emit(exc.report.as_dict(), as_json, _text(exc.report))
            raise
    emit(report.as_dict(), as_json, _text(report))


def _text(report: CalibrationReport) -> str:
    recall, _ = curve_table(list(report.forecasts))
    why, name = report.refused, report.pair
    instead = alternatives_text(report.alternatives)
    outcome = (
        ("kept" if not why else f"kept with --force, although {why}")
        + f": searches of pair {name!r} now merge calibrated distances (--clear undoes it)"
        if report.kept
        else f"not kept: {why} (--force keeps it anyway)" + (f"\n{instead}" if instead else "")
    )
    return "\n".join(
        [
            f"calibrated on {report.fitted_on} sampled points ({report.held_out} held out"
            + (f", {report.unreadable} unreadable skipped" if report.unreadable else "")
            + f"), {report.knots} knots: the {report.mapping} map of {report.distance} distances onto "
            "the new model's scale",
            "",
            f"recall@{report.k} on the held-out points against the new model's own neighbours:",
            *recall,
            "",
            *share_table(list(report.forecasts), report.k),
            "",
            f"area {report.areas()}; guard: " + ("passed" if report.guard.passed else "refused"),
            report.judged_on,
            outcome,
        ]
    )
