"""Served Gain with the re-rank at K = 10, 50, 100 on the real text pair, through DualIndex.

    python benchmarks/text/rerank_curve.py [--per-class 300] [--queries 50]

The pair of ``rmq demo --text`` (paraphrase-MiniLM-L3-v2 → all-MiniLM-L6-v2 int8, ONNX) over the
bundled WordNet corpus (6,000 definitions in 20 categories, 1,000 held-out queries; relevant: the
same category, which no pair is told of). Two pairs over copies of the old collection: the
naive pair (old and new model), and the label-free ``rmq fit`` graph (``--loss procrustes``: the
recipe the default search keeps on this corpus, see benchmarks/results/text_demo_curve.md). Both
migrate in one seeded random order; at each t every query is served by ``DualIndex.
search_vectors_batch`` for 100 hits, plainly and with ``rerank=K``: the re-rank reads each old
hit's text from its payload and embeds it with the new model (one long-lived index a pair, so the
cache carries vectors from one t to the next, as a serving process's does). mAP@100 as served;
Gain = (AUC - AUC_Old) / (AUC_New - AUC_Old), Old the naive pair at t = 0 and New at t = 1, both
without the re-rank.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rm_qdrant  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, open_store  # noqa: E402
from rm_qdrant.core.metrics import FRACTIONS, area, gain  # noqa: E402
from rm_qdrant.core.rerank import Rerank  # noqa: E402
from rm_qdrant.evaluation.evaluate import ranked_precision  # noqa: E402
from rm_qdrant.evaluation.text_corpus import load_text_corpus, stamp_demo_models  # noqa: E402
from rm_qdrant.migration.migrate import MigrateOptions, run_migration  # noqa: E402
from rm_qdrant.models.text import load_encoder  # noqa: E402
from rm_qdrant_train.text_demo import DemoSize, _sized  # noqa: E402

KS = (10, 50, 100)
LIMIT = 100


def served_map(index: DualIndex, vectors, labels, relevant, rerank: Rerank | None) -> float:
    rows = index.search_vectors_batch(*vectors, limit=LIMIT, rerank=rerank)
    aps = [
        ranked_precision(np.array([h.payload.get("category") == label for h in row]), relevant[label], LIMIT)[
            0
        ]
        for row, label in zip(rows, labels, strict=True)
    ]
    return float(np.mean(aps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-class", type=int, default=300)
    ap.add_argument("--queries", type=int, default=50)
    args = ap.parse_args()
    started = time.perf_counter()
    corpus = _sized(
        load_text_corpus(), DemoSize(gallery_per_class=args.per_class, queries_per_class=args.queries)
    )
    curves: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rmq-text-rerank-") as tmp:
        out = Path(tmp)
        old_graph, new_graph = stamp_demo_models(out)
        gallery = corpus.gallery
        vectors = load_encoder(old_graph).encode(list(gallery.texts))["embedding"]
        payloads = [{"text": t, "category": c} for t, c in zip(gallery.texts, gallery.labels, strict=True)]
        with open_store(out / "qdrant") as store:
            for name in ("naive", "fit"):
                store.create_collection(f"docs-{name}", dim=vectors.shape[1], distance="cosine")
                store.upsert(f"docs-{name}", list(gallery.ids), vectors, payloads)
            rm_qdrant.init(
                store,
                "naive",
                old_collection="docs-naive",
                encoder=new_graph,
                old_encoder=old_graph,
                text_field="text",
            )
            fitted = out / "fit.onnx"
            rm_qdrant.fit(
                store, "naive", backbone=new_graph, out=fitted, loss="procrustes", sample=20000, force=True
            )
            rm_qdrant.init(
                store,
                "fit",
                old_collection="docs-fit",
                encoder=fitted,
                old_encoder=old_graph,
                text_field="text",
            )
            print(f"[{time.perf_counter() - started:.0f} s] pairs ready", flush=True)
            indexes = {name: DualIndex.open(store, name, exact=True) for name in ("naive", "fit")}
            texts = list(corpus.queries.texts)
            labels = list(corpus.queries.labels)
            relevant = {label: int(np.sum(np.array(gallery.labels) == label)) for label in set(labels)}
            queries = {name: index.query_vectors(texts) for name, index in indexes.items()}
            for t in FRACTIONS:
                for name, index in indexes.items():
                    run_migration(index, MigrateOptions(until=t, batch=500, order="random"))
                    for k in (None, *KS):
                        rerank = None if k is None else Rerank(k, deadline=600.0)
                        key = name if k is None else f"{name} + re-rank K={k}"
                        curves.setdefault(key, []).append(
                            served_map(index, queries[name], labels, relevant, rerank)
                        )
                print(f"[{time.perf_counter() - started:.0f} s] t={t:.1f}", flush=True)
            for index in indexes.values():
                index.close()
    auc_old = area([curves["naive"][0]] * len(FRACTIONS))
    auc_new = area([curves["naive"][-1]] * len(FRACTIONS))
    naive = curves["naive"]
    print(f"\ncommand: python {' '.join(sys.argv)}")
    print(f"machine: {machine()}; date: {date.today()}; {time.perf_counter() - started:.0f} s")
    print(
        f"{len(gallery.texts):,} documents, {len(texts):,} queries; mAP@100 (%) as served; "
        f"Old {100 * naive[0]:.1f}, New {100 * naive[-1]:.1f}\n"
    )
    print("| pair | " + " | ".join(f"t={t:.1f}" for t in FRACTIONS) + " | Gain | ≥ RM_naive at every t |")
    print("|---|" + "--:|" * (len(FRACTIONS) + 1) + ":-:|")
    for key, maps in curves.items():
        above = all(m >= n - 1e-9 for m, n in zip(maps, naive, strict=True))
        cells = " | ".join(f"{100 * m:.1f}" for m in maps)
        share = gain(area(maps), auc_old, auc_new)
        print(f"| {key} | {cells} | {100 * share:.0f} % | {'yes' if above else 'no'} |")


if __name__ == "__main__":
    main()
