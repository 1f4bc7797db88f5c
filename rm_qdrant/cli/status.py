"""``rmq status``: a pair's collections, progress, models and the estimate of what it serves."""

from __future__ import annotations

from typing import Any

import click

from rm_qdrant.api import inspecting
from rm_qdrant.cli.common import (
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
)
from rm_qdrant.cli.probe import crowding_advice
from rm_qdrant.cli.sourceopts import source_lines
from rm_qdrant.pair.record import PairRecord


@click.command()
@name_option
@json_option
@click.pass_context
def status(ctx: click.Context, name: str, as_json: bool) -> None:
    """Both collections' sizes, the fraction migrated, the query mode and the models."""
    report = inspecting.status(open_cli_store(ctx), name)
    pair, state, estimate, calibrated = report.pair, report.status, report.estimate, report.calibrated
    rolled_back = state.state == "rolled_back"
    old_where, new_where = plain(state.old_place), plain(state.new_place)
    text = "\n".join(
        [
            f"pair          {plain(state.name)} ({state.mode}, {state.layout}, {state.state})",
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
            *(f"  {pid}  {plain(reason)}" for pid, _, reason in state.failure_sample),
            *_bypass_lines(state),
            f"encoder       {plain(state.encoder)}",
            f"old encoder   {plain(state.old_encoder or '-')}",
            f"plain new     {plain(state.new_model or '-')}",
            f"decode        {_decode_text(state.decode)}",
            f"merge         {'calibrated (rmq calibrate)' if calibrated else 'plain distances'}",
            f"alias         {plain(state.alias or '-')}",
            f"images        {plain(pair.uri_rule.describe())}; {source_lines(pair.source)}",
            f"estimate      {_estimate_line(estimate, pair.state)}",
        ]
    )
    emit(report.as_dict(), as_json, text)


def _decode_text(decode: str) -> str:
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
