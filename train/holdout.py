"""Judging fitted heads on held-out pairs: their served outputs, and the forecast against naive."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rm_qdrant.core.forecast import ModeForecast, OldDistance, compare_fitted
from rm_qdrant.core.guard import GuardVerdict, labelled_guard, labelled_verdict, rank_guard
from rm_qdrant.core.metrics import area
from rm_qdrant.core.rerank_rows import sample_depth
from rm_qdrant_train.heads import Heads


@torch.no_grad()
def apply_heads(heads: Heads, phi_new: np.ndarray, *, unit: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The fitted encoder's ``new`` and ``rev`` for embeddings φ_new, as served: of unit length
    when the exported graph normalises them (``unit``), else as the heads give them.

    Raises:
        ValueError: the heads give NaN or infinity (training diverged).
    """
    new, rev = heads.eval()(torch.from_numpy(np.ascontiguousarray(phi_new, np.float32)))
    if not (torch.isfinite(new).all() and torch.isfinite(rev).all()):
        raise ValueError("training diverged: the heads give NaN or infinity (lower --lr); nothing written")
    if unit:
        new, rev = F.normalize(new, dim=1), F.normalize(rev, dim=1)
    return new.numpy(), rev.numpy()


def holdout_forecast(
    heads: Heads,
    phi_new: np.ndarray,
    old: np.ndarray,
    labels: Sequence[object] | None,
    *,
    held: np.ndarray | None = None,
    k: int = 10,
    seed: int = 0,
    metric: str = "cosine",
    unit: bool = True,
    naive_distance: OldDistance | None = None,
    rerank: int | None = None,
) -> list[ModeForecast]:
    """The naive merge and the fitted heads, backfilled in a random order, under the collection's
    ``metric`` with the fitted outputs as served (``unit``: normalised): the ``held`` rows (a
    holdout no head trained on) query every row, as the graph will query the whole gallery
    (None: every row queries the rest). ``labels``: one per row, or None. ``rerank``: both merges
    re-rank their first ``rerank`` by their own new model (``rmq fit --rerank``)."""
    new, rev = apply_heads(heads, phi_new, unit=unit)
    order = np.random.default_rng(seed).permutation(len(old))
    return compare_fitted(
        old,
        phi_new,
        new,
        rev,
        order=order,
        labels=labels,
        k=k,
        metric=metric,
        queries=held,
        naive_distance=naive_distance,
        rerank=rerank,
    )


def holdout_guard(
    heads: Heads,
    phi_new: np.ndarray,
    old: np.ndarray,
    *,
    held: np.ndarray | None = None,
    k: int = 10,
    seed: int = 0,
    metric: str = "cosine",
    unit: bool = True,
    naive_distance: OldDistance | None = None,
    rerank: int | None = None,
) -> GuardVerdict:
    """The label-free guard (:func:`rm_qdrant.core.guard.rank_guard`): the ``held`` rows query
    every row, backfilled in the order :func:`holdout_forecast` uses; ``naive_distance``: a
    calibrated pair's map of old distances."""
    new, rev = apply_heads(heads, phi_new, unit=unit)
    order = np.random.default_rng(seed).permutation(len(old))
    queries = np.arange(len(old)) if held is None else held
    return rank_guard(
        old,
        phi_new,
        new,
        rev,
        order=order,
        queries=queries,
        k=k,
        metric=metric,
        naive_distance=naive_distance,
        rerank=rerank,
    )


def holdout_labelled(
    heads: Heads,
    phi_new: np.ndarray,
    old: np.ndarray,
    labels: Sequence[object],
    *,
    held: np.ndarray | None = None,
    seed: int = 0,
    metric: str = "cosine",
    unit: bool = True,
    naive_distance: OldDistance | None = None,
    rerank: int | None = None,
) -> GuardVerdict:
    """The labelled guard (:func:`rm_qdrant.core.guard.labelled_guard`, mAP by payload labels at
    every t): the ``held`` rows query every row, backfilled in the order :func:`holdout_forecast` uses."""
    new, rev = apply_heads(heads, phi_new, unit=unit)
    order = np.random.default_rng(seed).permutation(len(old))
    return labelled_guard(
        old,
        phi_new,
        new,
        rev,
        labels,
        order=order,
        queries=held,
        metric=metric,
        naive_distance=naive_distance,
        rerank=rerank,
    )


