"""The paper's baselines, BCT, FCT, BiCT and RACT, with what each serves during an online backfill.

At backfill fraction t, a fraction t of the gallery has been re-embedded with the
new model ("migrated"); the rest still holds whatever the method stored before
migration. :class:`BackfillEmbeddings` says, for one labelled test set, which
vector a query uses against each half and which vector a gallery item has before
and after migration, so ``rm_qdrant.core.metrics.backfill_retrieval`` scores any
method at any t. The protocols:

- **BCT** (Shen et al. 2020): the new backbone is trained with cross-entropy plus
  the influence loss (the frozen old classifier applied to new embeddings of the
  old classes' images), so its space is the old one. Query φ_new; gallery φ_new
  once migrated, φ_old before.
- **FCT** (Ramanujan et al. 2022): the new backbone is trained freely; a forward
  transformation h maps every old gallery embedding, with label-free
  side-information s(x), into the new space at once (cheap, no images needed
  but the side-info). Query φ_new; gallery φ_new once migrated, h(φ_old(x), s(x)) before.
- **BiCT** (Su et al. 2022): a backward-compatible (BCT) new backbone plus a
  forward transformation of the old gallery into its space, from φ_old alone.
  Query φ_new; gallery φ_new once migrated, h(φ_old(x)) before.
- **RACT** (Zhang et al. 2022): the new backbone is trained with cross-entropy
  plus a contrastive compatibility loss (``backbone.ract_loss``) whose negatives come
  from both systems, which alleviates negative flips. Query φ_new; gallery φ_new
  once migrated, φ_old before.

BCT and RACT compare new queries with old gallery vectors directly, so both
backbones must have the same embedding size.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rm_qdrant.core.offline import BackfillEmbeddings
from rm_qdrant_train.adapters import adapter_loss
from rm_qdrant_train.backbone import pick_device, same_width, train_backbone
from rm_qdrant_train.cache import Embedded, cache_folder, embeddings, file_hash
from rm_qdrant_train.checkpoints import build, load_checkpoint, plain_config, save_checkpoint
from rm_qdrant_train.config import BackboneConfig, load_config
from rm_qdrant_train.data import augment, batches, folder_key, load_image_folder, to_tensor
from rm_qdrant_train.heads import mlp

log = logging.getLogger(__name__)
METHODS = ("bct", "fct", "bict", "ract")


@dataclass
class BaselineConfig:
    """One baseline: a new backbone (bct, ract) or a forward transformation h (fct, bict)."""

    data: str = ".cache/data"  # folder with train/ and test/ in ImageFolder layout
    old: str = "runs/old.pt"  # the frozen old backbone φ_old
    new: str = "runs/new.pt"  # fct: the freely trained new backbone; bict: a BCT-trained one
    out: str = "runs/baseline.pt"  # the new backbone (bct, ract) or the transformation (fct, bict)
    backbone: dict[str, Any] = field(default_factory=dict)  # BackboneConfig settings (bct, ract)
    # Forward transformation h: old embedding [+ side-info] → new space (fct, bict).
    side_info: bool = True  # fct only; BiCT's h sees φ_old alone (its setting has no images)
    side: str = "runs/side.pt"  # label-free autoencoder; trained here when the file is missing
    side_dim: int = 64  # its bottleneck, the side-information
    side_epochs: int = 5
    limit: int = 0  # train the autoencoder on at most this many images (0: all)
    blocks: int = 3  # h = mlp(d_old [+ side_dim], d_new, blocks, hidden)
    hidden: int = 1024
    loss: str = "l2"  # l2 (FCT's) | cosine, between h(...) and φ_new(x)
    epochs: int = 30
    batch: int = 256
    lr: float = 1e-3  # Adam, cosine decay; also the autoencoder's
    seed: int = 0
    device: str = "auto"


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown baseline {method!r}; expected one of {', '.join(METHODS)}")


# --- side-information: a label-free convolutional autoencoder -----------------------------------------


class AutoEncoder(nn.Module):
    """Three stride-2 convolutions down to a ``dim`` bottleneck (the side-info), mirrored back up."""

    def __init__(self, dim: int = 64, *, image_size: int = 32, width: int = 32) -> None:
        super().__init__()
        if image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {image_size}")
        s, w = image_size // 8, width
        self.dim, self.image_size = dim, image_size
        self.encoder = nn.Sequential(
            nn.Conv2d(3, w, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(2 * w, 2 * w, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.Flatten(),
            nn.Linear(2 * w * s * s, dim),
        )
        self.decoder = nn.Sequential(
            nn.Linear(dim, 2 * w * s * s),
            nn.ReLU(inplace=True),
            nn.Unflatten(1, (2 * w, s, s)),
            nn.ConvTranspose2d(2 * w, 2 * w, 4, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.ConvTranspose2d(2 * w, w, 4, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.ConvTranspose2d(w, 3, 4, stride=2, padding=1),
        )

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(bottleneck, reconstruction) of normalised images (N, 3, H, W)."""
        z = self.encoder(x)
        return z, self.decoder(z)


