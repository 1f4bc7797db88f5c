"""``rmq status``: a pair's collections, progress, models and the estimate of what it serves."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from rm_qdrant.api import inspecting
from rm_qdrant.cli.common import (
    FiniteFloat,
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
    public,
    safe_text,
)
from rm_qdrant.cli.probe import crowding_advice
from rm_qdrant.cli.sourceopts import source_lines
from rm_qdrant.errors import StoreLocked
from rm_qdrant.pair.control import UNKNOWN_SINCE
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.serving.status import PairStatus


@click.command()
@name_option
@json_option
@click.option(
    "--watch",
    type=FiniteFloat(min=0.2, max=86_400),  # a day at most: far past it the timed wait overflows
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh in place every SECONDS (2 without a value) until Ctrl-C; with --json, one JSON "
    "line each time. An embedded store is opened for each refresh only, so a migration can start.",
)
@click.pass_context
def status(ctx: click.Context, name: str, as_json: bool, watch: float | None) -> None:
    """Both collections' sizes, the fraction migrated, the pace and ETA, the models."""
    if watch is None:
        report = inspecting.status(open_cli_store(ctx), name)
        emit(report.as_dict(), as_json, status_text(report))
        return
    watching(lambda: _frame(ctx, name, as_json), every=watch, clear=not as_json and _tty())


def _tty() -> bool:
    return click.get_text_stream("stdout").isatty()


def _frame(ctx: click.Context, name: str, as_json: bool) -> str:
    """One refresh: the status as text, or one JSON line; the embedded store is closed after.
    While a migration holds the embedded store, the refresh says so (``locked`` in JSON)."""
    obj = ctx.find_root().obj
    now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        report = inspecting.status(open_cli_store(ctx), name)
    except StoreLocked as exc:
        if as_json:
            return json.dumps(public({"name": name, "locked": str(exc)}))
        return safe_text(f"{now}\n{exc}: the next refresh tries again")
    finally:
        if "://" not in obj["qdrant"] and obj.get("store") is not None:
            obj["store"].close()  # the lock goes with it: a migration may start between refreshes
            obj["store"] = None
    if as_json:
        return json.dumps(public(json.loads(json.dumps(report.as_dict(), default=str))))
    return safe_text(now + "\n" + status_text(report))


def watching(
    frame: Callable[[], str], *, every: float, clear: bool, stop: threading.Event | None = None
) -> None:
    """Print ``frame()`` every ``every`` seconds (over the last one when ``clear``) until Ctrl-C
    or ``stop``."""
    stop = stop or threading.Event()
    try:
        while True:
            text = frame()
            click.echo(("\x1b[H\x1b[2J" if clear else "") + text, color=clear or None)
            if stop.wait(every):
                return
    except KeyboardInterrupt:
        return


def status_text(report: inspecting.StatusReport) -> str:
    """``rmq status`` as text."""
    pair, state, estimate, calibrated = report.pair, report.status, report.estimate, report.calibrated
    rolled_back = state.state == "rolled_back"
    old_where, new_where = plain(state.old_place), plain(state.new_place)
    paused = ", PAUSED" if state.paused_since is not None and state.state == "backfilling" else ""
    return "\n".join(
        [
            f"pair          {plain(state.name)} ({state.mode}, {state.layout}, {state.state}{paused})",
            f"old           {old_where}: {state.old_count} points"
            + (
                f" (+{state.kept_count} migrated, kept for rollback)"
                if state.keep_old and not rolled_back
                else ""
            )
            + (" (all served, by the old model)" if rolled_back else ""),
            f"new           {new_where}: {state.new_count} points"
            + (" (not served since the rollback)" if rolled_back else ""),
            f"migrated      {state.fraction:.1%} (order: {_order(pair)})",
            f"failed        {state.failed}",
            *truncation_lines(state),
            *pace_lines(state),
            *(f"  {pid}  {plain(reason)}" for pid, _, reason in state.failure_sample),
            *_bypass_lines(state),
            f"encoder       {plain(state.encoder)}",
            f"old encoder   {plain(state.old_encoder or '-')}",
            f"plain new     {plain(state.new_model or '-')}",
            f"decode        {_decode_text(state.decode, text=_reads_text(pair, state))}",
            f"merge         {'calibrated (rmq calibrate)' if calibrated else 'plain distances'}",
            f"alias         {plain(state.alias or '-')}",
            _source_line(pair),
            f"estimate      {_estimate_line(estimate, pair.state)}",
        ]
    )


