"""Training a backbone with cross-entropy; checkpoints that describe themselves.

A checkpoint is a dict with ``kind: "backbone"``, the architecture, stem,
embedding size, image size and normalisation, the class names it was trained on,
the epoch, its test metric, the config, and the weights: enough to rebuild the
model with nothing else (:func:`load_backbone`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rm_qdrant_train.backbones import Backbone, build_backbone
from rm_qdrant_train.checkpoints import build, description, load_checkpoint, plain_config, save_checkpoint
from rm_qdrant_train.config import BackboneConfig
from rm_qdrant_train.data import (
    MEAN,
    STD,
    ImageSet,
    augment,
    batches,
    class_split,
    load_image_folder,
    normalization,
    to_tensor,
)

log = logging.getLogger(__name__)
CompatLoss = Callable[[Tensor, Tensor, Tensor], Tensor]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def role_classes(data: ImageSet, setting: str, role: str, seed: int) -> list[str]:
    """The class names a backbone of ``role`` (old or new) trains on in ``setting``."""
    old, new = class_split(data.classes, setting, seed=seed)
    if role not in ("old", "new"):
        raise ValueError(f"role must be old or new, got {role!r}")
    return old if role == "old" else new


def local_labels(data: ImageSet, classes: list[str]) -> torch.Tensor:
    """Dataset label indices → indices into ``classes``."""
    lookup = {data.classes.index(c): k for k, c in enumerate(classes)}
    return torch.tensor([lookup[int(y)] for y in data.labels], dtype=torch.long)


@torch.no_grad()
def embed(
    model: Backbone,
    images: Any,
    *,
    device: torch.device,
    batch: int = 512,
    mean: Sequence[float] = MEAN,
    std: Sequence[float] = STD,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings and logits of uint8 images (N, H, W, 3), normalised with the model's
    ``mean``/``std``, in eval mode, on the CPU."""
    model.eval()
    embs, logits = [], []
    for start in range(0, len(images), batch):
        x = to_tensor(images[start : start + batch], mean, std).to(device)
        e, z = model(x)
        embs.append(e.float().cpu())
        logits.append(z.float().cpu())
    return torch.cat(embs), torch.cat(logits)


def _influence_head(
    path: str, device: torch.device, train: ImageSet, classes: list[str]
) -> tuple[torch.nn.Linear, list[str]]:
    """The old model's frozen classifier, extended to the classes of ``classes`` it never saw.

    As in BCT (Shen et al. 2020), a new class is scored with a synthesised weight: the
    mean of the old model's embeddings of that class's training images, here scaled to
    the old rows' mean norm, with the old rows' mean bias. So the influence loss also
    reaches the new classes' images, which keeps it alive in the open-class setting,
    where the two models share no class.
    """
    old, meta = load_backbone(path, device=device)
    old_classes = list(meta["classes"])
    weight, bias = old.classifier.weight.detach(), old.classifier.bias.detach()
    unseen = [c for c in classes if c not in old_classes]
    if unseen:
        mask = np.isin(train.labels, [train.classes.index(c) for c in unseen])
        emb, _ = embed(old, train.images[mask], device=device, mean=meta["mean"], std=meta["std"])
        names = np.array([train.classes[y] for y in train.labels[mask]])
        means = torch.stack([emb[torch.from_numpy(names == c)].mean(0) for c in unseen]).to(device)
        means = means / means.norm(dim=1, keepdim=True) * weight.norm(dim=1).mean()
        weight = torch.cat([weight, means])
        bias = torch.cat([bias, bias.mean().repeat(len(unseen))])
    head = torch.nn.Linear(weight.shape[1], weight.shape[0]).to(device)
    head.weight.data.copy_(weight)
    head.bias.data.copy_(bias)
    for p in head.parameters():
        p.requires_grad_(False)
    return head.eval(), old_classes + unseen


