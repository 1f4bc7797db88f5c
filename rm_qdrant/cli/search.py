"""``rmq search``: one query (an image, or a text on a text pair) over both halves of a pair."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import click

from rm_qdrant.cli.common import FiniteFloat, emit, json_option, name_option, open_cli_store, plain
from rm_qdrant.cli.rerankopts import chosen_rerank, no_rerank_alone, recorded, rerank_options, tally
from rm_qdrant.core.inputspec import clip
from rm_qdrant.core.merge import Hit
from rm_qdrant.core.paths import integer_text, payload_value
from rm_qdrant.core.uris import InlineText
from rm_qdrant.errors import ConfigError, InvalidFilter
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
@click.argument("query", metavar="[IMAGE | TEXT]", required=False)
@click.option("--text", help="A text pair's query text (the same as giving it as the argument).")
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
@rerank_options
@click.option("--no-rerank", is_flag=True, help="Do not re-rank, though the pair records a re-rank.")
@click.option(
    "--record-demand",
    is_flag=True,
    help="Count the hits served from old in their rmq_demand field (rmq migrate --order demand).",
)
@json_option
@click.pass_context
def search(
    ctx: click.Context,
    name: str,
    query: str | None,
    text: str | None,
    limit: int,
    filters: tuple[str, ...],
    score_threshold: float | None,
    offset: int,
    exact: bool,
    hnsw_ef: int | None,
    encoder: str | None,
    old_encoder: str | None,
    rerank_k: int | None,
    rerank_deadline: float | None,
    rerank_budget: int | None,
    promote: bool | None,
    no_rerank: bool,
    record_demand: bool,
    as_json: bool,
) -> None:
    """Search the pair with one image (its path), or on a text pair one text (the argument or
    --text); hits from both collections, merged by distance.

    --offset N skips the N closest merged hits (paging: --offset 10 --limit 10 is page two);
    --score-threshold keeps only hits at least that close, in the pair's score (as Qdrant's;
    on a calibrated pair, an old hit's mapped distance, the one the merge ranks by).

    A dot collection's hits show their score (the dot product, higher is closer); cosine,
    Euclid and Manhattan hits their distance (1 - cosine, or the distance; lower is closer).
    With --json each hit carries both: "score", Qdrant's score as the collection reports it,
    and "distance", what the merge ranks by (lower is closer: 1 - cosine, minus the dot
    product, the Euclid or Manhattan distance; a calibrated pair's old hits on the new
    model's scale).

    A text pair's query is encoded as a query (with the model's query prefix, if it has one);
    the table shows the start of each hit's text (or its URI) where an image pair shows the image.

    --rerank K (or the pair's re-rank: rmq init/switch-encoder --rerank) has the new model embed
    the old hits among the merged first K from their source, and orders the K by the new
    model's distances; the table's last column says what each got (embedded, cached, new; or
    late, over budget, unreadable: kept at its merged distance). --promote writes what was
    embedded to new before the command ends.
    """
    given = _query(query, text)
    tuned = (rerank_k, rerank_deadline, rerank_budget, promote) != (None, None, None, None)
    no_rerank_alone(no_rerank, tuned, "turns the re-rank off")
    opened = DualIndex.open(
        open_cli_store(ctx),
        name,
        encoder=encoder,
        old_encoder=old_encoder,
        exact=exact,
        hnsw_ef=hnsw_ef,
        demand=record_demand,
    )
    with opened as dual:
        if text is not None and dual.pair.encoder.modality != "text":
            raise click.UsageError(
                f"--text is for text pairs; pair {name!r} serves images: give an image path"
            )
        where = parse_filter(filters)
        base = None if no_rerank else recorded(dual.pair, rerank_k)
        plan = chosen_rerank(base, rerank_k, rerank_deadline, rerank_budget, promote)
        hits = dual.search(
            given, limit=limit, filter=where, score_threshold=score_threshold, offset=offset, rerank=plan
        )
        pair = dual.pair
    rows = [{k: v for k, v in dataclasses.asdict(h).items() if k != "vector"} for h in hits]
    lines = _hit_lines(hits, pair, first=offset + 1)
    if (done := tally(hits)) is not None:
        lines.append(done)
    if dual.promotions is not None:
        counts = dual.promotions
        line = f"promoted {counts.promoted} points to new ({counts.skipped} left to the migration"
        if counts.dropped:  # a failed write is logged; one search never fills the queue
            why = "the pair is paused or not backfilling, or the write failed"
            line += f"; {counts.dropped} not written: {why}"
        lines.append(line + ")")
    emit(rows, as_json, "\n".join(lines))


def _query(query: str | None, text: str | None) -> str:
    """The one query given, not blank (before the store is opened)."""
    if query is not None and text is not None:
        raise click.UsageError("give the query once: as the argument or as --text")
    given = text if text is not None else query
    if given is None:
        raise click.UsageError("give the query: an image path, or on a text pair its text (or --text)")
    if not given.strip():
        raise click.UsageError("the query is empty")
    return given


def _label(payload: dict[str, Any], field: str) -> object:
    value = payload_value(payload, field)
    return "" if value is None else value


def _hit_lines(hits: list[Hit], pair: PairRecord, *, first: int = 1) -> list[str]:
    """The hit table (ranks from ``first``): a dot product as a score (higher is closer), any other
    metric as a distance."""
    by_score = pair.distance == "dot"
    head = "score" if by_score else "distance"
    what = "text" if pair.encoder.modality == "text" else "image"
    lines = [f"{'#':>3}  {head:>10}  {'source':6}  {pair.label_field[:10]:10}  id / {what}"]
    reranked = any(h.rerank is not None for h in hits)
    if reranked:
        lines[0] += "  (re-rank)"
    for rank, hit in enumerate(hits, first):
        where = _shown_item(pair.uri_rule.find(hit.id, hit.payload))
        value = hit.score if by_score else hit.distance
        state = f"  ({hit.rerank or '-'})" if reranked else ""
        lines.append(
            f"{rank:>3}  {value:10.4f}  {hit.source:6}  "
            f"{plain(_label(hit.payload, pair.label_field)):10}  {hit.id}  {plain(where)}{state}"
        )
    if by_score and pair.old_distance is not None and any(h.source == "old" for h in hits):
        lines.append(
            "(old hits' scores are the old model's; the calibrated merge ranks them on the new scale)"
        )
    return lines


def _shown_item(found: object) -> str:
    """A hit's image URI, or the start of a text pair's document (at most 80 characters)."""
    if found is None:
        return "-"
    if isinstance(found, InlineText):
        return clip(str(found.value))
    return shown(found)