def truncation_lines(state: PairStatus) -> list[str]:
    """A text pair's documents cut at the model's window (an image pair, or no run yet: none)."""
    if state.truncated is None:
        return []
    tokens = " or ".join(f"{n:,}" for n in state.truncated_at)
    noun = "document" if state.truncated == 1 else "documents"
    return [f"truncated     {state.truncated:,} {noun} at {tokens} tokens (the text past it is not embedded)"]


def pace_lines(state: PairStatus, *, now: float | None = None) -> list[str]:
    """The pace and ETA (and the pause) of a backfill, from the progress its processes recorded."""
    if state.state != "backfilling":
        return []
    lines = []
    if state.paused_since is not None:
        since = "an unknown time" if state.paused_since == UNKNOWN_SINCE else _clock(state.paused_since)
        lines.append(
            f"paused        since {since}: migrations wait before their next "
            f"batch; rmq resume {plain(state.name)} lets them go on"
        )
    running = f"{state.migrating_now} process{'es' if state.migrating_now != 1 else ''} migrating now"
    if state.remaining == 0:
        return [*lines, f"pace          - (nothing left to migrate; {running})"]
    if state.points_per_second is None or state.eta_seconds is None:
        return [*lines, f"pace          - (no point moved in the last 10 min; {running})"]
    end = (time.time() if now is None else now) + state.eta_seconds
    return [
        *lines,
        f"pace          {state.points_per_second:,.1f} points/s over the last "
        f"{duration(state.pace_seconds)} ({running})",
        f"eta           {duration(state.eta_seconds)} for {state.remaining:,} points (about {_clock(end)})"
        + (" once resumed" if state.paused_since is not None else ""),
    ]


def duration(seconds: float) -> str:
    """A span as people say it.

    >>> duration(4331)
    '1 h 12 min'
    >>> duration(42.4)
    '42 s'
    """
    seconds = max(0, round(seconds))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _reads_text(pair: PairRecord, state: PairStatus) -> bool:
    """Whether the pair is known to read text: its documents are in the payload, or a run counted
    the texts it cut (status opens no encoder, so a text pair read by URI is known after a run)."""
    return pair.text_field is not None or state.truncated is not None


def _decode_text(decode: str, *, text: bool = False) -> str:
    if text:
        return "- (text is tokenised one way: the model's tokenizer)"
    if decode == "fast":
        return "fast (JPEGs at a reduced DCT scale; rmq switch-encoder --decode exact changes it)"
    return "exact (the team pipeline's pixels; rmq switch-encoder --decode fast changes it)"


def _bypass_lines(state: Any) -> list[str]:
    """What writers that bypass rm-qdrant did since the last migrate run (none: no line)."""
    if not state.stale_copies:
        return []
    return [
        f"bypassed      {state.stale_copies} migrated points rewritten in old by another writer: "
        "served from old; the next rmq migrate drops their stale copies from new"
    ]


def _source_line(pair: PairRecord) -> str:
    """Where the pair reads each point's image, or a text pair's document (``--text-field``)."""
    if pair.text_field is not None:
        return f"documents     the text of {plain(pair.uri_rule.describe())}"
    return f"images        {plain(pair.uri_rule.describe())}; {source_lines(pair.source)}"


def _order(pair: PairRecord) -> str:
    if pair.order is None:
        return "not prepared"
    return pair.order if pair.order_ready else f"{pair.order}, ranks half-written: the next run ranks again"


def _estimate_line(e: dict[str, Any] | None, state: str) -> str:
    if state == "rolled_back":
        return "- (rolled back: the old model serves every point, there is no merge to estimate)"
    if state != "backfilling":
        return f"- ({state}: the backfill is over, there is no merge to estimate)"
    if e is None:
        return "- (run rmq probe for a label-free quality estimate)"
    k = e["k"]
    return (
        f"{e['mode']}: recall@{k} {e[f'recall@{k}']:.3f} now, {e[f'recall@{k}_start']:.3f} at the start "
        f"(label-free, {e['sample']}-point probe sample, {e['sample_migrated']:.0%} of it migrated)"
        + ("  BELOW THE START: the merge is dipping" if e["below_start"] else "")
        + (f"\n              CROWDED OUT: {crowding_advice(e)}" if e.get("crowded_out") else "")
    )
