"""``rmq probe``: the forecast of a backfill (label-free, and labelled where the sample has labels),
and the estimate ``rmq status`` shows."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import numpy as np

from rm_qdrant.cli.common import (
    SEED,
    Progress,
    emit,
    json_option,
    name_option,
    new_model_option,
    open_cli_store,
    quiet,
    store_location,
)
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.advice import Advice, advise, crowding_fix, crowding_text
from rm_qdrant.core.calibration_check import CHEAPEST_FIRST, judge_map
from rm_qdrant.core.forecast import Crowding, ModeForecast, holdout_split
from rm_qdrant.core.metrics import area
from rm_qdrant.core.ordering import ORDERS, check_order
from rm_qdrant.core.paths import check_path
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.baseline import forecast_with_plain, plain_new_model
from rm_qdrant.evaluation.probe import (
    ProbeSample,
    cache_path,
    check_probe,
    draw_sample,
    estimate_now,
    forecast_sample,
    load_sample,
    save_sample,
)
from rm_qdrant.migration.loading import preflight
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store

#: The curve that merges an rm graph's new output with the stored old vectors, queried by the old
#: model: ψ left out, but not the naive merge (that uses the plain new model, ρ left out too).
NO_PSI = "no-psi"
CURVES = {
    "naive": "the naive merge: the old model queries the stored old vectors, the plain new model new ones",
    "rm": "this pair's graph: its rev output (ψ) queries the stored old vectors, its new output the new ones",
    NO_PSI: "this pair's new output merged with the stored old vectors without ψ (the old model queries "
    "old); not the naive merge, which uses the plain new model (--new-model PATH)",
}


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
    check_probe(store, load_pair(store, name))  # before the encoders load: a finished pair says so
    index = DualIndex.open(store, name, encoder=encoder)
    pair, hidden = index.pair, as_json or quiet(ctx)
    spec = check_order(order) if order else (pair.order or "random")
    field = check_path(label_field, "--label-field") if label_field is not None else pair.label_field
    plain = plain_new_model(pair, new_model)  # before the sample: a wrong path stops at once
    sample = sample_with_progress(
        index.store, pair, index.encoder, size, seed=seed, source=source, hidden=hidden
    )
    labelled = sample.labels(field) is not None
    if label_field is not None and not labelled:  # asked for (as rmq fit --label-field): an error
        raise ConfigError(
            f"payload field {label_field!r} is missing on some sampled points, or holds a list, an object or "
            "true/false instead of a class name (a string or a number): no labels to forecast mAP with"
        )
    forecasts, advice = _curves(
        index,
        sample,
        plain,
        spec=spec,
        seed=seed,
        k=k,
        source=source,
        hidden=hidden,
        label_field=field,
    )
    cached = save_sample(sample, cache_path(store_location(ctx), name), k=k)
    data = {
        "pair": name,
        "sample": len(sample.ids),
        "gallery": sample.gallery,
        "unreadable": sample.failed,
        "order": spec,
        "k": k,
        "label_field": field if labelled else None,
        "forecasts": [{**f.as_dict(), "curve": CURVES[f.mode]} for f in forecasts],
        "recommendation": advice.text,
        **advice.as_dict(),
        "cache": str(cached),
    }
    emit(data, as_json, _text(data, pair.mode, forecasts))


def _curves(
    index: DualIndex,
    sample: ProbeSample,
    plain: OnnxEncoder | None,
    *,
    spec: str,
    seed: int,
    k: int,
    source: SourceConfig,
    hidden: bool,
    label_field: str,
) -> tuple[list[ModeForecast], Advice]:
    """The forecasts and the advice. An rm pair's naive curve needs the plain new model (its own
    sample); without one, the curve of the graph's new output is named for what it is (no-psi)."""
    pair = index.pair
    if plain is not None and sample.rev is not None:
        size = len(sample.ids) + sample.failed  # the same points: draw_sample picks by the seed
        again = sample_with_progress(
            index.store,
            pair,
            plain,
            size,
            seed=seed,
            source=source,
            hidden=hidden,
            label="the plain new model",
        )
        forecasts = forecast_with_plain(
            sample,
            again,
            order=spec,
            seed=seed,
            k=k,
            label_field=label_field,
            metric=pair.distance,
            order_field=pair.label_field,  # the order rmq migrate will move it in
        )
        return forecasts, advise(forecasts, k=k)
    forecasts = forecast_sample(
        sample,
        order=spec,
        seed=seed,
        k=k,
        label_field=label_field,
        calibration=pair.old_distance,
        metric=pair.distance,
        order_field=pair.label_field,
    )
    if sample.rev is None:
        calibrated = pair.old_distance is not None
        naive = forecasts[0]
        maps = (
            () if calibrated or not naive.crowded() else calibrate_maps(sample, pair.distance, k=k, seed=seed)
        )
        return forecasts, advise(forecasts, calibrated=calibrated, k=k, maps=maps)
    forecasts = [dataclasses.replace(f, mode=NO_PSI) if f.mode == "naive" else f for f in forecasts]
    rm = forecasts[-1]
    return forecasts, Advice(
        without_plain_advice(forecasts, k), None if rm.dips() or rm.crowded() else "rm", "label-free"
    )


