"""Fitting a query adapter on cached embeddings, and its self-describing checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rm_qdrant_train.adapters import Adapter, build_adapter, fit_adapter
from rm_qdrant_train.cache import embeddings, file_hash
from rm_qdrant_train.checkpoints import build, description, load_checkpoint, plain_config, save_checkpoint
from rm_qdrant_train.config import AdapterConfig


def train_adapter_job(cfg: AdapterConfig) -> Path:
    """Fit ``cfg.kind`` from φ_new to φ_old on the new model's training images; save it."""
    folder = Path(cfg.data) / "train"
    old, new = embeddings(cfg.old, folder), embeddings(cfg.new, folder)
    keep = new.known()
    adapter = fit_adapter(
        cfg.kind,
        new.emb[keep],
        old.emb[keep],
        epochs=cfg.epochs,
        lr=cfg.lr,
        batch=cfg.batch,
        loss=cfg.loss,
        seed=cfg.seed,
        rank=cfg.rank,
        hidden=cfg.hidden,
    )
    return save_checkpoint(
        {
            "kind": "adapter",
            "adapter": cfg.kind,
            "d_in": adapter.d_in,
            "d_out": adapter.d_out,
            "old_checkpoint": file_hash(cfg.old),
            "new_checkpoint": file_hash(cfg.new),
            "metric": {"loss": adapter.losses[-1] if adapter.losses else None},
            "config": plain_config(cfg),
            "state_dict": adapter.state_dict(),
        },
        cfg.out,
    )


def load_adapter(path: str | Path) -> tuple[Adapter, dict[str, Any]]:
    """Rebuild a fitted adapter (eval mode) from its checkpoint.

    Raises:
        ValueError: the file is not an adapter checkpoint, a field of it is of the wrong type
            or range (``SCHEMAS`` in train/checkpoints.py), or its weights do not fit.
    """
    checkpoint = load_checkpoint(path, "adapter")
    cfg = checkpoint["config"]
    adapter = build(
        lambda: build_adapter(
            checkpoint["adapter"],
            checkpoint["d_in"],
            checkpoint["d_out"],
            rank=cfg["rank"],
            hidden=cfg["hidden"],
        ),
        checkpoint,
        path,
    )
    return adapter.eval(), description(checkpoint)
