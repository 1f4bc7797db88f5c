"""``rmq pairs``, ``rmq drop-pair`` and ``rmq switch-encoder``: managing the pairs of a store."""

from __future__ import annotations

import dataclasses

import click

from rm_qdrant.api import lifecycle
from rm_qdrant.cli.common import (
    EXIT_STATUS_HELP,
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
)
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.errors import Refused
from rm_qdrant.operations.drop import drop_pair
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import list_pairs
from rm_qdrant.sources import SourceConfig


@click.command(name="pairs")
@json_option
@click.pass_context
def pairs_command(ctx: click.Context, as_json: bool) -> None:
    """List the pairs of this store: collections, mode, state, models."""
    found = list_pairs(open_cli_store(ctx))
    lines = [f"{'pair':16} {'mode':6} {'state':12} collections (old -> new)          encoder"]
    for p in found:
        arrow = plain(layout_of(p).arrow)
        lines.append(f"{plain(p.name):16} {p.mode:6} {p.state:12} {arrow:34} {plain(p.encoder.name)}")
    emit([dataclasses.asdict(p) for p in found], as_json, "\n".join(lines) if found else "no pairs")


@click.command(name="drop-pair")
@click.argument("name")
@click.option(
    "--force", is_flag=True, help="Drop even while points live only in the new collection (or vector)."
)
@json_option
@click.pass_context
def drop_pair_command(ctx: click.Context, name: str, force: bool, as_json: bool) -> None:
    """Forget a pair. The old collection is never touched; the new one goes only if empty."""
    done = drop_pair(open_cli_store(ctx), name, force=force)
    p = done.pair
    new = layout_of(p).new_half
    kept = f"; {new} deleted (it was empty)" if done.deleted_new else f"; {new} kept"
    text = f"dropped pair {name!r} ({p.state}); {p.old_collection!r} kept, its rmq_* fields removed{kept}"
    emit({"pair": name, "state": p.state, "deleted_new": done.deleted_new}, as_json, text)


@click.command(name="switch-encoder", epilog=EXIT_STATUS_HELP)
@name_option
@click.option("--encoder", required=True, type=click.Path(), help="The graph to serve from now on (.onnx).")
@click.option("--old-encoder", type=click.Path(), help="The old model, if the pair has none recorded.")
@click.option(
    "--new-model",
    type=click.Path(),
    help="The plain new model (no ψ/ρ heads) to record as New for 'rmq eval' and 'rmq probe' "
    "[default: a naive pair moving to a graph with ψ records the graph it served until now].",
)
@click.option(
    "--sample",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Points of new re-encoded to check the vectors there stay valid.",
)
@source_options
@json_option
@click.pass_context
def switch_encoder_command(
    ctx: click.Context,
    name: str,
    encoder: str,
    old_encoder: str | None,
    new_model: str | None,
    sample: int,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Serve a running pair with another graph, if the vectors already in new stay valid.

    A sample of new is re-encoded with the graph; if it does not reproduce the vectors
    stored there, the pair is left as it was and rmq exits 3.
    """
    try:
        report = lifecycle.switch_encoder(
            open_cli_store(ctx),
            name,
            encoder,
            old_encoder=old_encoder,
            new_model=new_model,
            sample=sample,
            source=source,
        )
    except Refused as exc:
        if as_json and dataclasses.is_dataclass(exc.measured):  # the report, then the one line
            emit({"pair": name, "switched": False, "check": dataclasses.asdict(exc.measured)}, True, "")
        raise
    updated, measured, calibration = report.pair, report.check, report.calibration
    check = (
        f"; checked on {measured.checked} points of new ({measured.metric}): {measured.describe()}"
        if measured
        else "; new was empty"
    )
    text = f"pair {name!r} now serves {updated.encoder.name} ({updated.mode} mode){check}"
    if calibration is not None:
        text += "\n" + _calibration_line(name, calibration)
    recorded = updated.new_model
    if recorded is not None and recorded != report.previous.new_model:
        how = "as given" if new_model else f"the graph pair {name!r} served until now"
        text += (
            f"\nplain new model recorded: {plain(recorded.name)} ({recorded.fingerprint}), {how}; "
            "rmq eval and rmq probe measure New with it"
        )
    emit(report.as_dict(), as_json, text)


def _calibration_line(name: str, what: str) -> str:
    if what == "kept":
        return (
            f"calibration kept: pair {name!r} still merges calibrated distances (the old and new vectors "
            "it was fitted on are unchanged; rmq calibrate --clear removes it)"
        )
    return (
        f"calibration dropped: pair {name!r} now merges the rm graph's own distances (its ψ puts old hits on "
        "the new scale; the old model's map no longer applies)"
    )
