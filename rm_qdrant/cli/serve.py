"""``rmq init`` and ``index``: creating a pair (``rmq search`` is in :mod:`rm_qdrant.cli.search`)."""

from __future__ import annotations

from typing import Any

import click

from rm_qdrant.api import creating
from rm_qdrant.cli.common import (
    COLLECTION,
    Steps,
    decode_option,
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
    quiet,
)
from rm_qdrant.cli.rerankopts import chosen_rerank, described, rerank_options
from rm_qdrant.cli.sourceopts import recorded_source_options
from rm_qdrant.errors import ConfigError
from rm_qdrant.pair.layouts import layout_of


@click.command()
@name_option
@click.option("--old-collection", type=COLLECTION, help="The collection the old model filled (as it is).")
@click.option(
    "--collection",
    type=COLLECTION,
    help="Single-collection layout: the collection (the old model's vectors in it).",
)
@click.option("--old-vector", help="Its vector name, if it has named vectors [default: its only vector].")
@click.option("--new-vector", help="Single-collection layout: the name of the new model's vector.")
@click.option("--encoder", required=True, type=click.Path(), help="New model graph (.onnx).")
@click.option(
    "--old-encoder", type=click.Path(), help="Old model graph: the naive mode's, and what a rollback serves."
)
@click.option("--new-model", type=click.Path(), help="The plain new model (no ψ/ρ): New for eval, probe.")
@click.option("--new-collection", type=COLLECTION, help="Name of the new collection [default: NAME-new].")
@click.option(
    "--mode",
    type=click.Choice(["paired", "single-collection", "rm", "naive"]),
    help="Layout: paired (a new collection) [default] or single-collection (a new named vector). "
    "'rm' and 'naive' are paired with that query mode.",
)
@click.option(
    "--query-mode",
    type=click.Choice(["rm", "naive"]),
    help="Query mode [default: rm if the encoder has a 'rev' output].",
)
@click.option(
    "--keep-old",
    is_flag=True,
    help="Keep migrated points in old (hidden) so 'rmq rollback' works (needs --old-encoder).",
)
@click.option(
    "--uri-field",
    default="uri",
    show_default=True,
    help="Payload field with each image's URI; dots go into objects: 'asset.url'.",
)
@click.option(
    "--uri-template",
    help="Or build the URI from payload fields, e.g. 's3://bucket/{sku}.jpg' or "
    "'https://cdn/{asset.path}' ({id}: the id).",
)
@click.option(
    "--text-field",
    help="A text pair: the payload field that holds each document's text itself ('body', 'doc.text'); "
    "without it a text pair reads its documents from --uri-field/--uri-template (files, HTTP, S3).",
)
@click.option(
    "--label-field",
    default="label",
    show_default=True,
    help="Payload field with class labels; dots go into objects: 'meta.dept'.",
)
@click.option(
    "--full-scan-kb",
    type=click.IntRange(min=0, max=1_000_000_000),
    help="Give the searched vectors this HNSW full_scan_threshold (KB), so segments above it are "
    "searched through their graph, not scanned; the team's vector keeps it after drop-pair "
    "[default: 1000 on a single-collection pair's new vector; Qdrant's own is 10000].",
)
@decode_option(
    "How every command decodes the pair's images: exact (the team pipeline's pixels to the bit) or "
    "fast (JPEGs at a reduced DCT scale, then only the crop resized); recorded, changed only by "
    "'rmq switch-encoder --decode'.",
    default="exact",
)
@recorded_source_options
@rerank_options
@json_option
@click.pass_context
def init(
    ctx: click.Context,
    name: str,
    old_collection: str | None,
    collection: str | None,
    old_vector: str | None,
    new_vector: str | None,
    encoder: str,
    old_encoder: str | None,
    new_model: str | None,
    new_collection: str | None,
    mode: str | None,
    query_mode: str | None,
    keep_old: bool,
    uri_field: str,
    uri_template: str | None,
    text_field: str | None,
    label_field: str,
    full_scan_kb: int | None,
    decode: str,
    source_settings: dict[str, Any],
    rerank_k: int | None,
    rerank_deadline: float | None,
    rerank_budget: int | None,
    promote: bool | None,
    as_json: bool,
) -> None:
    """Create the new collection (mirroring the old one's schema), or the new vector of a
    single collection, and the pair record.

    The source options given are recorded: every later command that reads the pair's
    images uses them (a value given to that command overrides it for that run)."""
    given = ctx.get_parameter_source("uri_field") != click.core.ParameterSource.DEFAULT
    rerank = chosen_rerank(None, rerank_k, rerank_deadline, rerank_budget, promote)
    report = creating.init(
        open_cli_store(ctx),
        name,
        encoder=encoder,
        old_collection=old_collection,
        collection=collection,
        old_vector=old_vector,
        new_vector=new_vector,
        old_encoder=old_encoder,
        new_model=new_model,
        new_collection=new_collection,
        mode=mode,
        query_mode=query_mode,
        keep_old=keep_old,
        uri_field=uri_field if given else None,
        uri_template=uri_template,
        text_field=text_field,
        label_field=label_field,
        full_scan_kb=full_scan_kb,
        source=source_settings,
        decode=decode,
        rerank=rerank,
    )
    record = report.pair
    where = plain(record.uri_rule.describe())
    created = plain(layout_of(record).created)
    text = f"pair {record.name!r} ({record.mode}): {created}; "
    if record.encoder.modality == "text":
        text += f"documents from {where}" + (" (the text itself)" if record.text_field else "")
    else:
        text += f"images from {where}, decoded {record.decode}"
    if rerank is not None:
        text += f"\n{described(rerank)} (every search, unless it says otherwise)"
    text += f"\n{plain(report.note)}" if report.note else ""
    emit(report.as_dict(), as_json, text)


@click.command()
@click.option(
    "--name",
    type=COLLECTION,
    help="Index into this pair's old collection (a paired layout: before its new collection holds points).",
)
@click.option("--collection", type=COLLECTION, help="Index into this collection (created if missing).")
@click.option("--data", required=True, type=click.Path(), help="Image folder: DATA/<label>/<image>.")
@click.option(
    "--encoder", required=True, type=click.Path(), help="The model that fills the collection (.onnx)."
)
@click.option("--batch", default=256, show_default=True, type=click.IntRange(min=1), help="Images per batch.")
@json_option
@click.pass_context
def index(
    ctx: click.Context,
    name: str | None,
    collection: str | None,
    data: str,
    encoder: str,
    batch: int,
    as_json: bool,
) -> None:
    """Load an image folder into a collection (reproduces an existing deployment)."""
    if (name is None) == (collection is None):  # before the store is opened: this one may create it
        raise ConfigError("give exactly one of --name and --collection")
    with Steps(hidden=as_json or quiet(ctx)) as bars:
        report = creating.index(
            open_cli_store(ctx, create=True),
            data,
            encoder=encoder,
            name=name,
            collection=collection,
            batch=batch,
            on_step=bars,
        )
    text = f"indexed {report.indexed} images into {report.collection!r}"
    if report.failed:
        text += f"; skipped {len(report.failed)} unreadable, first: {report.failed[0][1]}"
    emit(report.as_dict(), as_json, text)