def train_backbone(cfg: BackboneConfig) -> Path:
    """Train one backbone as ``cfg`` says; returns the checkpoint path.

    With ``cfg.influence`` (BCT), the frozen classifier of that old checkpoint
    (extended to the new classes, see :func:`_influence_head`) is also applied to
    the new embeddings, and its cross-entropy is added with ``cfg.influence_weight``. With ``cfg.compat``
    (RACT), :func:`compat_loss` is added with ``cfg.compat_weight``.
    """
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    root = Path(cfg.data)
    train_all = load_image_folder(root / "train", size=cfg.image_size)
    test_all = load_image_folder(root / "test", size=cfg.image_size)
    classes = role_classes(train_all, cfg.setting, cfg.role, cfg.seed)
    train, test = train_all.subset(classes), test_all.subset(classes)
    if cfg.limit:
        keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed))[
            : cfg.limit
        ].numpy()
        train = ImageSet(
            train.images[keep], train.labels[keep], train.classes, tuple(train.paths[i] for i in keep)
        )
    mean, std = normalization(cfg.normalize, train.images, cfg.mean, cfg.std)
    x_all, y_all = to_tensor(train.images, mean, std), local_labels(train, classes)
    model = build_backbone(
        cfg.arch, num_classes=len(classes), embed_dim=cfg.embed_dim, stem=cfg.stem, image_size=cfg.image_size
    ).to(device)
    influence = _influence_head(cfg.influence, device, train, classes) if cfg.influence else None
    compat = compat_loss(cfg, device) if cfg.compat else None
    steps = cfg.epochs * math.ceil(len(train) / cfg.batch)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay, nesterov=True
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, steps))
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    generator = torch.Generator().manual_seed(cfg.seed)
    top1 = 0.0
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        started, total = time.perf_counter(), 0.0
        for idx in batches(len(train), cfg.batch, shuffle=True, generator=generator):
            x = augment(x_all[idx], pad=cfg.crop_padding, flip=cfg.flip, generator=generator)
            x = x.to(device, non_blocking=True)
            y = y_all[idx].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                emb, logits = model(x)
                loss = F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing)
                if influence is not None:
                    loss = loss + cfg.influence_weight * _influence_loss(influence, emb, y, classes)
                if compat is not None:
                    loss = loss + cfg.compat_weight * compat(x, emb, y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            total += loss.item() * len(idx)
        top1 = accuracy(model, test, classes, device, mean=mean, std=std)
        log.info(
            "epoch %d/%d loss %.4f test top-1 %.4f (%.0f s)",
            epoch,
            cfg.epochs,
            total / len(train),
            top1,
            time.perf_counter() - started,
        )
    return save_backbone(model, cfg, classes, epoch=cfg.epochs, metric={"top1": top1}, norm=(mean, std))


def _influence_loss(
    influence: tuple[torch.nn.Linear, list[str]], emb: torch.Tensor, y: torch.Tensor, classes: list[str]
) -> torch.Tensor:
    head, old_classes = influence
    # Labels of this model → labels of the (extended) old classifier.
    mapping = torch.tensor(
        [old_classes.index(c) if c in old_classes else -1 for c in classes], device=y.device
    )
    target = mapping[y]
    seen = target >= 0
    if not seen.any():
        return emb.sum() * 0.0
    return F.cross_entropy(head(emb[seen]), target[seen])


def same_width(d_old: int, d_new: int, method: str) -> None:
    """Refuse two embedding sizes where ``method`` compares new vectors with old ones directly."""
    if d_old != d_new:
        raise ValueError(
            f"{method} compares new queries with old gallery vectors, so both need one size; "
            f"old embeds to {d_old}, new to {d_new}"
        )


# --- RACT: the compatibility loss of a backward-compatible new backbone -------------------------------


def ract_loss(new: Tensor, old: Tensor, labels: Tensor, *, temperature: float = 0.1) -> Tensor:
    """RACT's compatibility loss for one batch, on cosine similarities.

    For anchor i, the positive is its own old embedding old_i; the negatives are
    the old *and* the new embeddings of the batch's other-class images:
    −log e^{s(new_i, old_i)/τ} / (e^{s(new_i, old_i)/τ} + Σ_{y_j≠y_i} e^{s(new_i, old_j)/τ}
    + Σ_{y_j≠y_i} e^{s(new_i, new_j)/τ}). The new-side negatives are what keep a
    new query from landing near a migrated wrong-class item (a negative flip).
    """
    new, old = F.normalize(new.float(), dim=1), F.normalize(old.float(), dim=1)
    other = labels[:, None] != labels[None, :]
    to_old, to_new = new @ old.T / temperature, new @ new.T / temperature
    logits = torch.cat(
        [
            to_old.diagonal()[:, None],
            to_old.masked_fill(~other, float("-inf")),
            to_new.masked_fill(~other, float("-inf")),
        ],
        dim=1,
    )
    return F.cross_entropy(logits, torch.zeros(len(labels), dtype=torch.long, device=logits.device))


def compat_loss(cfg: BackboneConfig, device: torch.device) -> CompatLoss:
    """The extra loss ``cfg.compat`` names, as ``loss(images, new_embeddings, labels)``.

    The old backbone (``cfg.compat_old``) is frozen, in eval mode, and run on the
    same augmented batch as the new one.

    Raises:
        ValueError: unknown ``compat``, no old checkpoint, or embedding sizes that differ.
    """
    if cfg.compat != "ract":
        raise ValueError(f"unknown compatibility loss {cfg.compat!r}; expected 'ract'")
    if not cfg.compat_old:
        raise ValueError("compat='ract' needs compat_old, the old backbone's checkpoint")
    old, meta = load_backbone(cfg.compat_old, device=device)
    same_width(meta["embed_dim"], cfg.embed_dim, "ract")
    for p in old.parameters():
        p.requires_grad_(False)

    def loss(x: Tensor, emb: Tensor, y: Tensor) -> Tensor:
        with torch.no_grad():
            old_emb, _ = old(x)
        return ract_loss(emb, old_emb, y, temperature=cfg.compat_temperature)

    return loss


@torch.no_grad()
def accuracy(
    model: Backbone,
    data: ImageSet,
    classes: list[str],
    device: torch.device,
    *,
    mean: Sequence[float] = MEAN,
    std: Sequence[float] = STD,
) -> float:
    """Top-1 accuracy on ``data`` (restricted to ``classes``)."""
    _, logits = embed(model, data.images, device=device, mean=mean, std=std)
    return float((logits.argmax(dim=1) == local_labels(data, classes)).float().mean())


def save_backbone(
    model: Backbone,
    cfg: BackboneConfig,
    classes: list[str],
    *,
    epoch: int,
    metric: dict[str, float],
    norm: tuple[Sequence[float], Sequence[float]] = (MEAN, STD),
) -> Path:
    checkpoint = {
        "kind": "backbone",
        "arch": cfg.arch,
        "stem": cfg.stem,
        "embed_dim": cfg.embed_dim,
        "image_size": cfg.image_size,
        "mean": tuple(norm[0]),
        "std": tuple(norm[1]),
        "classes": classes,
        "epoch": epoch,
        "metric": metric,
        "config": plain_config(cfg),
        "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
    }
    return save_checkpoint(checkpoint, cfg.out)


def load_backbone(path: str | Path, *, device: torch.device | str = "cpu") -> tuple[Backbone, dict[str, Any]]:
    """Rebuild a backbone from its checkpoint; returns (model in eval mode, checkpoint without weights).

    Raises:
        ValueError: the file is not a backbone checkpoint, a field of it is of the wrong
            type or range (``SCHEMAS`` in train/checkpoints.py), or its weights do not fit.
    """
    checkpoint = load_checkpoint(path, "backbone")
    model = build(
        lambda: build_backbone(
            checkpoint["arch"],
            num_classes=len(checkpoint["classes"]),
            embed_dim=checkpoint["embed_dim"],
            stem=checkpoint["stem"],
            image_size=checkpoint["image_size"],
        ),
        checkpoint,
        path,
    )
    return model.to(device).eval(), description(checkpoint)
