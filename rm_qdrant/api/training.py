"""The calls :func:`~rm_qdrant.api.fitting.fit` makes into the training code (PyTorch: packages
``rm_qdrant_train`` and ``rm_qdrant_exporters``), each importing it when it runs, so that
:mod:`rm_qdrant` never imports torch; and the pure helpers of a fit's sample."""

from __future__ import annotations

import dataclasses
import importlib
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.api.common import needs_torch
from rm_qdrant.core.paths import check_path
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.probe import ProbeSample
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import is_text_graph
from rm_qdrant.pair.record import PairRecord

#: The training modules a fit needs, imported when it runs (they import PyTorch).
TRAINING = (
    "rm_qdrant_exporters.compose",
    "rm_qdrant_exporters.serving",
    "rm_qdrant_train.fit",
    "rm_qdrant_train.heads",
    "rm_qdrant_train.holdout",
)


def choose_threads(threads: int | None, *, default: int | None = None) -> Any:
    """The thread count a fit will use (``threads``, OMP_NUM_THREADS, the load), chosen before torch loads."""
    try:
        from rm_qdrant_train.threads import choose_threads
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
    try:
        return choose_threads(threads, default=default)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def apply_threads(choice: Any) -> Any:
    from rm_qdrant_train.threads import apply_threads

    try:
        return apply_threads(choice)
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc


def import_training() -> None:
    """Import the training code now: a missing PyTorch is one error before any work."""
    try:
        for module in TRAINING:
            importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc


def check_reads(pair: PairRecord, encoder: OnnxEncoder, backbone: str | os.PathLike[str]) -> None:
    """The backbone reads the kind of item the pair holds: text for a pair whose documents are in
    a payload field, and what the pair's own model reads where its file is on this machine.

    Raises:
        ConfigError: one line naming both kinds.
    """
    reads = encoder.info.modality
    if pair.text_field is not None and reads != "text":
        raise ConfigError(
            f"{os.fspath(backbone)} reads images; pair {pair.name!r} holds text (payload field "
            f"{pair.text_field!r}): give its text backbone, stamped with its tokenizer"
        )
    recorded = Path(pair.encoder.path)
    if recorded.is_file() and recorded.resolve() != Path(backbone).resolve():
        holds = "text" if is_text_graph(recorded) else "image"
        if holds != reads:
            kind = {"image": "images", "text": "text"}
            raise ConfigError(
                f"{os.fspath(backbone)} reads {kind[reads]}; pair {pair.name!r}'s model {recorded} reads "
                f"{kind[holds]}: a fit's backbone reads what the pair's models read"
            )


def resolve_loss_for(loss: str, label_field: str | None) -> str:
    from rm_qdrant_train.fit import resolve_loss

    if label_field is not None:
        check_path(label_field, "--label-field")
    try:
        return resolve_loss(loss, label_field is not None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def labels_for(sample: ProbeSample, label_field: str | None, pair: PairRecord) -> tuple[Any, Any]:
    """The labels that train (``label_field``'s), and those that judge: wherever the payload has
    them, even when they do not train (issue 39)."""
    labels = sample.labels(label_field) if label_field else None
    if label_field and labels is None:
        raise ConfigError(
            f"payload field {label_field!r} is missing on some sampled points, or holds a list, an object or "
            "true/false instead of a class name (a string or a number): no labels to train on"
        )
    judge = (
        labels
        if labels is not None
        else informative(sample.labels(pair.label_field) if pair.label_field else None)
    )
    return labels, judge


def fit_settings(chosen: str, rows: int, *, steps: Any, epochs: Any, lr: Any, batch: Any, seed: int) -> Any:
    from rm_qdrant_train.fit import FitSettings
    from rm_qdrant_train.heads import steps_per_epoch

    defaults = FitSettings()
    chosen_batch = batch or defaults.batch
    return FitSettings(
        loss=chosen,
        steps=epochs * steps_per_epoch(rows, chosen_batch) if epochs else steps or defaults.steps,
        batch=chosen_batch,
        lr=lr or defaults.lr,
        seed=seed,
    )


def train_and_judge(
    sample: ProbeSample,
    labels: Any,
    judge: Any,
    split: tuple[np.ndarray, np.ndarray],
    settings: Any,
    served: dict[str, Any],
    pair: PairRecord,
) -> tuple[Any, tuple[Any, Any, Any], float]:
    """The fitted heads, what judges them (forecasts, the guard's and the labels' verdicts), and
    the training's seconds. The held-out points query the whole sample, as the graph will query
    the whole gallery; labels decide where there are any, else the guard, against the naive merge
    as the pair serves it (calibrated or not)."""
    from rm_qdrant_train.fit import fit_recipe
    from rm_qdrant_train.holdout import judge as judge_heads

    train_idx, held_idx = split

    def rows(values: list[Any] | None, idx: Any) -> list[Any] | None:
        return None if values is None else [values[i] for i in idx]

    started = time.perf_counter()
    try:
        fitted = fit_recipe(
            sample.new[train_idx],
            sample.old[train_idx],
            rows(labels, train_idx),
            settings,
            judge=rows(judge, train_idx),
        )
        trained_s = time.perf_counter() - started
        judged = judge_heads(
            fitted.heads,
            sample.new,
            sample.old,
            judge,
            held=held_idx,
            naive_distance=pair.old_distance,
            **served,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return fitted, judged, trained_s


def attach(
    backbone: str | os.PathLike[str],
    fitted: Any,
    out: str | os.PathLike[str],
    encoder: OnnxEncoder,
    pair: PairRecord,
    chosen: str,
    seed: int,
) -> tuple[Path, float]:
    """The backbone with the heads joined, written to ``out`` and checked against PyTorch."""
    from rm_qdrant_exporters.compose import attach_model
    from rm_qdrant_exporters.serving import ExportError

    try:
        return attach_model(
            os.fspath(backbone),
            fitted.heads,
            os.fspath(out),
            output_name=encoder.info.graph_output(encoder.info.gallery_output()),
            name=f"{Path(backbone).stem}+fit-{chosen}",
            distance=pair.distance,
            fit={"recipe": fitted.recipe, "loss": chosen, "seed": seed},
        )
    except ExportError as exc:
        raise ConfigError(str(exc)) from exc


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
