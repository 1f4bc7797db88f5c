"""``rmq demo``: the whole product on real images, on the embedded store, in a few minutes.

With no data it writes scikit-learn's bundled handwritten digits (real images,
no download) as an ImageFolder; ``--data DIR`` takes any folder with ``train/``
and ``test/``. Then it trains an old backbone on the first half of the classes
and a new one on all of them, trains ψ/ρ with MCL, exports both ONNX graphs,
indexes the test set into two old collections (one per query mode), and migrates
both pairs in ten steps, printing mAP@100 and top-1 of RM_naive and RM as served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder
from rm_qdrant.core.metrics import FRACTIONS, area
from rm_qdrant.evaluation.evaluate import served_retrieval
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant_exporters.serving import export_backbone, export_serving
from rm_qdrant_train.backbone import train_backbone
from rm_qdrant_train.config import BackboneConfig, HeadsConfig
from rm_qdrant_train.heads import train_heads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoRow:
    """One backfill step: the fraction in new and each mode's served mAP and top-1."""

    t: float
    naive_map: float
    naive_top1: float
    rm_map: float
    rm_top1: float


def write_digits(root: Path, *, test_share: float = 0.3, seed: int = 0) -> Path:
    """scikit-learn's 1,797 handwritten digits as PNG files in root/{train,test}/<digit>/."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.clip(digits.images * 16, 0, 255).astype(np.uint8)
    is_test = np.random.default_rng(seed).random(len(pixels)) < test_share
    for i, (image, label, test) in enumerate(zip(pixels, digits.target, is_test, strict=True)):
        target = root / ("test" if test else "train") / str(label) / f"{i:04d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(target)
    return root


def run_demo(
    out: Path, *, data: Path | None = None, epochs: int = 12, on_row: Callable[[DemoRow], None] | None = None
) -> list[DemoRow]:
    """Train, export, index, migrate in ten steps and measure; returns the table's rows."""
    out.mkdir(parents=True, exist_ok=True)
    root = data or write_digits(out / "digits")
    runs = out / "runs"
    for role in ("old", "new"):
        train_backbone(
            BackboneConfig(
                data=str(root), out=str(runs / f"{role}.pt"), role=role, epochs=epochs, batch=64, lr=0.05
            )
        )
    train_heads(
        HeadsConfig(
            old=str(runs / "old.pt"),
            new=str(runs / "new.pt"),
            data=str(root),
            out=str(runs / "heads.pt"),
            loss="mcl",
            epochs=60,
            batch=256,
            lr=1e-3,
        )
    )
    model, _ = export_serving(runs / "new.pt", runs / "heads.pt", out / "model.onnx")
    old, _ = export_backbone(runs / "old.pt", out / "old.onnx")
    new_only, _ = export_backbone(runs / "new.pt", out / "new.onnx", role="new", scores=False)
    items = scan_image_folder(root / "test")
    with open_store(out / "qdrant") as store:
        for mode in ("naive", "rm"):
            index_images(store, f"gallery-{mode}", OnnxEncoder(old), items)
        create_pair(
            store,
            "naive",
            old_collection="gallery-naive",
            encoder=OnnxEncoder(new_only),
            old_encoder=OnnxEncoder(old),
        )
        create_pair(store, "rm", old_collection="gallery-rm", encoder=OnnxEncoder(model))
        pairs = {m: DualIndex.open(store, m, exact=True) for m in ("naive", "rm")}
        rows = []
        for t in FRACTIONS:
            scores = {}
            for mode, index in pairs.items():
                run_migration(index, MigrateOptions(until=t, batch=500, order="confidence"))
                scores[mode] = served_retrieval(index, items, k=100)
            row = DemoRow(t, scores["naive"].map, scores["naive"].top1, scores["rm"].map, scores["rm"].top1)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    plot(rows, out / "curves.png")
    return rows


def summary(rows: list[DemoRow]) -> dict[str, float]:
    """Areas under each mode's mAP curve."""
    return {"auc_map_naive": area([r.naive_map for r in rows]), "auc_map_rm": area([r.rm_map for r in rows])}


def plot(rows: list[DemoRow], path: Path) -> Path | None:
    """mAP_t of both modes as a PNG (skipped, with a log line, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        log.info("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    t = [r.t for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(t, [100 * r.naive_map for r in rows], marker="o", label="RM_naive")
    ax.plot(t, [100 * r.rm_map for r in rows], marker="o", label="RM (MCL + ρ)")
    ax.set_xlabel("backfill fraction t")
    ax.set_ylabel("mAP (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
