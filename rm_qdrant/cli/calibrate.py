"""``rmq calibrate``: the calibrated naive merge, fitted on a sample of the gallery (no training, no labels).

A naive pair's two models measure distance on their own scales; the map fitted here
(:mod:`rm_qdrant.core.calibration`, a quantile map under the pair's own metric: cosine,
dot, Euclid or Manhattan) puts old-collection hits on the new model's scale before the
merge. It is kept in the pair record and applied by every search while the
pair is naive; ``--clear`` removes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import numpy as np

from rm_qdrant.cli.common import (
    EXIT_STATUS_HELP,
    emit,
    holdout_options,
    json_option,
    name_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.probe import curve_table, sample_line, sample_with_progress, share_table
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.calibration import MAPS, default_map
from rm_qdrant.core.calibration_check import alternatives_text, judge_map, other_maps
from rm_qdrant.core.forecast import holdout_split
from rm_qdrant.errors import ConfigError, Refused
from rm_qdrant.pair.record import load_pair, save_pair
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig


@click.command(name="calibrate", epilog=EXIT_STATUS_HELP)
@name_option
@holdout_options
@click.option(
    "--map",
    "mapping",
    type=click.Choice(["auto", *MAPS]),
    default="auto",
    show_default=True,
    help="isotonic: the mean new distance given the old one; quantile: the new distance at the old "
    "one's quantile (each side about its share of the top k); auto: isotonic for cosine, quantile "
    "for dot, Euclid and Manhattan (see the README).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Keep the map even when it forecasts worse than the plain merge or the guard refuses it.",
)
@click.option("--clear", is_flag=True, help="Remove the pair's calibration and merge plain distances again.")
@source_options
@json_option
@click.pass_context
def calibrate_command(
    ctx: click.Context,
    name: str,
    size: int,
    holdout: float,
    k: int,
    seed: int,
    mapping: str,
    force: bool,
    clear: bool,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Map the old model's distances onto the new model's scale for a naive pair's merge.

    A sample of the old collection is re-embedded with the pair's new model; the map is
    fitted on part of it and kept only if, on the rest, it forecasts better than the plain merge
    and the label-free guard passes it (its hits as near in both models' eyes as the plain
    merge's, at every t); or with --force. Otherwise the pair is left as it was and rmq exits 3.
    """
    store = open_cli_store(ctx)
    pair = load_pair(store, name)
    if clear:
        save_pair(store, dataclasses.replace(pair, calibration=None))
        emit({"pair": name, "calibration": None}, as_json, f"pair {name!r} merges plain distances again")
        return
    if pair.mode != "naive" or pair.state != "backfilling":
        raise ConfigError(
            f"pair {name!r} is {pair.state} in {pair.mode} mode: the calibration maps the old model's own "
            "distances, for a backfilling naive pair (an rm pair's ψ already puts them on the new scale)"
        )
    index = DualIndex.open(store, name)
    silent = as_json or quiet(ctx)
    sample = sample_with_progress(store, pair, index.encoder, size, seed=seed, source=source, hidden=silent)
    try:
        fit_idx, held_idx = holdout_split(len(sample.ids), holdout, seed, k=k)
        method = mapping if mapping != "auto" else default_map(pair.distance)
        order = np.random.default_rng(seed).permutation(len(held_idx))
        split = {
            "fit": (sample.old[fit_idx], sample.new[fit_idx]),
            "held": (sample.old[held_idx], sample.new[held_idx]),
            "order": order,
            "k": k,
            "metric": pair.distance,
            "seed": seed,
            "in_use": pair.old_distance,
        }
        judged = judge_map(method, **split)
        # A refusal says which map the guard would take, each tried on the same split, cheapest first.
        others = other_maps(method, **split) if not judged.kept and not force else []
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    calibration, forecasts, verdict, why = (
        judged.calibration,
        judged.forecasts,
        judged.verdict,
        judged.refused,
    )
    plain, calibrated, *in_use = forecasts
    areas = f"{calibrated.area:.3f} calibrated, {plain.area:.3f} plain" + (
        f", {in_use[0].area:.3f} the map in use" if in_use else ""
    )
    better = not why
    instead = alternatives_text(others)
    data: dict[str, Any] = {
        "pair": name,
        "sample": len(sample.ids),
        "sample_key": sample.key,  # the same key, --seed and map in use: the same verdict
        "unreadable": sample.failed,
        "fitted_on": len(fit_idx),
        "held_out": len(held_idx),
        "k": k,
        "knots": len(calibration.old),
        "distance": pair.distance,
        "mapping": method,
        "forecasts": [f.as_dict() for f in forecasts],
        "better_than_plain": calibrated.area > plain.area,  # the forecast's word alone
        "better_than_in_use": calibrated.area > in_use[0].area if in_use else None,  # no map: null
        "guard": verdict.as_dict(),
        "refused": why or None,  # why the map is not kept (without --force), else null
        "kept": better or force,
        "alternatives": [j.as_dict() for j in others],  # the other maps, tried after a refusal
    }
    if data["kept"]:
        save_pair(store, dataclasses.replace(pair, calibration=calibration.as_dict()))
    recall, _ = curve_table(forecasts)
    outcome = (
        ("kept" if better else f"kept with --force, although {why}")
        + f": searches of pair {name!r} now merge calibrated distances (--clear undoes it)"
        if data["kept"]
        else f"not kept: {why} (--force keeps it anyway)" + (f"\n{instead}" if instead else "")
    )
    text = "\n".join(
        [
            f"calibrated on {len(fit_idx)} sampled points ({len(held_idx)} held out"
            + (f", {sample.failed} unreadable skipped" if sample.failed else "")
            + f"), {len(calibration.old)} knots: the {method} map of {pair.distance} distances onto the new "
            "model's scale",
            "",
            f"recall@{k} on the held-out points against the new model's own neighbours:",
            *recall,
            "",
            *share_table(forecasts, k),
            "",
            f"area {areas}; guard: " + ("passed" if verdict.passed else "refused"),
            sample_line(sample, seed, "the map in use" if in_use else "the plain merge"),
            outcome,
        ]
    )
    emit(data, as_json, text)
    if not data["kept"]:
        raise Refused(
            f"on the {len(held_idx)} held-out points the {method} map is refused: {why} (area {areas}); "
            f"pair {name!r} "
            + ("keeps the map it had" if pair.calibration else "still merges plain distances")
            + " (--force keeps the new map anyway)"
            + (f"; {instead}" if instead else "")
        )
