"""``rmq pairs``, ``rmq drop-pair`` and ``rmq switch-encoder``: managing the pairs of a store."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from rm_qdrant.api import lifecycle
from rm_qdrant.cli.common import (
    EXIT_STATUS_HELP,
    decode_option,
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
)
from rm_qdrant.cli.rerankopts import chosen_rerank, described, no_rerank_alone, recorded, rerank_options
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.errors import ConfigError, Refused
from rm_qdrant.operations.drop import drop_pair
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import list_pairs, load_pair
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
@click.option(
    "--encoder", type=click.Path(), help="The graph to serve from now on (.onnx) [default: the pair's]."
)
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
@decode_option(
    "Decode the pair's images this way from now on: exact or fast (with or without --encoder) "
    "[default: as the pair records].",
)
@source_options
@rerank_options
@click.option("--no-rerank", is_flag=True, help="Record no re-rank: searches merge by distance alone.")
@json_option
@click.pass_context
def switch_encoder_command(
    ctx: click.Context,
    name: str,
    encoder: str | None,
    old_encoder: str | None,
    new_model: str | None,
    sample: int,
    decode: str | None,
    source: SourceConfig,
    rerank_k: int | None,
    rerank_deadline: float | None,
    rerank_budget: int | None,
    promote: bool | None,
    no_rerank: bool,
    as_json: bool,
) -> None:
    """Serve a running pair with another graph, if the vectors already in new stay valid, or
    decode its images another way (--decode).

    A sample of new is re-encoded with the graph (decoded as the pair decoded until now); if
    it does not reproduce the vectors stored there, the pair is left as it was and rmq exits 3.

    --decode exact|fast alone records how the pair decodes its images from now on: the next
    migration batch, queries, probe, eval, calibrate and fit decode that way. The points
    already in new keep the vectors of the old way; nothing is re-encoded (rmq model check
    --decode fast measures how far apart the two ways are on the pair's images).

    --rerank K (with --rerank-deadline, --rerank-budget, --promote) records the re-rank every
    search of the pair makes unless it says otherwise; --no-rerank records none. Alone, or with
    --encoder / --decode.
    """
    tuned = (rerank_k, rerank_deadline, rerank_budget, promote) != (None, None, None, None)
    no_rerank_alone(no_rerank, tuned, "records no re-rank")
    if encoder is None and decode is None:  # before the store is opened
        if not (tuned or no_rerank):
            raise ConfigError(
                "give the graph to serve (--encoder), the decode mode (--decode), the re-rank "
                "(--rerank K, --no-rerank), or several"
            )
        _switch_rerank(ctx, name, no_rerank, (rerank_k, rerank_deadline, rerank_budget, promote), as_json)
        return
    try:
        report = lifecycle.switch_encoder(
            open_cli_store(ctx),
            name,
            encoder,
            old_encoder=old_encoder,
            new_model=new_model,
            sample=sample,
            source=source,
            decode=decode,
        )
    except Refused as exc:
        if as_json and dataclasses.is_dataclass(exc.measured):  # the report, then the one line
            emit({"pair": name, "switched": False, "check": dataclasses.asdict(exc.measured)}, True, "")
        raise
    updated, measured, calibration = report.pair, report.check, report.calibration
    if encoder is None:
        text = f"pair {name!r} still serves {plain(updated.encoder.name)} ({updated.mode} mode)"
    else:
        check = (
            f"; checked on {measured.checked} points of new ({measured.metric}): {measured.describe()}"
            if measured
            else "; new was empty"
        )
        text = f"pair {name!r} now serves {plain(updated.encoder.name)} ({updated.mode} mode){check}"
    if updated.encoder.modality != "text":  # text is read one way
        text += "\n" + _decode_line(report)
    if calibration is not None:
        text += "\n" + _calibration_line(name, calibration)
    plain_ref = updated.new_model  # not "recorded": that is the re-rank's reader, below
    if plain_ref is not None and plain_ref != report.previous.new_model:
        how = "as given" if new_model else f"the graph pair {name!r} served until now"
        text += (
            f"\nplain new model recorded: {plain(plain_ref.name)} ({plain_ref.fingerprint}), {how}; "
            "rmq eval and rmq probe measure New with it"
        )
    data = report.as_dict()
    if tuned or no_rerank:
        store = open_cli_store(ctx)
        given = (rerank_k, rerank_deadline, rerank_budget, promote)
        plan = None if no_rerank else chosen_rerank(recorded(updated, rerank_k), *given)
        data["rerank"] = lifecycle.set_rerank(store, name, plan).rerank
        text += "\n" + described(plan)
    emit(data, as_json, text)


def _switch_rerank(ctx: click.Context, name: str, off: bool, given: tuple[Any, ...], as_json: bool) -> None:
    """``switch-encoder`` with re-rank options alone: record them."""
    store = open_cli_store(ctx)
    plan = None if off else chosen_rerank(recorded(load_pair(store, name), given[0]), *given)
    updated = lifecycle.set_rerank(store, name, plan)
    emit({"pair": name, "rerank": updated.rerank}, as_json, f"pair {name!r}: {described(plan)}")


def _decode_line(report: lifecycle.SwitchReport) -> str:
    before, after = report.previous.decode, report.pair.decode
    if before == after:
        return f"decode: {after} (unchanged)"
    return (
        f"decode: {before} -> {after}; the {report.migrated} points already in new were decoded {before} "
        f"and keep those vectors; every migrate run, DualIndex and command started from now decodes {after}"
    )


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
