"""``rmq demo --text``: a text team's upgrade on the bundled corpus with a real pretrained pair.

The gallery is the bundled corpus's WordNet definitions in 20 categories
(:mod:`rm_qdrant.evaluation.text_corpus`), embedded by the old model (paraphrase-MiniLM-L3-v2)
into three copies of a Qdrant collection on the embedded store, the text in payload field
``text``. The new model is all-MiniLM-L6-v2 (int8 ONNX); both come from the pinned
``text-demo`` extra and are stamped with their tokenizer as ``rmq model stamp --tokenizer``
stamps them. Three pairs migrate the same points in the same (random, seeded) order:

- ``naive``: RM_naive, the plain distance merge (the new model queries new, the old queries old);
- ``calibrated``: the same, with the old distances mapped by ``rmq calibrate``;
- ``fit``: ``rmq fit``'s label-free ψ graph (no label is read), served in the rm mode;

and, as the baseline a team would otherwise reach for, Qdrant's reciprocal rank fusion
(qdrant-client's own ``reciprocal_rank_fusion``, its default constant) of the naive pair's two
halves: the new model's hits in new and the old model's in old, fused by rank.

By default the demo serves half the corpus (150 documents a category, 25 held-out queries a
category: :class:`DemoSize`), to stay within about 3 minutes on 2 cores. At t = 0, 0.1, ..., 1
each prints mAP@100 of the held-out queries (same category = relevant), served as a search
would serve them; the query vectors are computed once per pair (the graphs do not change) and
every step searches the store as it is then.

The two MiniLMs are not unrelated models: a new model's query against the old gallery already
scores six times chance (benchmarks/results/text_model_pair.md), so ψ starts from a head start
that two models of unrelated training would not give.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import models as qm
from qdrant_client.hybrid.fusion import reciprocal_rank_fusion

import rm_qdrant
from rm_qdrant import DualIndex, open_store
from rm_qdrant.core.metrics import FRACTIONS, area, gain
from rm_qdrant.errors import Refused
from rm_qdrant.evaluation.evaluate import ranked_precision
from rm_qdrant.evaluation.text_corpus import TextCorpus, TextSplit, load_text_corpus, stamp_demo_models
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.models.text import load_encoder

#: The systems of the table, in its order.
SYSTEMS = ("naive", "fit", "calibrated", "rrf")
K = 100


@dataclass(frozen=True)
class TextDemoRow:
    """One backfill step: the fraction in new and each system's served mAP@100."""

    t: float
    naive: float
    fit: float
    calibrated: float
    rrf: float


