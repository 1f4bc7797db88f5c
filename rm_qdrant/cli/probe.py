"""``rmq probe``: the forecast of a backfill (label-free, and labelled where the sample has labels),
and the estimate ``rmq status`` shows."""

from __future__ import annotations

from typing import Any

import click

from rm_qdrant.api.probing import CURVES, NO_PSI, probe
from rm_qdrant.cli.common import (
    SEED,
    Steps,
    decode_option,
    emit,
    json_option,
    name_option,
    new_model_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.rerankopts import rerank_option
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.advice import crowding_fix, crowding_text
from rm_qdrant.core.forecast import Crowding, ModeForecast
from rm_qdrant.core.metrics import area
from rm_qdrant.core.ordering import ORDERS
from rm_qdrant.sources import SourceConfig


@click.command(name="probe")
@name_option
@click.option(
    "--sample",
    "size",
    default=2000,
    show_default=True,
    type=click.IntRange(min=2),
    help="Points to re-embed.",
)
@click.option("--k", default=10, show_default=True, type=click.IntRange(min=1), help="Neighbours compared.")
@click.option("--order", help=f"Backfill order: {', '.join(ORDERS)} [default: the pair's, else random].")
@click.option(
    "--seed", default=0, show_default=True, type=SEED, help="Seed of the sample and of the random order."
)
@source_options
@click.option("--encoder", type=click.Path(), help="Override the encoder path the pair recorded.")
@new_model_option("the naive curve")
@click.option(
    "--label-field",
    help="Payload field with class labels ('meta.dept': nested) [default: the pair's]: mAP is "
    "forecast too, and decides rm against naive.",
)
@decode_option(
    "Decode the sample's images this way: the forecast of serving with that decoding; nothing is "
    "recorded [default: as the pair records].",
)
@rerank_option(
    "the forecast of searches re-ranked so (rmq eval --rerank serves them); on the sample, the same "
    "share of the items, every old hit read in time; not kept for rmq status"
)
@json_option
@click.pass_context
def probe_command(
    ctx: click.Context,
    name: str,
    size: int,
    k: int,
    order: str | None,
    seed: int,
    source: SourceConfig,
    encoder: str | None,
    new_model: str | None,
    label_field: str | None,
    decode: str | None,
    rerank: int | None,
    as_json: bool,
) -> None:
    """Forecast the backfill curve on a re-embedded sample of the gallery; writes nothing to Qdrant.

    Quality is recall@k and nDCG@k against the new model's own neighbours over the
    sample (no labels needed); with payload labels (the pair's label field, or
    --label-field), mAP and top-1 too, and then mAP decides rm against the naive merge:
    rm is refused where its mAP falls below the naive merge's at any t by more than two
    standard errors. A pair must be backfilling: once finalized or rolled back there is no
    backfill left to forecast.
    """
    store = open_cli_store(ctx)
    with Steps(hidden=as_json or quiet(ctx)) as steps:
        report = probe(
            store,
            name,
            sample=size,
            k=k,
            order=order,
            seed=seed,
            source=source,
            encoder=encoder,
            new_model=new_model,
            label_field=label_field,
            on_step=steps,
            decode=decode,
            rerank=rerank,
        )
    data = report.as_dict()
    emit(data, as_json, _text(data, report.mode, list(report.forecasts)))


def curve_table(forecasts: list[ModeForecast]) -> tuple[list[str], list[str]]:
    """recall@k rows (with area and dips) and, with labels, mAP rows, each under its header."""
    head = f"{'t':14}" + "".join(f"{t:>7g}" for t in forecasts[0].fractions) + f"{'area':>8}  dips below t=0"
    recall = [head]
    for f in forecasts:
        dips = ", ".join(f"{t:g}" for t in f.dips()) or "no"
        recall.append(f"{f.mode:14}" + "".join(f"{r:7.3f}" for r in f.recall) + f"{f.area:8.3f}  {dips}")
    if forecasts[0].maps is None:
        return recall, []
    maps = [head.rsplit("dips", 1)[0].rstrip()]
    maps += [
        f"{f.mode:14}"
        + "".join(f"{m:7.3f}" for m in f.maps or ())
        + f"{area(f.maps or (), f.fractions):8.3f}"
        for f in forecasts
    ]
    return recall, maps


def share_table(forecasts: list[ModeForecast], k: int) -> list[str]:
    """The old side's share of the merged top k against its share of the sample, per t."""
    first = forecasts[0]
    if first.old_gallery is None:
        return []
    lines = [
        f"old hits' share of the merged top {k} (a side far below its share of the sample is crowded out):",
        f"{'t':14}" + "".join(f"{t:>7g}" for t in first.fractions),
        f"{'old in sample':14}" + "".join(f"{g:7.0%}" for g in first.old_gallery),
    ]
    lines += [f"{f.mode:14}" + "".join(f"{s:7.0%}" for s in f.old_share or ()) for f in forecasts]
    return lines


def _text(data: dict[str, Any], mode: str, forecasts: list[ModeForecast]) -> str:
    recall, maps = curve_table(forecasts)
    lines = [
        f"pair {data['pair']} ({mode}): {data['sample']} gallery points re-embedded"
        + (f", {data['unreadable']} unreadable skipped" if data["unreadable"] else "")
        + f"; {_read_as(data)}; order {data['order']}; nothing written",
        *_rerank_lines(data),
        "",
        f"recall@{data['k']} against the new model's own neighbours (label-free{_whose(forecasts)}):",
        *recall,
        *(f"{NO_PSI}: {CURVES[NO_PSI]}" for f in forecasts if f.mode == NO_PSI),
        "",
        *share_table(forecasts, data["k"]),
    ]
    if maps:
        n = data["sample"]
        lines += [
            "",
            f"mAP over the sample (payload labels; {n} of the gallery's {data['gallery']} points): each "
            f"sampled point ranks only the other {n - 1},",
            "so its level is a smaller gallery's, not comparable with served mAP: read its shape across t",
            *maps,
        ]
    lines += [
        "",
        f"recommendation: {data['recommendation']}",
        _cache_line(data),
    ]
    return "\n".join(lines)


def _rerank_lines(data: dict[str, Any]) -> list[str]:
    if data.get("rerank") is None:
        return []
    return [
        f"every curve re-ranks its merged first {data['rerank']} with its new model: on the sample, "
        f"the first {data['rerank_depth']} (the same share of {data['gallery']:,} points), each old "
        "hit read in time"
    ]


def _read_as(data: dict[str, Any]) -> str:
    if data.get("modality") == "text":
        return "documents tokenised by the model's tokenizer"
    return f"decoded {data['decode']}"


def _cache_line(data: dict[str, Any]) -> str:
    if data.get("rerank") is not None:
        return "a forecast with a re-rank: not kept (rmq status estimates the plain merge)"
    if data["decode"] != data["recorded_decode"]:
        return (
            f"decoded {data['decode']} as asked, the pair records {data['recorded_decode']}: a what-if, not "
            f"kept (rmq switch-encoder --decode {data['decode']} records it; rmq status keeps its estimate)"
        )
    return f"sample cached in {data['cache']} (rmq status shows the estimate now)"


def _whose(forecasts: list[ModeForecast]) -> str:
    modes = {f.mode for f in forecasts}
    if "rm" not in modes:
        return ""
    return "; the plain new model's" if "naive" in modes else "; here this graph's new output's"


def crowding_advice(estimate: dict[str, Any]) -> str:
    """``rmq status``'s warning on a crowded merge, in ``rmq probe``'s words (t: the sample's share
    migrated now), with probe's advice for the pair's mode."""
    crowded = [Crowding(**c) for c in estimate["crowded_out"]]
    text = crowding_text(crowded, estimate["k"])
    if estimate["mode"] != "naive":
        return text
    return (
        text
        + (" even calibrated; " if estimate["calibrated"] else "; ")
        + crowding_fix(not estimate["calibrated"])
    )
