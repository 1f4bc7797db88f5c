"""``rmq init``, ``index`` and ``search``: creating a pair and serving it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import click

from rm_qdrant.api import creating
from rm_qdrant.cli.common import (
    COLLECTION,
    FiniteFloat,
    Steps,
    decode_option,
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
    quiet,
)
from rm_qdrant.cli.sourceopts import recorded_source_options
from rm_qdrant.core.merge import Hit
from rm_qdrant.core.paths import integer_text, payload_value
from rm_qdrant.errors import ConfigError, InvalidFilter
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import shown
from rm_qdrant.store import Where, qfilter
from rm_qdrant.store.bounds import MAX_FILTER_DEPTH, MAX_HITS


def parse_filter(given: tuple[str, ...]) -> Where | dict[str, Any] | None:
    """Each ``--filter``: a JSON object in Qdrant's filter shape (``{"must": [{"key": "price",
    "range": {"gte": 10}}]}``), or ``FIELD=VALUE``: a value written as an integer (``3``,
    ``-7``, not ``007``) matches integers; anything else, or a value in double quotes
    (``sku="3"``), matches strings. All of them must hold."""
    equal: dict[str, Any] = {}
    where = Where()
    for item in given:
        if item.lstrip().startswith(("{", "[")):
            where = where & Where(clauses=(_json_filter(item),))
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f'bad --filter {item!r}: expected FIELD=VALUE or a JSON filter {{"must": [...]}}'
            )
        if len(value) >= 2 and value[0] == value[-1] == '"':
            matched: Any = value[1:-1]
        else:
            _check_plain_value(item, key, value)
            number = integer_text(value)
            matched = value if number is None else number
        if key in equal:  # a field named twice: both terms hold (Where keeps them apart)
            where = where & Where(must={key: matched})
        else:
            equal[key] = matched
    if not where:
        return equal or None  # plain FIELD=VALUE terms: an equality filter, as before JSON filters
    return Where(must=equal) & where


#: An unquoted FIELD=VALUE that reads as a decimal number (1.5, .5, 2e3).
_DECIMAL = re.compile(r"[-+]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+)")


def _check_plain_value(item: str, key: str, value: str) -> None:
    """Refuse a FIELD=VALUE whose value reads as a decimal number, true/false or null: it would
    match only the string of that spelling, and silently find nothing where the payload holds
    the number, the boolean or the null."""
    lowered = value.lower()
    digits = value.removeprefix("-")
    if digits.isdigit() and digits.isascii() and digits[0] != "0" and integer_text(value) is None:
        shown = value if len(value) <= 30 else f"{value[:12]}...{value[-6:]} ({len(digits)} digits)"
        raise InvalidFilter(
            f"bad --filter {key}={shown}: outside the 64-bit integers a filter matches "
            f'(-2**63 to 2**63 - 1); for the string, quote it: {key}="..."'
        )
    if lowered in ("true", "false"):
        what = "a true/false field (on a Qdrant server or qdrant-client's local mode)"
        condition = {"key": key, "match": {"value": lowered == "true"}}
    elif lowered == "null":
        what, condition = "a null field", {"is_null": {"key": key}}
    elif _DECIMAL.fullmatch(value) and math.isfinite(float(value)):
        what, condition = (
            "a decimal number",
            {"key": key, "range": {"gte": float(value), "lte": float(value)}},
        )
    else:
        return
    raise ConfigError(
        f"bad --filter {item!r}: FIELD=VALUE matches integers and strings; for {what} give "
        f"'{json.dumps({'must': [condition]})}', for the string {key}=\"{value}\""
    )


def _json_filter(item: str) -> Any:
    try:
        raw = json.loads(item)
    except ValueError as exc:
        raise ConfigError(f"bad --filter: not valid JSON ({exc})") from None
    except RecursionError:  # thousands of levels: Python's parser gives up before the bound below
        raise InvalidFilter(f"bad --filter: nested deeper than {MAX_FILTER_DEPTH} filter levels") from None
    if not isinstance(raw, dict):
        raise ConfigError("bad --filter: a JSON filter is a JSON object, as Qdrant's filter")
    return qfilter.parse_filter(raw)


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
    label_field: str,
    full_scan_kb: int | None,
    decode: str,
    source_settings: dict[str, Any],
    as_json: bool,
) -> None:
    """Create the new collection (mirroring the old one's schema), or the new vector of a
    single collection, and the pair record.

    The source options given are recorded: every later command that reads the pair's
    images uses them (a value given to that command overrides it for that run)."""
    given = ctx.get_parameter_source("uri_field") != click.core.ParameterSource.DEFAULT
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
        label_field=label_field,
        full_scan_kb=full_scan_kb,
        source=source_settings,
        decode=decode,
    )
    record = report.pair
    images = record.uri_rule.describe()
    created = plain(layout_of(record).created)
    text = f"pair {record.name!r} ({record.mode}): {created}; images from {plain(images)}"
    text += f", decoded {record.decode}"
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


@click.command()
@name_option
@click.argument("image", type=click.Path())
@click.option(
    "--limit", default=10, show_default=True, type=click.IntRange(min=1, max=MAX_HITS), help="Number of hits."
)
@click.option(
    "--filter",
    "filters",
    multiple=True,
    help="Payload filter (repeatable, all must hold): FIELD=VALUE (3 matches integers, "
    '"3" (quoted) or 003 strings; 1.5, true and null are refused: use JSON), or Qdrant\'s JSON filter, e.g. '
    '\'{"must": [{"key": "price", "range": {"gte": 10}}]}\'.',
)
@click.option(
    "--score-threshold",
    type=FiniteFloat(),
    help="Keep hits at least this close, in the pair's score (cosine, dot: score >= T; "
    "euclid, manhattan: score <= T); on a calibrated pair an old hit's mapped distance decides, "
    "not the old model's score the table shows.",
)
@click.option(
    "--offset", default=0, type=click.IntRange(min=0, max=MAX_HITS), help="Skip this many merged hits first."
)
@click.option("--exact", is_flag=True, help="Exact search instead of the HNSW index.")
@click.option("--hnsw-ef", type=click.IntRange(min=1), help="HNSW search breadth [default: Qdrant's].")
@click.option("--encoder", type=click.Path(), help="Override the encoder path the pair recorded.")
@click.option("--old-encoder", type=click.Path(), help="Override the old encoder path.")
@json_option
@click.pass_context
def search(
    ctx: click.Context,
    name: str,
    image: str,
    limit: int,
    filters: tuple[str, ...],
    score_threshold: float | None,
    offset: int,
    exact: bool,
    hnsw_ef: int | None,
    encoder: str | None,
    old_encoder: str | None,
    as_json: bool,
) -> None:
    """Search the pair with one image; hits from both collections, merged by distance.

    --offset N skips the N closest merged hits (paging: --offset 10 --limit 10 is page two);
    --score-threshold keeps only hits at least that close, in the pair's score (as Qdrant's;
    on a calibrated pair, an old hit's mapped distance, the one the merge ranks by).

    A dot collection's hits show their score (the dot product, higher is closer); cosine,
    Euclid and Manhattan hits their distance (1 - cosine, or the distance; lower is closer).
    With --json each hit carries both: "score", Qdrant's score as the collection reports it,
    and "distance", what the merge ranks by (lower is closer: 1 - cosine, minus the dot
    product, the Euclid or Manhattan distance; a calibrated pair's old hits on the new
    model's scale).
    """
    opened = DualIndex.open(
        open_cli_store(ctx), name, encoder=encoder, old_encoder=old_encoder, exact=exact, hnsw_ef=hnsw_ef
    )
    with opened as dual:
        where = parse_filter(filters)
        hits = dual.search(image, limit=limit, filter=where, score_threshold=score_threshold, offset=offset)
        pair = dual.pair
    rows = [{k: v for k, v in dataclasses.asdict(h).items() if k != "vector"} for h in hits]
    emit(rows, as_json, "\n".join(_hit_lines(hits, pair, first=offset + 1)))


def _label(payload: dict[str, Any], field: str) -> object:
    value = payload_value(payload, field)
    return "" if value is None else value


def _hit_lines(hits: list[Hit], pair: PairRecord, *, first: int = 1) -> list[str]:
    """The hit table (ranks from ``first``): a dot product as a score (higher is closer), any other
    metric as a distance."""
    by_score = pair.distance == "dot"
    head = "score" if by_score else "distance"
    lines = [f"{'#':>3}  {head:>10}  {'source':6}  {pair.label_field[:10]:10}  id / image"]
    for rank, hit in enumerate(hits, first):
        found = pair.uri_rule.find(hit.id, hit.payload)
        where = "-" if found is None else shown(found)
        value = hit.score if by_score else hit.distance
        lines.append(
            f"{rank:>3}  {value:10.4f}  {hit.source:6}  "
            f"{plain(_label(hit.payload, pair.label_field)):10}  {hit.id}  {plain(where)}"
        )
    if by_score and pair.old_distance is not None and any(h.source == "old" for h in hits):
        lines.append(
            "(old hits' scores are the old model's; the calibrated merge ranks them on the new scale)"
        )
    return lines