def calibrate_maps(sample: ProbeSample, metric: str, *, k: int, seed: int) -> tuple[tuple[str, bool], ...]:
    """Whether ``rmq calibrate``'s guard would keep each of its maps, cheapest first, judged on
    this sample as calibrate judges its own (its default holdout, else half; () when too few)."""
    for holdout in (0.1, 0.5):
        try:
            fit, held = holdout_split(len(sample.ids), holdout, seed, k=k)
        except ValueError:
            continue
        order = np.random.default_rng(seed).permutation(len(held))
        split = {"order": order, "k": k, "metric": metric, "seed": seed}
        try:
            return tuple(
                (
                    m,
                    judge_map(
                        m, (sample.old[fit], sample.new[fit]), (sample.old[held], sample.new[held]), **split
                    ).kept,
                )
                for m in CHEAPEST_FIRST
            )
        except ValueError:
            return ()
    return ()


def without_plain_advice(forecasts: list[ModeForecast], k: int) -> str:
    """An rm pair's advice when the plain new model is unknown: the graph's curve, the no-ψ curve
    named for what it is, and no verdict on the naive merge, which was not forecast."""
    by_mode = {f.mode: f for f in forecasts}
    rm, other = by_mode["rm"], by_mode[NO_PSI]
    problems = [f"rm dips at t = {', '.join(f'{t:g}' for t in rm.dips())}"] if rm.dips() else []
    problems += [f"in rm, {crowding_text(rm.crowded(), k)}"] if rm.crowded() else []
    verdict = (
        f"rm is not safe ({'; '.join(problems)}" if problems else "serve rm (it never dips below its start"
    )
    return (
        f"{verdict}; area {rm.area:.3f}, {NO_PSI} {other.area:.3f}: this graph's new output without ψ). "
        "The naive merge was not forecast: give the plain new model with --new-model PATH, or record it "
        "(rmq switch-encoder --new-model PATH)"
    )


def sample_with_progress(
    store: Store,
    pair: PairRecord,
    encoder: OnnxEncoder | None,
    size: int,
    *,
    seed: int,
    source: SourceConfig,
    hidden: bool,
    label: str = "re-embedding the sample",
) -> ProbeSample:
    """:func:`draw_sample` with a progress bar over the images (probe, fit and calibrate), after a
    pre-flight: a few images fetched first, so settings that read none stop at once."""
    preflight(store, pair, encoder, source)
    with Progress(label, hidden=hidden, unit="images") as bar:
        return draw_sample(
            store, pair, encoder, size, seed=seed, source=source, on_plan=bar.start, on_image=bar.advance
        )


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
        + f"; order {data['order']}; nothing written",
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
        f"sample cached in {data['cache']} (rmq status shows the estimate now)",
    ]
    return "\n".join(lines)


def _whose(forecasts: list[ModeForecast]) -> str:
    modes = {f.mode for f in forecasts}
    if "rm" not in modes:
        return ""
    return "; the plain new model's" if "naive" in modes else "; here this graph's new output's"


def status_estimate(
    store: Store, pair: PairRecord, location: str, *, fraction: float | None = None
) -> dict[str, Any] | None:
    """The label-free estimate for the current state (``fraction`` of the gallery migrated), from
    the last probe's sample (None without one)."""
    loaded = load_sample(cache_path(location, pair.name))
    if loaded is None:
        return None
    sample, k = loaded
    if sample.encoder != pair.encoder.fingerprint:
        return None  # probed with another model: not this pair's forecast
    return estimate_now(store, pair, sample, k=k, fraction=fraction)


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


def sample_line(sample: ProbeSample, seed: int, baseline: str) -> str:
    """What a guard's verdict was judged on, so two runs can be compared: the same key, seed and
    baseline give the same verdict (the points still in old change as the backfill goes on)."""
    unread = f", {sample.failed} unreadable left out" if sample.failed else ""
    return (
        f"sample {sample.key}: {len(sample.ids)} points drawn with --seed {seed} from the {sample.gallery} "
        f"still in old{unread}; judged against {baseline}"
    )
