"""Self-describing checkpoints: one dict with a ``kind``, its facts and its weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def save_checkpoint(checkpoint: dict[str, Any], out: str | Path) -> Path:
    """Write ``checkpoint`` atomically (a crash never leaves half a file at ``out``)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    tmp.replace(path)
    return path


def load_checkpoint(path: str | Path, kind: str) -> dict[str, Any]:
    """Read a checkpoint of ``kind`` (``backbone``, ``heads``, ``adapter``, ...).

    Raises:
        ValueError: the file is not an rm-qdrant checkpoint of that kind.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(checkpoint, dict) or checkpoint.get("kind") != kind:
        raise ValueError(f"{path} is not an rm-qdrant {kind} checkpoint")
    return checkpoint


def description(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint without its weights."""
    return {k: v for k, v in checkpoint.items() if k != "state_dict"}
