"""``rmq finalize`` and ``rmq rollback``: the end of a backfill, one way or the other."""

from __future__ import annotations

import dataclasses

import click

from rm_qdrant.api import lifecycle
from rm_qdrant.cli.common import emit, json_option, name_option, open_cli_store
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.sources import SourceConfig


@click.command(name="finalize")
@name_option
@click.option("--alias", help="Serving alias to point at new [default: the pair's name].")
@click.option(
    "--drop-old",
    is_flag=True,
    help="Delete the old collection, or the old vector of one collection (no rollback afterwards).",
)
@click.option(
    "--encoder",
    type=click.Path(),
    help="One collection: override the encoder path the pair recorded (it embeds points written "
    "with the old vector only while the cutover runs).",
)
@click.option(
    "--drop-failed",
    is_flag=True,
    help="First remove the points whose migration failed (listed by 'rmq failures'), after "
    "writing their list to --out.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="With --drop-failed: the list's file (JSON lines, never overwritten) "
    "[default: ./rmq-failures-<pair>-<UTC time>.jsonl].",
)
@source_options
@json_option
@click.pass_context
def finalize_command(
    ctx: click.Context,
    name: str,
    alias: str | None,
    drop_old: bool,
    encoder: str | None,
    drop_failed: bool,
    out: str | None,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Cut over: point the serving alias at new (one collection: serve its new vector); search
    then uses new alone.

    Points whose image cannot be read never migrate: --drop-failed writes their list, removes
    them from the gallery, then cuts over (points that still wait without having failed stop it).
    """
    report = lifecycle.finalize(
        open_cli_store(ctx),
        name,
        alias=alias,
        drop_old=drop_old,
        encoder=encoder,
        drop_failed=drop_failed,
        out=out,
        source=source,
    )
    text = layout_of(report.pair).finalized_text(report.pair, drop_old)
    dropped = report.dropped
    if dropped is not None and dropped.path is not None:
        text = f"removed {dropped.removed} failed points (listed in {dropped.path}); {text}"
    elif dropped is not None:
        text = f"no failed points to remove; {text}"
    emit(report.as_dict(), as_json, text + report.note)


@click.command(name="rollback")
@name_option
@click.option("--alias", help="Serving alias to point at old [default: the pair's].")
@click.option("--old-encoder", type=click.Path(), help="The old model, for a pair created without one.")
@json_option
@click.pass_context
def rollback_command(
    ctx: click.Context, name: str, alias: str | None, old_encoder: str | None, as_json: bool
) -> None:
    """Serve the old model again from the old collection (pairs created with --keep-old) or
    the old vector (single-collection pairs)."""
    record = lifecycle.rollback(open_cli_store(ctx), name, alias=alias, old_encoder=old_encoder)
    emit(dataclasses.asdict(record), as_json, layout_of(record).rolled_back_text(record))