def judge(
    heads: Heads,
    phi_new: np.ndarray,
    old: np.ndarray,
    labels: Sequence[object] | None,
    *,
    held: np.ndarray | None = None,
    k: int = 10,
    seed: int = 0,
    metric: str = "cosine",
    unit: bool = True,
    naive_distance: OldDistance | None = None,
    rerank: int | None = None,
) -> tuple[list[ModeForecast], GuardVerdict | None, GuardVerdict | None]:
    """Everything ``rmq fit`` decides on for fitted heads, for :func:`decide`: the forecasts, the
    label-free guard's verdict (without labels) and the labelled guard's (with them: labels decide
    wherever there are any, issue 39). The guards and the labelled forecast have the ``held`` rows
    query every row; the label-free forecast (recall@k of the new model's own top k) keeps to the
    held rows among themselves, where a top k is as coarse as a gallery's top k·n/n_held and ranks
    recipes as they serve (``benchmarks/results/label-free-signals.md``). ``rerank``: every side
    of every comparison re-ranks its merged first ``rerank`` of the sample by its own new model
    (the held rows among themselves: the same share of their fewer rows)."""
    served = {"held": held, "seed": seed, "metric": metric, "unit": unit, "naive_distance": naive_distance}
    served["rerank"] = rerank
    if labels is not None:  # the labelled forecast's per-query APs are what the labels judge by
        forecasts = holdout_forecast(heads, phi_new, old, labels, k=k, **served)
        return forecasts, None, labelled_verdict(*forecasts)
    # The label-free forecast: the holdout among itself, against the plain merge (as until now).
    rows = slice(None) if held is None else held
    among = rerank if rerank is None or held is None else sample_depth(rerank, len(held), len(old))
    forecasts = holdout_forecast(
        heads, phi_new[rows], old[rows], None, k=k, seed=seed, metric=metric, unit=unit, rerank=among
    )
    return forecasts, holdout_guard(heads, phi_new, old, k=k, **served), None


def decide(
    forecasts: Sequence[ModeForecast], verdict: GuardVerdict | None, labelled: GuardVerdict | None = None
) -> tuple[bool, str]:
    """Whether to write the fitted graph, and why in one clause: with labels (mAP in the
    forecasts) the ``labelled`` guard refuses a graph below the naive merge at any t, then
    :func:`better` decides; without, the label-free guard's ``verdict`` (recall of the new
    model's own top k, held-out queries against the whole sample, at every t), and then
    :func:`better` too."""
    if labelled is not None and not labelled.passed:
        return False, labelled.reason()
    if verdict is None or forecasts[0].maps is not None:
        return better(forecasts)
    if not verdict.passed:
        return False, verdict.reason()
    ahead, measure = better(forecasts)
    return ahead, verdict.reason() if ahead else f"it passes the guard, but its {measure} is not ahead"


def better(forecasts: Sequence[ModeForecast]) -> tuple[bool, str]:
    """Whether the fitted curve beats the naive one on the holdout, and the measure used.

    With labels the area under mAP decides; without, the area under recall@k against
    the new model's own neighbours. A tie is not better.
    """
    naive, fitted = forecasts
    if naive.maps is not None and fitted.maps is not None:
        a_naive, a_fitted = (area(f.maps or (), f.fractions) for f in (naive, fitted))
        return a_fitted > a_naive, f"area under mAP {a_fitted:.3f} (naive {a_naive:.3f})"
    return fitted.area > naive.area, f"area under recall {fitted.area:.3f} (naive {naive.area:.3f})"