def train_side_info(cfg: BaselineConfig) -> tuple[Path, list[float]]:
    """Train the autoencoder on ``cfg.data``/train without labels; returns (checkpoint, loss per epoch)."""
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    images = load_image_folder(Path(cfg.data) / "train").images
    generator = torch.Generator().manual_seed(cfg.seed)
    if cfg.limit:
        images = images[torch.randperm(len(images), generator=generator)[: cfg.limit].numpy()]
    x_all = to_tensor(images)
    model = AutoEncoder(cfg.side_dim, image_size=x_all.shape[-1]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    steps = cfg.side_epochs * math.ceil(len(x_all) / cfg.batch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    history = []
    model.train()
    for epoch in range(1, cfg.side_epochs + 1):
        total = 0.0
        for idx in batches(len(x_all), cfg.batch, shuffle=True, generator=generator):
            x = augment(x_all[idx], generator=generator).to(device)
            loss = F.mse_loss(model(x)[1], x)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(idx)
        history.append(total / len(x_all))
        log.info("side-info epoch %d/%d reconstruction %.4f", epoch, cfg.side_epochs, history[-1])
    checkpoint = {
        "kind": "side-info",
        "dim": model.dim,
        "image_size": model.image_size,
        "epoch": cfg.side_epochs,
        "metric": {"mse": history[-1] if history else float("nan")},
        "config": plain_config(cfg),
        "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
    }
    return save_checkpoint(checkpoint, cfg.side), history


def side_embeddings(
    checkpoint: str | Path, folder: str | Path, *, device: str = "auto", cache: Path | None | bool = True
) -> np.ndarray:
    """Bottleneck vectors of every image of ``folder``, cached as :func:`rm_qdrant_train.cache.embeddings`."""
    stored = load_checkpoint(checkpoint, "side-info")
    size = stored["image_size"]
    folder_cache = cache_folder() if cache is True else (cache or None)
    key = f"side-{file_hash(checkpoint)}-{folder_key(Path(folder), size)}.npz"
    target = folder_cache / key if folder_cache else None
    if target is not None and target.is_file():
        with np.load(target) as saved:
            return saved["emb"]
    model = build(lambda: AutoEncoder(stored["dim"], image_size=size), stored, checkpoint)
    model = model.to(pick_device(device)).eval()
    images = load_image_folder(folder, size=size).images
    with torch.no_grad():
        parts = [
            model.encoder(to_tensor(images[i : i + 512]).to(next(model.parameters()).device)).cpu()
            for i in range(0, len(images), 512)
        ]
    emb = torch.cat(parts).numpy()
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        np.savez(target, emb=emb)
    return emb


# --- forward transformation h (FCT, BiCT) -----------------------------------------------------------


def train_transformation(cfg: BaselineConfig, *, side: str | None) -> tuple[Path, list[float]]:
    """Train h: φ_old(x) [⊕ s(x)] → φ_new(x) on cached train-set embeddings; returns (checkpoint, losses).

    ``side`` is the side-info checkpoint, or None for h on φ_old alone.
    """
    if cfg.loss not in ("l2", "cosine"):
        raise ValueError(f"unknown transformation loss {cfg.loss!r}; expected l2 or cosine")
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    folder = Path(cfg.data) / "train"
    old, new = embeddings(cfg.old, folder, device=cfg.device), embeddings(cfg.new, folder, device=cfg.device)
    # The images of the classes the new model knows: h must reproduce φ_new where φ_new is meaningful.
    keep = new.known()
    inputs = _inputs(old, side, folder, device=cfg.device)
    x, target = torch.from_numpy(inputs[keep]), torch.from_numpy(new.emb[keep])
    model = mlp(x.shape[1], target.shape[1], blocks=cfg.blocks, hidden=cfg.hidden).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    steps = cfg.epochs * math.ceil(len(x) / cfg.batch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    generator = torch.Generator().manual_seed(cfg.seed)
    history = []
    model.train()
    for epoch in range(1, cfg.epochs + 1):
        total, seen = 0.0, 0
        for idx in batches(len(x), cfg.batch, shuffle=True, generator=generator):
            if len(idx) < 2:
                continue  # BatchNorm needs two rows
            loss = adapter_loss(model(x[idx].to(device)), target[idx].to(device), cfg.loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total, seen = total + loss.item() * len(idx), seen + len(idx)
        history.append(total / max(1, seen))
        log.info("transformation epoch %d/%d %s loss %.4f", epoch, cfg.epochs, cfg.loss, history[-1])
    checkpoint = {
        "kind": "transformation",
        "d_in": x.shape[1],
        "d_out": target.shape[1],
        "blocks": cfg.blocks,
        "hidden": cfg.hidden,
        "old_checkpoint": file_hash(cfg.old),
        "new_checkpoint": file_hash(cfg.new),
        "side": str(side) if side else "",
        "side_checkpoint": file_hash(side) if side else "",
        "epoch": cfg.epochs,
        "metric": {"loss": history[-1] if history else float("nan")},
        "config": plain_config(cfg),
        "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
    }
    return save_checkpoint(checkpoint, cfg.out), history


def _inputs(old: Embedded, side: str | Path | None, folder: Path, *, device: str) -> np.ndarray:
    if not side:
        return old.emb.astype(np.float32)
    return np.concatenate([old.emb, side_embeddings(side, folder, device=device)], axis=1).astype(np.float32)


def transform(
    checkpoint: str | Path, old: Embedded, folder: str | Path, *, device: str = "auto"
) -> np.ndarray:
    """h applied to the old embeddings of ``folder`` (with the side-info h was trained on)."""
    stored = load_checkpoint(checkpoint, "transformation")
    model = build(
        lambda: mlp(stored["d_in"], stored["d_out"], blocks=stored["blocks"], hidden=stored["hidden"]),
        stored,
        checkpoint,
    )
    if stored["side"] and file_hash(stored["side"]) != stored["side_checkpoint"]:
        raise ValueError(f"{checkpoint} was trained with another side-info model than {stored['side']}")
    x = torch.from_numpy(_inputs(old, stored["side"], Path(folder), device=device))
    if x.shape[1] != stored["d_in"]:
        raise ValueError(f"{checkpoint} expects {stored['d_in']}-d inputs, got {x.shape[1]}")
    with torch.no_grad():
        return model.eval()(x).numpy()


# --- entry points ------------------------------------------------------------------------------------


def train_baseline(method: str, cfg: BaselineConfig) -> Path:
    """Train what ``method`` adds to the old model; returns its checkpoint (``cfg.out``).

    ``bct`` and ``ract`` train a new backbone (``cfg.backbone`` holds its
    :class:`BackboneConfig` settings); ``fct`` trains the side-info autoencoder when
    ``cfg.side`` is missing, then h; ``bict`` trains h towards ``cfg.new``, which
    must be a BCT- or RACT-trained backbone.

    Raises:
        ValueError: unknown method, embedding sizes that differ (bct, ract), or a
            ``bict`` target that is not backward compatible.
    """
    _check_method(method)
    if method in ("bct", "ract"):
        settings = {"data": cfg.data, "seed": cfg.seed, "device": cfg.device, **cfg.backbone, "out": cfg.out}
        settings.update(
            {"influence": cfg.old} if method == "bct" else {"compat": "ract", "compat_old": cfg.old}
        )
        backbone = load_config(BackboneConfig, **settings)
        same_width(
            load_checkpoint(cfg.old, "backbone")["embed_dim"],
            backbone.embed_dim,
            method,
        )
        return train_backbone(backbone)
    if method == "bict":
        trained = load_checkpoint(cfg.new, "backbone", needs=("config",))["config"]
        if not (trained.get("influence") or trained.get("compat")):
            raise ValueError(f"bict needs a backward-compatible new backbone; {cfg.new} was trained without")
        return train_transformation(cfg, side=None)[0]
    side = None
    if cfg.side_info:
        if not Path(cfg.side).is_file():
            log.info("no side-info model at %s; training one", cfg.side)
            train_side_info(cfg)
        side = cfg.side
    return train_transformation(cfg, side=side)[0]


def baseline_embeddings(
    method: str,
    folder: str | Path,
    *,
    old: str | Path,
    new: str | Path,
    transformation: str | Path | None = None,
    device: str = "auto",
) -> BackfillEmbeddings:
    """What ``method`` serves on the labelled images of ``folder`` (see the module docstring).

    Args:
        method: one of ``METHODS``.
        folder: an ImageFolder test set.
        old: the old backbone's checkpoint.
        new: the new backbone's (for bict, the BCT one; for ract, the RACT one).
        transformation: h's checkpoint, required for fct and bict.
        device: where the backbones run.

    Raises:
        ValueError: unknown method, sizes that differ (bct, ract), no transformation,
            or a transformation trained for other backbones.
    """
    _check_method(method)
    e_old, e_new = embeddings(old, folder, device=device), embeddings(new, folder, device=device)
    q = e_new.emb
    if method in ("bct", "ract"):
        same_width(e_old.emb.shape[1], q.shape[1], method)
        return BackfillEmbeddings(q, q, q, e_old.emb, e_new.labels)
    if transformation is None:
        raise ValueError(f"{method} needs the transformation checkpoint")
    stored = load_checkpoint(transformation, "transformation")
    if (stored["old_checkpoint"], stored["new_checkpoint"]) != (file_hash(old), file_hash(new)):
        raise ValueError(f"{transformation} was trained for other backbones than {old} and {new}")
    # Before migration each gallery item holds h of its old vector: FCT upgrades the whole gallery at once.
    return BackfillEmbeddings(q, q, q, transform(transformation, e_old, folder, device=device), e_new.labels)
