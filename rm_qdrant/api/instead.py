"""What a refused :func:`~rm_qdrant.api.fitting.fit` (``rmq fit``) would have had pass instead,
cheapest first (issue 38: one voice).

Without training anything for minutes: each map ``rmq calibrate`` knows (where the pair is
naive and serves the backbone, so calibrate's sample is the same), then each closed-form
loss; each is fitted on the refused fit's training part and judged on its held-out part
the way its own command judges it, so a refusal names the option that passes, if one does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rm_qdrant.core.calibration_check import CHEAPEST_FIRST, judge_map
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import PairRecord

Split = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]  # (old, new) fit, held

#: Losses a refusal tries instead (closed form, seconds); the others train for minutes.
CHEAP_LOSSES = ("procrustes",)


def calibrate_options(
    pair: PairRecord, encoder: OnnxEncoder, split: Split, *, k: int, seed: int
) -> list[dict]:
    """Each map ``rmq calibrate`` knows, cheapest first, fitted and judged on ``split`` as it
    would judge it: where the pair is naive and its encoder is the backbone (calibrate's sample)."""
    if pair.mode != "naive" or pair.encoder.fingerprint != encoder.fingerprint:
        return []
    (fit_old, fit_new), held = split
    order = np.random.default_rng(seed).permutation(len(held[0]))
    found = []
    for method in CHEAPEST_FIRST:
        try:
            j = judge_map(
                method,
                (fit_old, fit_new),
                held,
                order=order,
                k=k,
                metric=pair.distance,
                seed=seed,
                in_use=pair.old_distance,
            )
        except ValueError as exc:  # a sample no map fits (all distances equal): reported, not raised
            found.append({"option": f"rmq calibrate --map {method}", "passes": False, "why": str(exc)})
            continue
        why = j.refused or None
        found.append({"option": f"rmq calibrate --map {j.method}", "passes": j.kept, "why": why})
    return found


def loss_options(
    chosen: str,
    sample: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    labels: Any,
    judging: Any,
    settings: Any,
    served: dict,
    pair: PairRecord,
) -> list[dict]:
    """Each cheap loss (:data:`CHEAP_LOSSES`) but ``chosen``, fitted on the refused fit's training
    rows and decided as ``rmq fit`` decides: ``sample`` is (old, new, train rows, held rows);
    ``labels`` train (one per row, or None), ``judging`` labels judge (the payload's, or None)."""
    from rm_qdrant_train.fit import fit_recipe
    from rm_qdrant_train.holdout import decide, judge

    old, new, train_idx, held_idx = sample
    train_labels = None if labels is None else [labels[i] for i in train_idx]
    found = []
    for loss in (c for c in CHEAP_LOSSES if c != chosen):
        try:
            recipe = dataclasses.replace(settings, loss=loss)
            heads = fit_recipe(new[train_idx], old[train_idx], train_labels, recipe).heads
            verdicts = judge(
                heads, new, old, judging, held=held_idx, naive_distance=pair.old_distance, **served
            )
        except ValueError as exc:  # diverged: reported, not raised
            found.append({"option": f"rmq fit --loss {loss}", "passes": False, "why": str(exc)})
            continue
        ok, measure = decide(*verdicts)
        found.append({"option": f"rmq fit --loss {loss}", "passes": ok, "why": None if ok else measure})
    return found


def instead_text(options: list[dict]) -> str:
    """The first option that passes, then each one tried, in the order tried."""
    passing = next((o["option"] for o in options if o["passes"]), None)
    head = f"{passing} would pass" if passing else "nothing cheaper would pass"
    tried = "; ".join(f"{o['option']}: " + ("passes" if o["passes"] else "refused") for o in options)
    return head + (
        f" (tried on the same held-out points, cheapest first: {tried}; other losses train for minutes)"
        if tried
        else ""
    )
