"""The learnable new head ρ and the reverse query transform ψ, trained on cached embeddings.

Both are small MLPs: ``blocks − 1`` blocks of Linear → BatchNorm → ReLU, then a
Linear. ρ maps φ_new's embedding to the new gallery/query embedding (or is the
identity); ψ maps ρ's output into the old space. The backbones stay frozen, so
one epoch over CIFAR-10's 50,000 training images is a few seconds on a CPU.
Training is sized in optimizer steps (:func:`run_steps`), so a small data set is
not under-trained.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rm_qdrant_train.adapters import procrustes
from rm_qdrant_train.backbone import pick_device
from rm_qdrant_train.cache import as_tensors, embeddings, file_hash
from rm_qdrant_train.checkpoints import build, description, load_checkpoint, plain_config, save_checkpoint
from rm_qdrant_train.config import HeadsConfig, heads_steps, rho_is_learned
from rm_qdrant_train.data import batches
from rm_qdrant_train.losses import LOSSES, contrastive_loss, rqt_loss

log = logging.getLogger(__name__)


def mlp(d_in: int, d_out: int, *, blocks: int, hidden: int) -> nn.Module:
    """``blocks`` layers: Linear → BatchNorm → ReLU repeated, the last a Linear only."""
    if not 1 <= blocks <= 5:
        raise ValueError(f"blocks must be 1 to 5, got {blocks}")
    layers: list[nn.Module] = []
    width = d_in
    for _ in range(blocks - 1):
        layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True)]
        width = hidden
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


class Heads(nn.Module):
    """ρ and ψ together: ``forward(φ_new) -> (new, rev)``."""

    def __init__(
        self,
        d_new: int,
        d_old: int,
        *,
        learn_rho: bool = True,
        rho_blocks: int = 2,
        psi_blocks: int = 2,
        hidden: int = 512,
    ) -> None:
        super().__init__()
        self.d_new, self.d_old, self.learn_rho = d_new, d_old, learn_rho
        self.rho = mlp(d_new, d_new, blocks=rho_blocks, hidden=hidden) if learn_rho else nn.Identity()
        self.psi = mlp(d_new, d_old, blocks=psi_blocks, hidden=hidden)

    def forward(self, phi_new: Tensor) -> tuple[Tensor, Tensor]:
        new = self.rho(phi_new)
        return new, self.psi(new)


def procrustes_heads(phi_new: Tensor, old: Tensor) -> Heads:
    """ρ the identity, ψ the orthogonal Procrustes map between the unit-length embeddings."""
    heads = Heads(phi_new.shape[1], old.shape[1], learn_rho=False, psi_blocks=1)
    weight = procrustes(F.normalize(phi_new, dim=1), F.normalize(old, dim=1))
    with torch.no_grad():
        heads.psi[0].weight.copy_(weight.T)
        heads.psi[0].bias.zero_()
    return heads.eval()


def heads_loss(cfg: HeadsConfig, new: Tensor, rev: Tensor, old: Tensor, labels: Tensor) -> Tensor:
    """The configured loss for one batch."""
    if cfg.loss == "rqt":
        return rqt_loss(rev, old, metric=cfg.rqt_metric)
    loss = contrastive_loss(
        cfg.loss, rev, old, new, labels, temperature=cfg.temperature, hard_mining=cfg.hard_mining
    )
    if cfg.rqt_weight:
        loss = loss + cfg.rqt_weight * rqt_loss(rev, old, metric=cfg.rqt_metric)
    return loss


def run_steps(
    model: nn.Module,
    step_loss: Callable[[Tensor], Tensor],
    n_rows: int,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int = 0,
    what: str = "heads",
) -> list[float]:
    """Train ``model`` for exactly ``steps`` Adam steps on shuffled batches of ``n_rows`` rows.

    Each pass over the rows is a fresh seeded shuffle cut into batches of ``batch``; a
    batch of fewer than 2 rows (BatchNorm needs two) is skipped and not counted. The
    learning rate starts at ``lr`` and decays to 0 along a cosine over the steps, so the
    schedule is the same length whatever the data set's size. Progress (step, loss) is
    logged at INFO about ten times, prefixed by ``what``.

    Args:
        model: put in train mode; its parameters are the ones optimised.
        step_loss: the scalar loss of one batch, given the batch's row indices (a 1-d
            int64 CPU tensor); it moves the rows it needs to the model's device.
        n_rows: how many rows the indices are drawn from (at least 2).

    Returns:
        The loss of every step, in order (``steps`` values).

    Example:
        >>> history = run_steps(model, lambda idx: loss_fn(model(x[idx]), y[idx]), len(x),
        ...                     steps=3000, batch=256, lr=1e-3)
    """
    if n_rows < 2:
        raise ValueError(f"{what}: need at least 2 training rows, got {n_rows}")
    if steps < 1 or batch < 2 or not 0 < lr < math.inf:
        raise ValueError(f"{what}: need steps ≥ 1, batch ≥ 2 and lr > 0, got {steps}, {batch}, {lr}")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    generator = torch.Generator().manual_seed(seed)
    every = max(1, steps // 10)
    losses: list[Tensor] = []
    started = time.perf_counter()
    model.train()
    while len(losses) < steps:
        for idx in batches(n_rows, batch, shuffle=True, generator=generator):
            if len(idx) < 2:
                continue
            loss = step_loss(idx)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.detach())
            if len(losses) % every == 0 or len(losses) == steps:
                recent = torch.stack(losses[-every:]).mean().item()
                log.info("%s step %d/%d loss %.4f", what, len(losses), steps, recent)
            if len(losses) == steps:
                break
    log.info("trained %s: %d steps in %.1f s", what, steps, time.perf_counter() - started)
    return torch.stack(losses).float().cpu().tolist()


def steps_per_epoch(n_rows: int, batch: int) -> int:
    """Optimizer steps in one pass over ``n_rows`` rows (a last batch of one row is skipped)."""
    full, rest = divmod(n_rows, batch)
    return max(1, full + (rest >= 2))


def train_heads(cfg: HeadsConfig) -> tuple[Path, list[float]]:
    """Train ψ (and ρ) on the new model's training images; returns (checkpoint, loss history).

    The run lasts ``cfg.steps`` optimizer steps, or ``cfg.epochs`` passes over the images
    when that is set (:func:`rm_qdrant_train.config.heads_steps`). The history is the mean loss of
    each tenth of the run (the windows the progress log shows), or of each epoch when
    ``cfg.epochs`` is set.
    """
    if cfg.loss not in LOSSES:
        raise ValueError(f"unknown loss {cfg.loss!r}; expected one of {', '.join(LOSSES)}")
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    folder = Path(cfg.data) / "train"
    old, new = embeddings(cfg.old, folder, device=cfg.device), embeddings(cfg.new, folder, device=cfg.device)
    # Train on the images of the classes the new model knows (all of them in the extended setting).
    keep = new.known()
    phi_new, phi_old, labels = as_tensors(new.emb[keep], old.emb[keep], new.labels[keep])
    model = Heads(
        phi_new.shape[1],
        phi_old.shape[1],
        learn_rho=rho_is_learned(cfg),
        rho_blocks=cfg.rho_blocks,
        psi_blocks=cfg.psi_blocks,
        hidden=cfg.hidden,
    ).to(device)

    def step_loss(idx: Tensor) -> Tensor:
        out_new, out_rev = model(phi_new[idx].to(device))
        return heads_loss(cfg, out_new, out_rev, phi_old[idx].to(device), labels[idx].to(device))

    per_epoch = steps_per_epoch(len(labels), cfg.batch)
    steps = heads_steps(cfg, per_epoch)
    log.info(
        "training %s heads on %d images: %d steps (%.1f epochs) of batch %d, Adam lr %g",
        cfg.loss,
        len(labels),
        steps,
        steps / per_epoch,
        cfg.batch,
        cfg.lr,
    )
    losses = run_steps(
        model, step_loss, len(labels), steps=steps, batch=cfg.batch, lr=cfg.lr, seed=cfg.seed, what=cfg.loss
    )
    window = per_epoch if cfg.epochs else max(1, steps // 10)
    history = [sum(losses[i : i + window]) / len(losses[i : i + window]) for i in range(0, steps, window)]
    return save_heads(model, cfg, epoch=math.ceil(steps / per_epoch), loss=history[-1], steps=steps), history


def save_heads(model: Heads, cfg: HeadsConfig, *, epoch: int, loss: float, steps: int | None = None) -> Path:
    checkpoint = {
        "kind": "heads",
        "d_new": model.d_new,
        "d_old": model.d_old,
        "learn_rho": model.learn_rho,
        "rho_blocks": cfg.rho_blocks,
        "psi_blocks": cfg.psi_blocks,
        "hidden": cfg.hidden,
        "old_checkpoint": file_hash(cfg.old),
        "new_checkpoint": file_hash(cfg.new),
        "epoch": epoch,
        "steps": steps,
        "metric": {"loss": loss},
        "config": plain_config(cfg),
        "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
    }
    return save_checkpoint(checkpoint, cfg.out)


def load_heads(path: str | Path) -> tuple[Heads, dict[str, Any]]:
    """Rebuild trained heads (eval mode) and their description.

    Raises:
        ValueError: the file is not a heads checkpoint, a field of it is of the wrong type
            or range (``SCHEMAS`` in train/checkpoints.py), or its weights do not fit.
    """
    checkpoint = load_checkpoint(path, "heads")
    model = build(
        lambda: Heads(
            checkpoint["d_new"],
            checkpoint["d_old"],
            learn_rho=checkpoint["learn_rho"],
            rho_blocks=checkpoint["rho_blocks"],
            psi_blocks=checkpoint["psi_blocks"],
            hidden=checkpoint["hidden"],
        ),
        checkpoint,
        path,
    )
    return model.eval(), description(checkpoint)