@dataclass
class TextDemo:
    """The table, and how the fit and the calibration went (``forced``: written past their guard)."""

    rows: list[TextDemoRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Area under each system's mAP curve, and the Gain of each between Old (t = 0) and New (t = 1)."""
        old, new = self.rows[0].naive, self.rows[-1].naive
        areas = {s: area([getattr(r, s) for r in self.rows]) for s in SYSTEMS}
        return {
            "old_map": old,
            "new_map": new,
            **{f"auc_{s}": v for s, v in areas.items()},
            **{f"gain_{s}": gain(v, old, new) for s, v in areas.items()},
        }


@dataclass(frozen=True)
class DemoSize:
    """How much of the corpus the demo serves, and how ``rmq fit`` and ``rmq calibrate`` sample it.

    The defaults keep ``rmq demo --text`` within about 3 minutes on 2 cores: half the gallery,
    half the queries, and ``rmq fit --loss procrustes`` (label-free, closed form; the default
    recipe search also picks Procrustes on this corpus, in minutes: benchmarks/text/demo_curve.py
    runs it on the whole corpus).
    """

    gallery_per_class: int = 150
    queries_per_class: int = 25
    fit_loss: str = "procrustes"
    sample: int = 2000


def run_text_demo(
    out: Path,
    *,
    size: DemoSize = DemoSize(),
    on_row: Callable[[TextDemoRow], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> TextDemo:
    """Stamp, index, calibrate, fit, then migrate the three pairs step by step and measure."""
    tell = on_stage or (lambda _: None)
    out.mkdir(parents=True, exist_ok=True)
    old_graph, new_graph = stamp_demo_models(out)
    corpus = _sized(load_text_corpus(), size)
    demo = TextDemo()
    folder = out / "qdrant-text"
    shutil.rmtree(folder, ignore_errors=True)  # the demo's own store, from an earlier run
    with open_store(folder) as store:
        tell(f"embedding {len(corpus.gallery.texts):,} documents with the old model")
        _index(store, corpus, load_encoder(old_graph))
        for name in ("naive", "calibrated"):
            rm_qdrant.init(
                store,
                name,
                old_collection=f"docs-{name}",
                encoder=new_graph,
                old_encoder=old_graph,
                text_field="text",
            )
        tell("rmq calibrate calibrated")
        demo.notes.append(
            _guarded(
                "calibrate",
                lambda force: rm_qdrant.calibrate(store, "calibrated", sample=size.sample, force=force),
            )
        )
        tell(f"rmq fit naive --loss {size.fit_loss} (label-free: the pair knows no label)")
        fitted = out / "fit.onnx"
        demo.notes.append(
            _guarded(
                "fit",
                lambda force: rm_qdrant.fit(
                    store,
                    "naive",
                    backbone=new_graph,
                    out=fitted,
                    loss=size.fit_loss,
                    sample=size.sample,
                    force=force,
                ),
            )
        )
        rm_qdrant.init(
            store, "fit", old_collection="docs-fit", encoder=fitted, old_encoder=old_graph, text_field="text"
        )
        indexes = {name: DualIndex.open(store, name, exact=True) for name in ("naive", "fit", "calibrated")}
        texts = list(corpus.queries.texts)
        vectors = {name: index.query_vectors(texts) for name, index in indexes.items()}
        labels = np.array(corpus.queries.labels)
        relevant = {label: int(np.sum(np.array(corpus.gallery.labels) == label)) for label in set(labels)}
        tell(f"migrating the three pairs step by step; {len(texts):,} queries at each step")
        for t in FRACTIONS:
            scores = {}
            for name, index in indexes.items():
                run_migration(index, MigrateOptions(until=t, batch=500, order="random"))
                hits = index.search_vectors_batch(*vectors[name], limit=K)
                scores[name] = _map(
                    [[h.payload.get("category") for h in row] for row in hits], labels, relevant
                )
            scores["rrf"] = _map(_fused(store, indexes["naive"], vectors["naive"]), labels, relevant)
            row = TextDemoRow(t, **scores)
            demo.rows.append(row)
            if on_row is not None:
                on_row(row)
    return demo


def _sized(corpus: TextCorpus, size: DemoSize) -> TextCorpus:
    """The first ``gallery_per_class`` documents and ``queries_per_class`` queries of each class."""
    return dataclasses.replace(
        corpus,
        gallery=_first(corpus.gallery, size.gallery_per_class),
        queries=_first(corpus.queries, size.queries_per_class),
    )


def _first(split: TextSplit, per_class: int) -> TextSplit:
    seen: dict[str, int] = {}
    keep = []
    for row, label in enumerate(split.labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] <= per_class:
            keep.append(row)
    return TextSplit(
        *(tuple(column[i] for i in keep) for column in (split.ids, split.texts, split.labels, split.lemmas))
    )


def _index(store: Any, corpus: TextCorpus, old: Any) -> None:
    gallery = corpus.gallery
    vectors = old.encode(list(gallery.texts))["embedding"]
    payloads = [  # the category is the team's own field: no pair is told it holds labels
        {"text": text, "category": label, "lemma": lemma}
        for text, label, lemma in zip(gallery.texts, gallery.labels, gallery.lemmas, strict=True)
    ]
    for name in ("naive", "calibrated", "fit"):
        store.create_collection(f"docs-{name}", dim=vectors.shape[1], distance="cosine")
        store.upsert(f"docs-{name}", list(gallery.ids), vectors, payloads)


def _guarded(what: str, call: Callable[[bool], Any]) -> str:
    """Run ``rmq fit`` / ``rmq calibrate``; where its guard refuses, run it forced and say so."""
    try:
        call(False)
    except Refused as exc:
        call(True)
        return f"{what}: the guard refused it ({exc}); shown anyway (--force)"
    return f"{what}: kept by its guard"


def _fused(store: Any, index: DualIndex, vectors: tuple[np.ndarray, np.ndarray]) -> list[list[Any]]:
    """Each query's labels in the order qdrant-client's RRF fuses the new model's hits in new and
    the old model's hits in old."""
    pair = index.pair
    new_hits = store.search(pair.new_collection, vectors[0], limit=K, exact=True)
    old_hits = store.search(pair.old_collection, vectors[1], limit=K, exact=True)
    fused = []
    for new_row, old_row in zip(new_hits, old_hits, strict=True):
        responses = [
            [qm.ScoredPoint(id=h.id, version=0, score=h.score, payload=h.payload) for h in row]
            for row in (new_row, old_row)
        ]
        fused.append([p.payload.get("category") for p in reciprocal_rank_fusion(responses, limit=K)])
    return fused


def _map(ranked: list[list[Any]], labels: np.ndarray, relevant: dict[str, int]) -> float:
    aps = [
        ranked_precision(np.array([r == label for r in row], bool), relevant[label], K)[0]
        for row, label in zip(ranked, labels, strict=True)
    ]
    return float(np.mean(aps))
