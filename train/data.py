"""Image folders decoded once into memory, class splits, and augmentation in torch.

An ImageFolder (``DIR/<label>/<file>``) is decoded to a uint8 array the first time and
cached under ``decoded/`` in the platform cache folder (``$XDG_CACHE_HOME/rm-qdrant``,
``--cache-dir``), keyed by the folder's path, file count and newest modification time,
so an epoch never re-decodes JPEGs.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rm_qdrant.caches import cache_root, human_size
from rm_qdrant.models.images import pixels
from rm_qdrant.operations.indexing import scan_image_folder

log = logging.getLogger(__name__)


def cache_folder() -> Path:
    """Where decoded folders are cached: ``decoded/`` under :func:`rm_qdrant.caches.cache_root`."""
    return cache_root() / "decoded"


#: CIFAR-10's channel statistics; used for every dataset unless a config says otherwise.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


@dataclass(frozen=True)
class ImageSet:
    """Decoded images (N, H, W, 3) uint8, their labels (indices into ``classes``) and paths."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    paths: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, keep: Sequence[str]) -> ImageSet:
        """Only the images of the classes in ``keep``; labels stay indices into ``classes``."""
        wanted = [self.classes.index(c) for c in keep]
        mask = np.isin(self.labels, wanted)
        return ImageSet(
            self.images[mask], self.labels[mask], self.classes, tuple(np.asarray(self.paths)[mask])
        )


def folder_key(folder: Path, size: int) -> str:
    """A key that changes when the folder's files change (path, count, newest mtime, size)."""
    files = sorted(p for p in folder.glob("*/*") if p.is_file())
    newest = max((p.stat().st_mtime_ns for p in files), default=0)
    return hashlib.sha256(f"{folder.resolve()}|{len(files)}|{newest}|{size}".encode()).hexdigest()[:16]


def load_image_folder(folder: str | Path, *, size: int = 32, cache: Path | None | bool = True) -> ImageSet:
    """Decode an ImageFolder to RGB ``size``×``size`` arrays (cached after the first call;
    ``cache``: True for the default folder, a folder, or False/None for no cache)."""
    root = Path(folder)
    items = scan_image_folder(root)
    classes = tuple(sorted({i.label or "" for i in items}))
    folder_cache = cache_folder() if cache is True else (cache or None)
    target = folder_cache / f"{folder_key(root, size)}.npz" if folder_cache else None
    if target is not None and target.is_file():
        with np.load(target) as data:
            return ImageSet(data["images"], data["labels"], classes, tuple(i.uri for i in items))
    log.info("decoding %d images of %s", len(items), root)
    images = np.stack([pixels(i.uri, height=size, width=size, channels=3) for i in items])
    labels = np.array([classes.index(i.label or "") for i in items], dtype=np.int64)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        np.savez(target, images=images, labels=labels)
        log.info("cached %d decoded images (%s) at %s", len(labels), human_size(target), target)
    return ImageSet(images, labels, classes, tuple(i.uri for i in items))


def class_split(classes: Sequence[str], setting: str, *, seed: int = 0) -> tuple[list[str], list[str]]:
    """(old classes, new classes) for a setting.

    ``extended``: old on the first half of the sorted classes, new on all of them.
    ``open``: old on a seeded random 30 % of the classes, new on the rest.
    """
    ordered = sorted(classes)
    if setting == "extended":
        return ordered[: len(ordered) // 2], ordered
    if setting == "open":
        shuffled = ordered[:]
        random.Random(seed).shuffle(shuffled)
        cut = max(1, round(0.3 * len(ordered)))
        return sorted(shuffled[:cut]), sorted(shuffled[cut:])
    raise ValueError(f"unknown setting {setting!r}; expected 'extended' or 'open'")


def to_tensor(images: np.ndarray, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> torch.Tensor:
    """uint8 (N, H, W, 3) → normalised float (N, 3, H, W)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    return (x - m) / s


#: Channel statistics by name (``--normalize``).
NORMALIZATIONS = {
    "cifar10": (MEAN, STD),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "none": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
}


def normalization(
    name: str, images: np.ndarray, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel: given, named, or ``auto``: measured on ``images`` (uint8 N×H×W×3).

    Raises:
        ValueError: an unknown name, or a mean/std without three values (std > 0).
    """
    if name == "auto":
        pixels = images.reshape(-1, 3).astype(np.float64) / 255.0
        found = (
            tuple(pixels.mean(0).round(4).tolist()),
            tuple(np.maximum(pixels.std(0), 1e-3).round(4).tolist()),
        )
    elif name in NORMALIZATIONS:
        found = NORMALIZATIONS[name]
    else:
        raise ValueError(f"unknown normalize {name!r}; expected auto, {', '.join(NORMALIZATIONS)}")
    chosen = (tuple(mean) if mean else found[0], tuple(std) if std else found[1])
    if any(len(v) != 3 for v in chosen) or min(chosen[1]) <= 0:
        raise ValueError(f"mean and std need three values each, std > 0; got {chosen}")
    return chosen


def augment(
    batch: torch.Tensor, *, pad: int = 4, flip: bool = True, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Random crop with zero padding (``pad`` 0: none) and random horizontal flip, per image."""
    if pad == 0 and not flip:
        return batch
    n, _, h, w = batch.shape
    padded = torch.nn.functional.pad(batch, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None].expand(
        n, batch.shape[1], h, w + 2 * pad
    )
    cropped = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :].expand(n, batch.shape[1], h, w)
    cropped = cropped.gather(3, cols)
    flipped = torch.rand(n, generator=generator) < 0.5
    if flip:
        cropped[flipped] = cropped[flipped].flip(3)
    return cropped


def batches(
    n: int, size: int, *, shuffle: bool, generator: torch.Generator | None = None
) -> Iterator[torch.Tensor]:
    """Index batches over ``n`` items."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, size):
        yield order[start : start + size]
