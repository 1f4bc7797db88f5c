"""Training ψ/ρ for a team's own models from its live gallery: :func:`fit` (``rmq fit``).

A sample of the pair's old collection gives (stored old vector, new backbone embedding) pairs;
heads are trained on them, checked against the naive merge on a held-out part, and joined to the
team's backbone as one graph (outputs ``new`` and ``rev``). The training code (PyTorch, package
``rm_qdrant_train``) is imported when :func:`fit` runs, never with :mod:`rm_qdrant`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.api.common import (
    OnStep,
    check_callback,
    draw_with_steps,
    pair_source,
    sample_line,
    say,
)
from rm_qdrant.api.instead import calibrate_options, instead_text, loss_options
from rm_qdrant.api.training import (
    apply_threads,
    attach,
    check_reads,
    choose_threads,
    fit_settings,
    import_training,
    in_id_order,
    labels_for,
    reproducible,
    resolve_loss_for,
    train_and_judge,
)
from rm_qdrant.core.forecast import ModeForecast, holdout_split
from rm_qdrant.core.guard import GuardVerdict
from rm_qdrant.core.rerank import as_rerank
from rm_qdrant.core.rerank_rows import sample_depth
from rm_qdrant.errors import ConfigError, Refused
from rm_qdrant.evaluation.probe import ProbeSample
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import load_encoder
from rm_qdrant.pair.layouts import count_new
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store

FIT_LOSSES = ("auto", "mcl", "label-free", "rqt", "procrustes")
#: Torch threads when neither ``threads`` nor OMP_NUM_THREADS says: the heads are small (an idle
#: 16-core machine trains them 1.2-1.4x faster on 2 to 4 threads, a busy 2-core one 4-26x
#: slower on 2: benchmarks/results/threads.md), and a fixed count keeps the graph from
#: depending on how busy the machine was (another count sums floats in another order).
FIT_THREADS = 1


@dataclass(frozen=True)
class FitReport:
    """What :func:`fit` trained, how it was judged, and where the graph went (``rmq fit --json``
    is :meth:`as_dict`). A refused fit's report (``Refused.report``) has ``instead`` and no ``out``.

    Attributes:
        pair: the pair's name.
        loss: the loss that ran (``auto`` resolved).
        sample: points embedded (unreadable ones left out).
        sample_key: a digest of the sample: the same key, seed, threads and baseline give the
            same verdict.
        judged_on: what the verdict was judged on, in one line.
        unreadable: sampled points whose image (or document) could not be read.
        trained_on: pairs the heads were trained on.
        held_out: points held out to judge them.
        train_seconds: the training's time.
        learned_rho: whether ρ was learned (then the graph's ``new`` differs from the vectors
            already in new: serve it in a new pair, not by :func:`switch_encoder`).
        k: neighbours compared.
        seed: of the sample, the split and the training.
        threads: PyTorch's threads.
        forecasts: the naive and the fitted curves on the held-out points.
        better_than_naive: the verdict.
        measure: why, in one clause.
        decided_by: ``labels`` or ``guard``.
        labels_from: the payload field whose labels judged (None: no labels).
        guard: the label-free guard's verdict (None: labels decided).
        labelled: the labelled guard's verdict (None: no labels).
        recipe: the recipe that made the heads (label-free: the winning candidate).
        selection: ``winner``, ``why`` and every candidate's evidence (label-free).
        instead: a refused fit's alternatives, cheapest first: ``option``, ``passes``, ``why``.
        out: the graph written (None: refused).
        parity: ONNX Runtime against PyTorch on the written graph.
        seconds: the time in all.
        new_holds_points: whether the pair's new half held points when the graph was written.
        rerank: the re-rank both sides of every comparison were scored with (``rmq fit
            --rerank K``; None: the plain merges), and ``rerank_depth``, its depth on the sample.
    """

    pair: str
    loss: str
    sample: int
    sample_key: str
    judged_on: str
    unreadable: int
    trained_on: int
    held_out: int
    train_seconds: float
    learned_rho: bool
    k: int
    seed: int
    threads: int
    forecasts: tuple[ModeForecast, ...]
    better_than_naive: bool
    measure: str
    decided_by: str
    labels_from: str | None
    guard: GuardVerdict | None
    labelled: GuardVerdict | None
    recipe: str
    selection: dict[str, Any]
    instead: tuple[dict[str, Any], ...] | None = None
    out: str | None = None
    parity: float | None = None
    seconds: float | None = None
    new_holds_points: bool = False
    rerank: int | None = None
    rerank_depth: int | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "pair": self.pair,
            "loss": self.loss,
            "sample": self.sample,
            "sample_key": self.sample_key,
            "judged_on": self.judged_on,
            "unreadable": self.unreadable,
            "trained_on": self.trained_on,
            "held_out": self.held_out,
            "train_seconds": self.train_seconds,
            "learned_rho": self.learned_rho,
            "k": self.k,
            "seed": self.seed,
            "threads": self.threads,
            "forecasts": [f.as_dict() for f in self.forecasts],
            "better_than_naive": self.better_than_naive,
            "measure": self.measure,
            "decided_by": self.decided_by,
            "labels_from": self.labels_from,
            "guard": None if self.guard is None else self.guard.as_dict(),
            "labelled": None if self.labelled is None else self.labelled.as_dict(),
            "recipe": self.recipe,
            **self.selection,
            "rerank": self.rerank,
            "rerank_depth": self.rerank_depth,
        }
        if self.instead is not None:
            data["instead"] = list(self.instead)
        if self.out is not None:
            data.update(out=self.out, parity=self.parity, seconds=self.seconds)
        return data


def fit(
    store: Store,
    name: str,
    *,
    backbone: str | os.PathLike[str],
    out: str | os.PathLike[str],
    sample: int = 20000,
    holdout: float = 0.1,
    k: int = 10,
    seed: int = 0,
    label_field: str | None = None,
    loss: str = "auto",
    steps: int | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    batch: int | None = None,
    force: bool = False,
    threads: int | None = None,
    source: SourceConfig | None = None,
    on_step: OnStep | None = None,
    rerank: int | None = None,
) -> FitReport:
    """Train ψ (and ρ) on pairs from the gallery, stored old vectors against the backbone's
    embeddings, and write the graph: ``rmq fit`` (needs PyTorch: ``pip install 'rm-qdrant[train,export]'``).

    No old model is needed, and no labels unless ``label_field``. Part of the sample is held out.
    Without labels the graph is written only if, at every backfill fraction t, its hits are as
    near in both models' rankings as the naive merge's, within two standard errors; with labels,
    if its area under mAP beats the naive merge's. Otherwise (unless ``force``) nothing is written
    and :class:`Refused` is raised, its ``report`` naming what would pass instead. The same seed,
    gallery, backbone and thread count give the same graph.

    A text pair's documents are read as the pair reads them (its text field, or URIs) and
    tokenised as the backbone's stamp says; the graph written reads text the same way, with the
    backbone's pooling inside it.

    Args:
        backbone: the team's new model (.onnx), described by ``rmq model stamp``.
        out: where the fitted graph goes (its folder must exist).
        sample: points to sample (at least 8).
        holdout: the share of the sample kept out of the fit, in (0, 0.5].
        k: neighbours compared.
        seed: of the sample, the split and the training.
        label_field: payload field with a class label (``meta.dept``: nested): trains MCL + ρ.
        loss: ``auto`` (mcl with labels, else label-free), ``mcl``, ``label-free``, ``rqt`` or
            ``procrustes`` (the last two fit ψ alone; procrustes in closed form, in seconds).
        steps: optimizer steps (default 2000).
        epochs: or passes over the training part of the sample.
        lr: Adam's learning rate (default 1e-3).
        batch: pairs per step (default 256).
        force: write the graph even when it forecasts worse than the naive merge.
        threads: PyTorch's threads (default: OMP_NUM_THREADS, else 1); set for the process.
        source: how images (and a text pair's documents at URIs) are fetched (default: the
            settings the pair recorded).
        on_step: told of each image or document embedded, and of what is being trained
            (:class:`Step`).
        rerank: judge as pairs serving ``rerank=K`` would serve: both sides of every comparison
            (the guard's, the labels', the forecasts') re-rank their merged first K by their own
            new model (the naive merge's by the backbone, the graph's by its ``new`` output);
            on the sample, the same share of the items (``rerank_depth``). None: the plain merges.

    Raises:
        Refused: the fitted graph forecasts worse than the naive merge (nothing written).
        ConfigError: a bad option, a backbone that does not fit the pair, a pair that is not
            backfilling, missing labels; PyTorch is not installed.
        CollectionNotFound: no pair of that name.

    Example:
        >>> report = rm_qdrant.fit(store, "photos", backbone="new.onnx", out="fitted.onnx",
        ...                        loss="procrustes", sample=5000)  # doctest: +SKIP
        >>> rm_qdrant.switch_encoder(store, "photos", report.out)  # doctest: +SKIP
    """
    _check_options(sample, holdout, k, seed, loss, steps, epochs, lr, batch, on_step)
    as_rerank(rerank)  # K checked before anything is read
    choice = choose_threads(threads, default=FIT_THREADS)  # before torch loads: it reads OMP_NUM_THREADS
    # ONNX Runtime embeds the sample (byte-identical on 1 and 2 threads, a ResNet-18 measured):
    # one thread per idle core.
    onnx_threads = choose_threads(threads).threads
    import_training()
    used = apply_threads(choice)
    _check_out(backbone, out)
    pair, encoder = _backbone_for(store, name, backbone, onnx_threads)
    chosen = resolve_loss_for(loss, label_field)
    images = pair_source(pair, source)
    embedding = {"seed": seed, "source": images, "on_step": on_step, "label": "embedding the sample"}
    drawn = in_id_order(draw_with_steps(store, pair, encoder, sample, **embedding))
    labels, judge = labels_for(drawn, label_field, pair)
    try:
        train_idx, held_idx = holdout_split(len(drawn.ids), holdout, seed, k=k)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    settings = fit_settings(chosen, len(train_idx), steps=steps, epochs=epochs, lr=lr, batch=batch, seed=seed)
    say(on_step, f"training {chosen} on {len(train_idx)} pairs ({len(held_idx)} held out)...")
    say(on_step, reproducible(used.threads, used.reason))
    started = time.perf_counter()
    served = {
        "k": k,
        "seed": seed,
        "metric": pair.distance,  # as the pair will serve the graph
        "unit": encoder.info.derived_scale(pair.distance) == "unit",
    }
    depth = None if rerank is None else sample_depth(rerank, len(drawn.ids), drawn.gallery)
    if depth is not None:  # only then: a judge from before the re-rank takes the rest as it was
        served["rerank"] = depth
    split = (train_idx, held_idx)
    fitted, judged, trained_s = train_and_judge(drawn, labels, judge, split, settings, served, pair)
    labels_from = None if judge is None else label_field or pair.label_field
    report = _report(
        name, chosen, drawn, pair, judged, fitted, (used.threads, labels_from), split, trained_s, k, seed
    )
    report = dataclasses.replace(report, rerank=rerank, rerank_depth=depth)
    if not report.better_than_naive and not force:
        # What the guard would take instead, cheapest first, on the same split (issue 38).
        rows = (drawn.old[train_idx], drawn.new[train_idx]), (drawn.old[held_idx], drawn.new[held_idx])
        sides = (drawn.old, drawn.new, train_idx, held_idx)
        instead = (
            *calibrate_options(pair, encoder, rows, k=k, seed=seed),
            *loss_options(chosen, sides, labels, judge, settings, served, pair),
        )
        raise _refusal(dataclasses.replace(report, instead=instead), out)
    path, parity = attach(backbone, fitted, out, encoder, pair, chosen, seed)
    return dataclasses.replace(
        report,
        out=str(path),
        parity=parity,
        seconds=round(time.perf_counter() - started, 1),
        new_holds_points=count_new(store, pair) > 0,
    )


def _check_options(sample: int, holdout: float, k: int, seed: int, loss: str, *optional: Any) -> None:
    """The checks ``rmq fit``'s options make, for a Python caller."""
    for value, what, low in ((sample, "sample", 8), (k, "k", 1), (seed, "seed", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{what} is a whole number >= {low}, got {value!r}")
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout <= 0.5:
        raise ConfigError(f"holdout is a share of the sample in (0, 0.5], got {holdout!r}")
    if loss not in FIT_LOSSES:
        raise ConfigError(f"loss is one of {', '.join(FIT_LOSSES)}, not {loss!r}")
    steps, epochs, lr, batch, on_step = optional
    for value, what, low in ((steps, "steps", 1), (epochs, "epochs", 1), (batch, "batch", 2)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ConfigError(f"{what} is a whole number >= {low} (or None), got {value!r}")
    if lr is not None and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < float("inf")
    ):
        raise ConfigError(f"lr is a finite number > 0 (or None), got {lr!r}")
    check_callback(on_step, "on_step", "one Step")


def _check_out(backbone: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    target = Path(out)
    if target.resolve() == Path(backbone).resolve():
        raise ConfigError("--out is the backbone itself: write the fitted graph to another file")
    if not target.parent.is_dir():
        raise ConfigError(f"cannot write {os.fspath(out)}: folder {target.parent} does not exist")


def _backbone_for(
    store: Store, name: str, backbone: str | os.PathLike[str], threads: int
) -> tuple[PairRecord, OnnxEncoder]:
    """The pair, and the backbone checked against it: plain (no heads), the new half's size."""
    pair = load_pair(store, name)
    if pair.state != "backfilling":
        raise ConfigError(f"pair {name!r} is {pair.state}: there is no backfill left to fit heads for")
    encoder = load_encoder(backbone, threads=threads, decode=pair.decode)
    check_reads(pair, encoder, backbone)
    if "rev" in encoder.info.outputs:
        raise ConfigError(
            f"{os.fspath(backbone)} already has heads (a 'rev' output): give the plain backbone"
        )
    role = encoder.info.gallery_output()
    new_dim = store.collection(pair.new_collection, pair.new_using).dim
    if encoder.info.outputs[role] != new_dim:
        raise ConfigError(
            f"{os.fspath(backbone)} gives {encoder.info.outputs[role]}-d embeddings ({role!r}); "
            f"pair {name!r}'s new collection holds {new_dim}-d vectors"
        )
    return pair, encoder


def _report(
    name: str,
    chosen: str,
    sample: ProbeSample,
    pair: PairRecord,
    judged: tuple[Any, Any, Any],
    fitted: Any,
    run: tuple[int, str | None],
    split: tuple[np.ndarray, np.ndarray],
    trained_s: float,
    k: int,
    seed: int,
) -> FitReport:
    """The report of a fit (``run``: its thread count, and the payload field whose labels judged)."""
    from rm_qdrant_train.holdout import decide

    (threads, labels_from), (forecasts, verdict, labelled) = run, judged
    ok, measure = decide(forecasts, verdict, labelled)
    return FitReport(
        pair=name,
        loss=chosen,
        sample=len(sample.ids),
        sample_key=sample.key,  # the same key, seed, threads and baseline: the same verdict
        judged_on=sample_line(
            sample, seed, "the calibrated naive merge" if pair.old_distance else "the plain naive merge"
        ),
        unreadable=sample.failed,
        trained_on=len(split[0]),
        held_out=len(split[1]),
        train_seconds=round(trained_s, 1),
        learned_rho=bool(fitted.heads.learn_rho),
        k=k,
        seed=seed,
        threads=threads,
        forecasts=tuple(forecasts),
        better_than_naive=ok,
        measure=measure,
        decided_by="labels" if verdict is None else "guard",
        labels_from=labels_from,
        guard=verdict,
        labelled=labelled,
        recipe=fitted.recipe,
        selection=fitted.selection.as_dict()
        if fitted.selection
        else {"winner": fitted.recipe, "candidates": []},
    )


def _refusal(report: FitReport, out: str | os.PathLike[str]) -> Refused:
    """The one-line refusal of a fit worse than the naive merge, with its report."""
    labelled, verdict = report.labelled, report.guard
    refused_by = labelled if labelled is not None and not labelled.passed else verdict
    worse = (
        f"forecasts worse than the naive merge ({report.measure})"
        if refused_by is None or refused_by.passed
        else f"is refused by the {'labels' if refused_by is labelled else 'guard'}: {report.measure}"
    )
    return Refused(
        f"on the {report.held_out} held-out points the fitted graph ({report.loss}) {worse}; "
        f"the naive merge is kept, not written to {os.fspath(out)} "
        "(try another --loss, a larger --sample, or --force); " + instead_text(list(report.instead or ())),
        measured=verdict,
        report=report,
    )
