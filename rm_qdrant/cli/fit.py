"""``rmq fit``: train ψ/ρ for a team's own models from its live gallery (needs PyTorch).

A sample of the pair's old collection gives (stored old vector, new backbone embedding)
pairs; heads are trained on them, checked against the naive merge on a held-out part,
and joined to the team's backbone as one graph (outputs ``new`` and ``rev``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click

from rm_qdrant.cli.common import (
    EXIT_STATUS_HELP,
    FiniteFloat,
    emit,
    holdout_options,
    json_option,
    name_option,
    open_cli_store,
    quiet,
)
from rm_qdrant.cli.instead import calibrate_options, instead_text, loss_options
from rm_qdrant.cli.probe import curve_table, sample_line, sample_with_progress
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.cli.threads import apply_threads, choose_threads, needs_torch, threads_option
from rm_qdrant.core.forecast import holdout_split
from rm_qdrant.core.paths import check_path
from rm_qdrant.errors import ConfigError, Refused
from rm_qdrant.evaluation.probe import ProbeSample
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.layouts import count_new
from rm_qdrant.pair.record import load_pair
from rm_qdrant.sources import SourceConfig

FIT_LOSSES = ("auto", "mcl", "label-free", "rqt", "procrustes")
#: Torch threads when neither --threads nor OMP_NUM_THREADS says: the heads are small (an idle
#: 16-core machine trains them 1.2-1.4x faster on 2 to 4 threads, a busy 2-core one 4-26x
#: slower on 2: benchmarks/results/threads.md), and a fixed count keeps the graph from
#: depending on how busy the machine was (another count sums floats in another order).
FIT_THREADS = 1


@click.command(name="fit", epilog=EXIT_STATUS_HELP)
@name_option
@holdout_options
@click.option(
    "--backbone",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The team's new model (.onnx), described by 'rmq model stamp'.",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where the fitted graph goes.")
@click.option(
    "--label-field",
    help="Payload field with a class label ('meta.dept': nested): trains the paper's MCL + ρ.",
)
@click.option(
    "--loss",
    default="auto",
    show_default=True,
    type=click.Choice(FIT_LOSSES),
    help="auto: mcl with --label-field, else label-free; rqt and procrustes fit ψ alone.",
)
@click.option("--steps", type=click.IntRange(min=1), help="Optimizer steps [default: 2000].")
@click.option("--epochs", type=click.IntRange(min=1), help="Or: passes over the training part of the sample.")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), help="Adam learning rate [default: 1e-3].")
@click.option("--batch", type=click.IntRange(min=2), help="Pairs per step [default: 256].")
@click.option(
    "--force", is_flag=True, help="Write the graph even when it forecasts worse than the naive merge."
)
@threads_option("$OMP_NUM_THREADS, else 1: the same graph however busy the machine")
@source_options
@json_option
@click.pass_context
def fit_command(
    ctx: click.Context,
    name: str,
    backbone: str,
    out: str,
    size: int,
    label_field: str | None,
    loss: str,
    steps: int | None,
    epochs: int | None,
    lr: float | None,
    batch: int | None,
    holdout: float,
    k: int,
    seed: int,
    force: bool,
    threads: int | None,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Train ψ (and ρ) on pairs from the gallery: stored old vectors and the backbone's embeddings.

    No old model is needed, and no labels unless --label-field. Part of the sample is held
    out. Without labels, the fitted graph is written only if, at every backfill fraction t,
    its hits there are as near in both models' rankings as the naive merge's (calibrated
    where the pair is; at t = 0 the old model's), within two standard errors; with labels,
    if its area under mAP beats the naive merge's. Otherwise (unless --force) nothing is
    written, the one line says at which t and by how much, and rmq exits 3.

    The same --seed, gallery, backbone and thread count give the same graph; another thread
    count (--threads, OMP_NUM_THREADS; default 1) can change the last digits, and so the graph.
    """
    choice = choose_threads(threads, default=FIT_THREADS)  # before torch loads: it reads OMP_NUM_THREADS
    # ONNX Runtime embeds the sample (byte-identical on 1 and 2 threads, a ResNet-18 measured):
    # one thread per idle core.
    onnx_threads = choose_threads(threads).threads
    try:
        from rm_qdrant_exporters.compose import attach_model
        from rm_qdrant_exporters.serving import ExportError
        from rm_qdrant_train.cli import show_progress
        from rm_qdrant_train.fit import FitSettings, fit_recipe, resolve_loss
        from rm_qdrant_train.heads import steps_per_epoch
        from rm_qdrant_train.holdout import decide
        from rm_qdrant_train.holdout import judge as judge_heads
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
    silent = as_json or quiet(ctx)
    show_progress(quiet=silent)
    used = apply_threads(choice)
    target = Path(out)
    if target.resolve() == Path(backbone).resolve():
        raise ConfigError("--out is the backbone itself: write the fitted graph to another file")
    if not target.parent.is_dir():
        raise ConfigError(f"cannot write {out}: folder {target.parent} does not exist")
    store = open_cli_store(ctx)
    pair = load_pair(store, name)
    if pair.state != "backfilling":
        raise ConfigError(f"pair {name!r} is {pair.state}: there is no backfill left to fit heads for")
    encoder = OnnxEncoder(backbone, threads=onnx_threads)
    if "rev" in encoder.info.outputs:
        raise ConfigError(f"{backbone} already has heads (a 'rev' output): give the plain backbone")
    role = encoder.info.gallery_output()
    new_dim = store.collection(pair.new_collection, pair.new_using).dim
    if encoder.info.outputs[role] != new_dim:
        raise ConfigError(
            f"{backbone} gives {encoder.info.outputs[role]}-d embeddings ({role!r}); "
            f"pair {name!r}'s new collection holds {new_dim}-d vectors"
        )
    if label_field is not None:
        check_path(label_field, "--label-field")
    try:
        chosen = resolve_loss(loss, label_field is not None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    sample = in_id_order(
        sample_with_progress(
            store, pair, encoder, size, seed=seed, source=source, hidden=silent, label="embedding the sample"
        )
    )
    labels = sample.labels(label_field) if label_field else None
    if label_field and labels is None:
        raise ConfigError(
            f"payload field {label_field!r} is missing on some sampled points, or holds a list, an object or "
            "true/false instead of a class name (a string or a number): no labels to train on"
        )
    # Labels judge wherever the payload has them, even when they do not train (issue 39).
    judge = (
        labels
        if labels is not None
        else informative(sample.labels(pair.label_field) if pair.label_field else None)
    )
    try:
        train_idx, held_idx = holdout_split(len(sample.ids), holdout, seed, k=k)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    defaults = FitSettings()
    chosen_batch = batch or defaults.batch
    settings = FitSettings(
        loss=chosen,
        steps=epochs * steps_per_epoch(len(train_idx), chosen_batch) if epochs else steps or defaults.steps,
        batch=chosen_batch,
        lr=lr or defaults.lr,
        seed=seed,
    )

    def rows(values: list[Any] | None, idx: Any) -> list[Any] | None:
        return None if values is None else [values[i] for i in idx]

    started = time.perf_counter()
    if not silent:
        click.echo(f"training {chosen} on {len(train_idx)} pairs ({len(held_idx)} held out)...", err=True)
        click.echo(reproducible(used.threads, used.reason), err=True)
    try:
        fitted = fit_recipe(
            sample.new[train_idx],
            sample.old[train_idx],
            rows(labels, train_idx),
            settings,
            judge=rows(judge, train_idx),
        )
        heads = fitted.heads
        trained_s = time.perf_counter() - started
        served = {
            "k": k,
            "seed": seed,
            "metric": pair.distance,  # as the pair will serve the graph
            "unit": encoder.info.derived_scale(pair.distance) == "unit",
        }
        # The held-out points query the whole sample, as the graph will query the whole gallery.
        # Labels decide where there are any; else the guard, against the naive merge as the pair
        # serves it (calibrated or not).
        forecasts, verdict, labelled = judge_heads(
            heads, sample.new, sample.old, judge, held=held_idx, naive_distance=pair.old_distance, **served
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    ok, measure = decide(forecasts, verdict, labelled)
    data: dict[str, Any] = {
        "pair": name,
        "loss": chosen,
        "sample": len(sample.ids),
        "sample_key": sample.key,  # the same key, --seed, threads and baseline: the same verdict
        "judged_on": sample_line(
            sample, seed, "the calibrated naive merge" if pair.old_distance else "the plain naive merge"
        ),
        "unreadable": sample.failed,
        "trained_on": len(train_idx),
        "held_out": len(held_idx),
        "train_seconds": round(trained_s, 1),
        "learned_rho": bool(heads.learn_rho),
        "k": k,
        "seed": seed,
        "threads": used.threads,
        "forecasts": [f.as_dict() for f in forecasts],
        "better_than_naive": ok,
        "measure": measure,
        "decided_by": "labels" if verdict is None else "guard",
        "labels_from": None if judge is None else label_field or pair.label_field,
        "guard": None if verdict is None else verdict.as_dict(),
        "labelled": None if labelled is None else labelled.as_dict(),
        "recipe": fitted.recipe,
        **(fitted.selection.as_dict() if fitted.selection else {"winner": fitted.recipe, "candidates": []}),
    }
    if not ok and not force:
        # What the guard would take instead, cheapest first, on the same split (issue 38).
        split = (sample.old[train_idx], sample.new[train_idx]), (sample.old[held_idx], sample.new[held_idx])
        data["instead"] = [
            *calibrate_options(pair, encoder, split, k=k, seed=seed),
            *loss_options(
                chosen, (sample.old, sample.new, train_idx, held_idx), labels, judge, settings, served, pair
            ),
        ]
        if as_json:
            emit(data, True, "")
        elif not silent:
            click.echo("\n".join(selection_lines(data)), err=True)
        refused_by = labelled if labelled is not None and not labelled.passed else verdict
        worse = (
            f"forecasts worse than the naive merge ({measure})"
            if refused_by is None or refused_by.passed
            else f"is refused by the {'labels' if refused_by is labelled else 'guard'}: {measure}"
        )
        raise Refused(
            f"on the {len(held_idx)} held-out points the fitted graph ({chosen}) {worse}; "
            f"the naive merge is kept, not written to {out} "
            "(try another --loss, a larger --sample, or --force); " + instead_text(data["instead"]),
            measured=verdict,
        )
    try:
        path, parity = attach_model(
            backbone,
            heads,
            out,
            output_name=encoder.info.graph_output(role),
            name=f"{Path(backbone).stem}+fit-{chosen}",
            distance=pair.distance,
            fit={"recipe": fitted.recipe, "loss": chosen, "seed": seed},
        )
    except ExportError as exc:
        raise ConfigError(str(exc)) from exc
    data.update(out=str(path), parity=parity, seconds=round(time.perf_counter() - started, 1))
    emit(data, as_json, _text(data, forecasts, count_new(store, pair) > 0))


def informative(labels: list[Any] | None) -> list[Any] | None:
    """The pair's labels where they can judge (some class holds two or more points, and there are
    two or more classes), else None: a field that names each point apart (a caption, an id) or
    one value everywhere would make every AP 0 or 1 for both curves, and refuse every fit."""
    if labels is None:
        return None
    counts = Counter(map(str, labels)).values()
    return labels if len(counts) > 1 and max(counts) > 1 else None


def in_id_order(sample: ProbeSample) -> ProbeSample:
    """The sample's rows sorted by point id (numbers, then UUIDs): the split and the training
    order then do not depend on the order a store hands the points back in."""
    order = sorted(range(len(sample.ids)), key=lambda i: (isinstance(sample.ids[i], str), sample.ids[i]))
    if order == list(range(len(order))):
        return sample
    return dataclasses.replace(
        sample,
        ids=[sample.ids[i] for i in order],
        payloads=[sample.payloads[i] for i in order],
        old=sample.old[order],
        new=sample.new[order],
        rev=None if sample.rev is None else sample.rev[order],
    )


def reproducible(threads: int, reason: str) -> str:
    """The one line on what makes a fit repeatable: PyTorch sums floats in an order that
    depends on its thread count, and the label-free recipe's choice can turn on the last digits."""
    return (
        f"torch threads: {threads} ({reason}); the same --seed, sample and thread count give the same "
        "graph, another thread count may not"
    )


def selection_lines(data: dict[str, Any]) -> list[str]:
    """What was judged on, each candidate's holdout evidence, one line each, and which won and why
    (label-free only)."""
    if not data["candidates"]:
        recipe = f"recipe: {data['recipe']}" + (f" ({data['why']})" if data.get("why") else "")
        return [data["judged_on"], recipe]
    lines = [
        data["judged_on"],
        "label-free candidates, a holdout of the training pairs querying all of them "
        "(guard: the hits' score by the new model's log rank; area: recall among the holdout):",
    ]
    for c in data["candidates"]:
        guard = c["guard"]
        if guard is None:
            lines.append(f"  {c['recipe']}: training diverged")
            continue
        worst = guard["fractions"].index(guard["min_margin_t"])
        lines.append(
            f"  {c['recipe']}: t=0 {guard['fitted'][0]:.3f} (old {guard['naive'][0]:.3f}), "
            f"min fitted-naive {guard['min_margin']:+.3f} at t={guard['min_margin_t']:g} "
            f"(fitted {guard['fitted'][worst]:.3f}, naive {guard['naive'][worst]:.3f}), area {c['area']:.3f}"
            + ("" if guard["passed"] else ", guard: no")
            + (", dips" if c["dips"] else "")
            + ("" if not c.get("labelled") or c["labelled"]["passed"] else ", below naive by the labels")
        )
    lines.append(f"won: {data['winner']}: {data['why']}")
    return lines


def _text(data: dict[str, Any], forecasts: list[Any], new_holds_points: bool) -> str:
    recall, maps = curve_table(forecasts)
    lines = [
        f"fitted {data['loss']} on {data['trained_on']} pairs in {data['train_seconds']:.0f} s "
        f"({data['held_out']} held out"
        + (f", {data['unreadable']} unreadable skipped" if data["unreadable"] else "")
        + ")",
        "",
        f"recall@{data['k']} on the held-out points against the new model's own neighbours:",
        *recall,
    ]
    if maps:
        lines += ["", "mAP on the held-out points (payload labels):", *maps]
    if data["decided_by"] == "guard":
        verdict = (
            "passes the guard against"
            if data["better_than_naive"]
            else "FAILS the guard (written with --force) against"
        )
    else:
        verdict = "better than" if data["better_than_naive"] else "WORSE than (written with --force)"
    lines += ["", *selection_lines(data)]
    lines += [
        "",
        f"the fitted graph ({data['recipe']}) {verdict} the naive merge: {data['measure']}",
        f"wrote {data['out']} (outputs new and rev; ONNX Runtime vs PyTorch {data['parity']:.1e})",
    ]
    if data["learned_rho"] and new_holds_points:
        lines.append(
            f"ρ was learned, so its 'new' differs from the vectors already in pair {data['pair']}'s new "
            f"collection: serve it in a new pair (rmq init --encoder {data['out']} ...), or refit with "
            "a loss that keeps ρ the identity to use rmq switch-encoder"
        )
    else:
        lines.append(f"serve it: rmq switch-encoder --name {data['pair']} --encoder {data['out']}")
    return "\n".join(lines)
