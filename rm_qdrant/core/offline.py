"""Offline backfill evaluation: every method's curve from cached embeddings, no Qdrant.

A method is four arrays over one labelled test set (:class:`BackfillEmbeddings`):
what a query uses against migrated and not-yet-migrated gallery items, and what a
gallery item holds after and before migration. :func:`backfill_table` scores each
method along one backfill order; :func:`markdown`, :func:`as_json` and :func:`plot`
write the paper's table layout (AUC_mAP, AUC_CMC, Gain) and its mAP_t / top-1_t
curves. Pure numpy; the plot needs matplotlib (``pip install rm-qdrant[plot]``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.core.metrics import FRACTIONS, Curve, Retrieval, backfill_curve, backfill_retrieval, gain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackfillEmbeddings:
    """What a method serves for one test set; row i of every array is test image i."""

    query_new: np.ndarray  # a query's vector against migrated gallery items
    query_old: np.ndarray  # a query's vector against not-yet-migrated items
    gallery_new: np.ndarray  # a gallery item's vector once migrated
    gallery_old: np.ndarray  # its vector before migration
    labels: np.ndarray

    @classmethod
    def single(cls, emb: np.ndarray, labels: np.ndarray) -> BackfillEmbeddings:
        """One model on both sides: the curve is flat (the Old and New reference rows)."""
        return cls(emb, emb, emb, emb, labels)

    def retrieval(self, migrated: np.ndarray) -> Retrieval:
        """mAP and top-1 with the items where ``migrated`` is true served from the new vectors."""
        return backfill_retrieval(
            self.query_new, self.query_old, self.gallery_new, self.gallery_old, self.labels, migrated
        )

    def curve(self, order: np.ndarray, *, old_hits: np.ndarray) -> Curve:
        """mAP_t, top-1_t and negative flips as the gallery migrates in ``order``."""
        return backfill_curve(
            self.query_new,
            self.query_old,
            self.gallery_new,
            self.gallery_old,
            self.labels,
            order,
            old_hits=old_hits,
        )


@dataclass(frozen=True)
class Row:
    """One method's line of the table."""

    name: str
    curve: Curve
    gain_map: float  # (AUC_mAP − Old's) / (New's − Old's); NaN where Old = New
    gain_cmc: float  # the same with AUC_CMC

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """The row :meth:`as_dict` wrote."""
        curve = Curve(tuple(d["fractions"]), tuple(d["map"]), tuple(d["top1"]), int(d["flips"]))
        nan = float("nan")
        return cls(
            d["name"],
            curve,
            nan if d["gain_map"] is None else d["gain_map"],
            nan if d["gain_cmc"] is None else d["gain_cmc"],
        )

    def as_dict(self) -> dict[str, Any]:
        c = self.curve
        return {
            "name": self.name,
            "fractions": list(c.fractions),
            "map": list(c.maps),
            "top1": list(c.top1s),
            "auc_map": c.auc_map,
            "auc_cmc": c.auc_cmc,
            "gain_map": None if np.isnan(self.gain_map) else self.gain_map,  # undefined: Old = New
            "gain_cmc": None if np.isnan(self.gain_cmc) else self.gain_cmc,
            "monotone": c.monotone(),
            "flips": c.flips,
        }


def backfill_table(
    methods: Mapping[str, BackfillEmbeddings],
    order: np.ndarray,
    *,
    old: Retrieval,
    new: Retrieval,
    on_row: Any = None,
) -> list[Row]:
    """Score each method along ``order``; Gain is relative to the ``old`` and ``new`` systems.

    ``old.hits`` (each query's top-1 under the old system) defines a negative flip.
    ``on_row`` (optional) is called with each :class:`Row` as soon as it is scored.
    """
    rows = []
    for name, method in methods.items():
        curve = method.curve(order, old_hits=old.hits)
        row = Row(
            name,
            curve,
            _gain(curve.auc_map, old.map, new.map),
            _gain(curve.auc_cmc, old.top1, new.top1),
        )
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def _gain(auc: float, auc_old: float, auc_new: float) -> float:
    """Gain, or NaN where Old and New score the same (it is undefined there)."""
    return gain(auc, auc_old, auc_new) if auc_new != auc_old else float("nan")


def _percent(x: float) -> str:
    return "n/a" if np.isnan(x) else f"{100 * x:.0f} %"


def reference_rows(old: Retrieval, new: Retrieval) -> list[Row]:
    """The flat Old and New rows over ``FRACTIONS`` (Gain 0 and 1 by definition)."""
    n = len(FRACTIONS)
    return [
        Row(name, Curve(FRACTIONS, (r.map,) * n, (r.top1,) * n, 0), g, g)
        for name, r, g in (("Old", old, 0.0), ("New", new, 1.0))
    ]


def markdown(rows: Sequence[Row]) -> str:
    """The paper's table (AUC_mAP, AUC_CMC, Gain) and the 11-point mAP_t and top-1_t curves, in %."""
    lines = [
        "| method | AUC_mAP | AUC_CMC | Gain (mAP) | Gain (CMC) | mAP_t never falls | negative flips |",
        "|---|--:|--:|--:|--:|:-:|--:|",
    ]
    for r in rows:
        c = r.curve
        lines.append(
            f"| {r.name} | {100 * c.auc_map:.1f} | {100 * c.auc_cmc:.1f} | {_percent(r.gain_map)} "
            f"| {_percent(r.gain_cmc)} | {'yes' if c.monotone() else 'no'} | {c.flips} |"
        )
    for title, values in (("mAP_t", lambda c: c.maps), ("top-1_t", lambda c: c.top1s)):
        fractions = rows[0].curve.fractions if rows else FRACTIONS
        lines += [
            "",
            f"{title} (%) at t = " + ", ".join(f"{t:g}" for t in fractions) + ":",
            "",
            "| method | " + " | ".join(f"{t:g}" for t in fractions) + " |",
            "|---|" + "--:|" * len(fractions),
        ]
        for r in rows:
            lines.append(f"| {r.name} | " + " | ".join(f"{100 * v:.1f}" for v in values(r.curve)) + " |")
    return "\n".join(lines) + "\n"


def as_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The rows as plain JSON-ready dictionaries (fractions as given, metrics in [0, 1])."""
    return [r.as_dict() for r in rows]


def plot(rows: Sequence[Row], path: str | Path, *, title: str = "") -> Path | None:
    """mAP_t and top-1_t of every row, side by side, as a PNG (None, logged, without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        log.info("matplotlib is not installed: no plot (pip install rm-qdrant[plot])")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    styles = ["-", "--", "-.", ":"]  # past 20 rows, the colours repeat with another line style
    for i, r in enumerate(rows):
        t = r.curve.fractions
        style = {
            "color": plt.get_cmap("tab20")(i % 20),
            "linestyle": styles[(i // 20) % len(styles)],
            "marker": "o",
            "markersize": 3,
        }
        axes[0].plot(t, [100 * v for v in r.curve.maps], label=r.name, **style)
        axes[1].plot(t, [100 * v for v in r.curve.top1s], label=r.name, **style)
    for ax, ylabel in zip(axes, ("mAP (%)", "top-1 (%)"), strict=True):
        ax.set_xlabel("backfill fraction t")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
