"""Embeddings of frozen backbones, computed once per (checkpoint, image folder).

The heads and the adapters train on these; cached under ``embeddings/`` in the platform
cache folder (``$XDG_CACHE_HOME/rm-qdrant``, ``--cache-dir``), keyed by the checkpoint
file's hash and the folder's key, so a retrained checkpoint or changed folder is never
served stale vectors.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rm_qdrant.caches import cache_root, human_size
from rm_qdrant_train.backbone import embed, load_backbone, pick_device
from rm_qdrant_train.data import folder_key, load_image_folder

log = logging.getLogger(__name__)


def cache_folder() -> Path:
    """Where embeddings are cached: ``embeddings/`` under :func:`rm_qdrant.caches.cache_root`."""
    return cache_root() / "embeddings"


@dataclass(frozen=True)
class Embedded:
    """One backbone's view of one folder: embeddings, logits, dataset labels and class names."""

    emb: np.ndarray
    logits: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    model_classes: tuple[str, ...]

    def known(self) -> np.ndarray:
        """Mask of the images whose class the backbone was trained on."""
        return np.isin(self.labels, [self.classes.index(c) for c in self.model_classes])

    def scores(self) -> np.ndarray:
        """Max-softmax confidence of the backbone's classifier, per image."""
        z = self.logits - self.logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        return (p / p.sum(axis=1, keepdims=True)).max(axis=1)


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def embeddings(
    checkpoint: str | Path,
    folder: str | Path,
    *,
    device: str = "auto",
    cache: Path | None | bool = True,
) -> Embedded:
    """Embed every image of ``folder`` with the backbone in ``checkpoint`` (cached; ``cache``:
    True for the default folder, a folder, or False/None for no cache)."""
    model, meta = load_backbone(checkpoint, device=pick_device(device))
    size = meta["image_size"]
    folder_cache = cache_folder() if cache is True else (cache or None)
    key = f"{file_hash(checkpoint)}-{folder_key(Path(folder), size)}.npz"
    target = folder_cache / key if folder_cache else None
    data = load_image_folder(folder, size=size)
    if target is not None and target.is_file():
        with np.load(target) as stored:
            return Embedded(
                stored["emb"], stored["logits"], data.labels, data.classes, tuple(meta["classes"])
            )
    log.info("embedding %d images of %s with %s", len(data.labels), folder, checkpoint)
    emb, logits = embed(
        model, data.images, device=next(model.parameters()).device, mean=meta["mean"], std=meta["std"]
    )
    result = Embedded(emb.numpy(), logits.numpy(), data.labels, data.classes, tuple(meta["classes"]))
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        np.savez(target, emb=result.emb, logits=result.logits)
        log.info("cached %d embeddings (%s) at %s", len(result.emb), human_size(target), target)
    return result


def as_tensors(*arrays: np.ndarray) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
