"""The learnable new head ρ and the reverse query transform ψ, trained on cached embeddings.

Both are small MLPs: ``blocks − 1`` blocks of Linear → BatchNorm → ReLU, then a
Linear. ρ maps φ_new's embedding to the new gallery/query embedding (or is the
identity); ψ maps ρ's output into the old space. The backbones stay frozen, so
one epoch over CIFAR-10's 50,000 training images is a few seconds on a CPU.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from train.backbone import pick_device
from train.cache import as_tensors, embeddings, file_hash
from train.checkpoints import description, load_checkpoint, save_checkpoint
from train.config import HeadsConfig, rho_is_learned
from train.data import batches
from train.losses import LOSSES, contrastive_loss, rqt_loss

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


def train_heads(cfg: HeadsConfig) -> tuple[Path, list[float]]:
    """Train ψ (and ρ) on the new model's training images; returns (checkpoint, loss per epoch)."""
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
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    steps = cfg.epochs * math.ceil(len(labels) / cfg.batch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    generator = torch.Generator().manual_seed(cfg.seed)
    history = []
    started = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        total = 0.0
        for idx in batches(len(labels), cfg.batch, shuffle=True, generator=generator):
            if len(idx) < 2:
                continue  # BatchNorm needs two rows
            out_new, out_rev = model(phi_new[idx].to(device))
            loss = heads_loss(cfg, out_new, out_rev, phi_old[idx].to(device), labels[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(idx)
        history.append(total / len(labels))
        log.info("epoch %d/%d %s loss %.4f", epoch, cfg.epochs, cfg.loss, history[-1])
    log.info("trained heads in %.1f s", time.perf_counter() - started)
    return save_heads(model, cfg, epoch=cfg.epochs, loss=history[-1] if history else float("nan")), history


def save_heads(model: Heads, cfg: HeadsConfig, *, epoch: int, loss: float) -> Path:
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
        "metric": {"loss": loss},
        "config": dataclasses.asdict(cfg),
        "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
    }
    return save_checkpoint(checkpoint, cfg.out)


def load_heads(path: str | Path) -> tuple[Heads, dict[str, Any]]:
    """Rebuild trained heads (eval mode) and their description.

    Raises:
        ValueError: the file is not a heads checkpoint.
    """
    checkpoint = load_checkpoint(path, "heads")
    model = Heads(
        checkpoint["d_new"],
        checkpoint["d_old"],
        learn_rho=checkpoint["learn_rho"],
        rho_blocks=checkpoint["rho_blocks"],
        psi_blocks=checkpoint["psi_blocks"],
        hidden=checkpoint["hidden"],
    )
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), description(checkpoint)
