"""``rmq fit``: ψ (and ρ) for a team's own models, trained on pairs read from its live gallery.

The old collection already stores φ_old(x) for every point, and the team's new ONNX
backbone gives φ_new(x) for the same image, so a sample of the gallery is a set of
(φ_new, φ_old) pairs: no old model and, by default, no labels. What is trained on them:

- ``mcl``: the paper's MCL with a learned ρ; needs labels (``--label-field``).
- ``label-free``: without labels (:mod:`rm_qdrant_train.label_free`).
- ``rqt``: ψ alone, regressed onto the stored old vector (ρ the identity).
- ``procrustes``: ψ a (semi-)orthogonal map in closed form (ρ the identity).

``auto`` is ``mcl`` with labels, else ``label-free``. Part of the sample is held out;
:func:`rm_qdrant_train.holdout.holdout_forecast` compares the fitted heads with the naive merge on it.

The losses compare directions only, so the fitted heads are scaled afterwards
(:func:`match_norms`): ψ's output to the stored old vectors (least squares), a learned
ρ's to the backbone's. A graph for a Euclid or dot collection, whose vectors are raw,
then queries old in its own space; a cosine graph L2-normalises them anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rm_qdrant.core.forecast import label_codes
from rm_qdrant_train.heads import Heads, procrustes_heads, run_steps
from rm_qdrant_train.label_free import Selection, select_label_free
from rm_qdrant_train.losses import contrastive_loss, rqt_loss

log = logging.getLogger(__name__)

LOSSES = ("auto", "mcl", "label-free", "rqt", "procrustes")
#: Losses that need a label per sampled point.
LABELLED = ("mcl",)


@dataclass(frozen=True)
class FitSettings:
    """How ``rmq fit`` trains: loss, steps, batch, lr and seed are CLI options; τ is the trainer's 0.1."""

    loss: str = "auto"
    steps: int = 2000  # Adam steps (the label-free recipe sizes its own)
    batch: int = 256
    lr: float = 1e-3
    temperature: float = 0.1
    seed: int = 0


def resolve_loss(loss: str, labelled: bool) -> str:
    """The loss that will run: ``auto`` chosen by whether there are labels.

    Raises:
        ValueError: an unknown loss, or one that needs labels without them.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    if loss == "auto":
        return "mcl" if labelled else "label-free"
    if loss in LABELLED and not labelled:
        raise ValueError(f"--loss {loss} needs labels: give --label-field FIELD, or use --loss label-free")
    return loss


@dataclass(frozen=True)
class Fitted:
    """Trained heads, the recipe that made them (the loss; for label-free, the candidate that won)
    and, for label-free, every candidate's holdout evidence."""

    heads: Heads
    recipe: str
    selection: Selection | None = None


def fit_heads(
    phi_new: np.ndarray, old: np.ndarray, labels: Sequence[object] | None, settings: FitSettings
) -> Heads:
    """Train the heads ``settings.loss`` names on paired embeddings (rows of the same images).

    Raises:
        ValueError: a loss that needs labels without them, or unusable rows.
    """
    return fit_recipe(phi_new, old, labels, settings).heads


def fit_recipe(
    phi_new: np.ndarray,
    old: np.ndarray,
    labels: Sequence[object] | None,
    settings: FitSettings,
    *,
    judge: Sequence[object] | None = None,
) -> Fitted:
    """:func:`fit_heads`, with the recipe that won and its evidence. ``judge``: labels that do not
    train but judge the label-free candidates (a pair's label field); ``labels`` judge them too
    when ``--loss label-free`` is asked for with labels.

    Raises:
        ValueError: a loss that needs labels without them, or unusable rows.
    """
    loss = resolve_loss(settings.loss, labels is not None)
    torch.manual_seed(settings.seed)
    x, y = (
        torch.from_numpy(np.ascontiguousarray(phi_new, np.float32)),
        torch.from_numpy(np.ascontiguousarray(old, np.float32)),
    )
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError("the sampled embeddings hold NaN or infinity")
    if loss == "procrustes":
        return Fitted(match_norms(procrustes_heads(x, y), x, y), loss)
    if loss == "label-free":
        heads, selection = select_label_free(
            x, y, seed=settings.seed, labels=labels if labels is not None else judge
        )
        return Fitted(match_norms(heads, x, y), f"label-free/{selection.winner}", selection)
    heads = Heads(x.shape[1], y.shape[1], learn_rho=loss == "mcl")
    if loss == "rqt":

        def step_loss(idx: Tensor) -> Tensor:
            _, rev = heads(x[idx])
            return rqt_loss(rev, y[idx])

    else:
        target = torch.from_numpy(label_codes(labels))

        def step_loss(idx: Tensor) -> Tensor:
            new, rev = heads(x[idx])
            return contrastive_loss("mcl", rev, y[idx], new, target[idx], temperature=settings.temperature)

    run_steps(
        heads,
        step_loss,
        len(x),
        steps=settings.steps,
        batch=settings.batch,
        lr=settings.lr,
        seed=settings.seed,
        what=f"fit {loss}",
    )
    return Fitted(match_norms(heads, x, y), loss)


@torch.no_grad()
def match_norms(heads: Heads, phi_new: Tensor, old: Tensor) -> Heads:
    """Scale the heads' outputs into the spaces of the vectors they stand for; directions unchanged.

    A learned ρ's output gets the backbone's mean norm (ψ's first layer takes the inverse
    factor, so ψ's output is unchanged by it); ψ's output gets the factor that brings it
    closest to the stored old vectors, ``Σ⟨rev, old⟩ / Σ‖rev‖²``, when that is positive
    and finite (otherwise training failed, and the holdout says so).
    """
    heads.eval()
    if heads.learn_rho:
        factor = phi_new.norm(dim=1).mean() / heads.rho(phi_new).norm(dim=1).mean().clamp_min(1e-12)
        if torch.isfinite(factor) and factor > 0:
            _scale_linear(heads.rho[-1], factor)
            heads.psi[0].weight.div_(factor)
    _, rev = heads(phi_new)
    factor = (rev * old).sum() / (rev * rev).sum().clamp_min(1e-12)
    if torch.isfinite(factor) and factor > 0:
        _scale_linear(heads.psi[-1], factor)
    log.info("fitted heads scaled to the stored vectors: ψ × %.4g", float(factor))
    return heads


def _scale_linear(layer: torch.nn.Module, factor: Tensor) -> None:
    layer.weight.mul_(factor)
    if layer.bias is not None:
        layer.bias.mul_(factor)
