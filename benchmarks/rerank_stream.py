"""Promotion and the demand order under a Zipf query stream: served mAP against points migrated.

    python benchmarks/rerank_stream.py [--zipf 1.0] [--k 50] [--per-round 100] [--batch 25]

A real trained pair on scikit-learn's digits (trained here on the CPU as ``rmq demo`` trains
them: old and new small CNNs, 12 epochs; cached under the cache root): the gallery is the
training split indexed by the old model, paired naive with the new model. The queries are the
test split; a stream draws them with Zipf popularity (query of rank r has weight 1/r^s, the
ranks a seeded shuffle). Each arm answers the same stream, ``--per-round`` queries a round,
then migrates ``--batch`` points in its order, until old is empty:

- ``random``, ``confidence``: the migration alone (searches change nothing);
- ``demand``: the searches record demand, the migration runs ``--order demand`` (ranked again
  each round), no re-rank;
- ``confidence + promotion``: searches re-rank with K and promote what they embedded;
- ``demand + promotion``: the same, the searches record demand, the migration runs
  ``--order demand`` (ranked again each round).

Before each round the pair is scored as it serves without a re-rank (the index's own quality:
what a search costs nothing extra for): mAP@100 over every test query, weighted by the
stream's popularity (what users see) and unweighted. Prints, per arm, the points in new when
each first reaches 95 % of New's (the gallery all in new), and the curves.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, migrate, open_store  # noqa: E402
from rm_qdrant.caches import cache_root  # noqa: E402
from rm_qdrant.core.rerank import Rerank  # noqa: E402
from rm_qdrant.evaluation.evaluate import ranked_precision  # noqa: E402
from rm_qdrant.operations.indexing import scan_image_folder  # noqa: E402

ARMS = {  # name: (order, promote, record demand)
    "random": ("random", False, False),
    "confidence": ("confidence", False, False),
    "demand": ("demand", False, True),
    "confidence + promotion": ("confidence", True, False),
    "demand + promotion": ("demand", True, True),
}


def trained_pair(epochs: int) -> tuple[Path, Path, Path]:
    """The digits folder and the old (with class scores) and new graphs, trained once."""
    from rm_qdrant_exporters.serving import export_backbone
    from rm_qdrant_train.backbone import train_backbone
    from rm_qdrant_train.config import BackboneConfig
    from rm_qdrant_train.demo import write_digits

    work = cache_root() / f"rerank-stream-digits-e{epochs}"
    data = work / "digits"
    if not (data / "test").is_dir():
        write_digits(data)
    for role in ("old", "new"):
        if not (work / f"{role}.pt").is_file():
            config = BackboneConfig(
                data=str(data), out=str(work / f"{role}.pt"), role=role, epochs=epochs, batch=64, lr=0.05
            )
            train_backbone(config)
    if not (work / "new.onnx").is_file():
        export_backbone(work / "old.pt", work / "old.onnx")
        export_backbone(work / "new.pt", work / "new.onnx", role="new", scores=False)
    return data, work / "old.onnx", work / "new.onnx"


def served_map(
    index: DualIndex, queries: dict, weights: np.ndarray, relevant: np.ndarray
) -> tuple[float, float]:
    """mAP@100 as the pair serves (no re-rank): weighted by popularity, and unweighted."""
    rows = index.search_vectors_batch(queries["new"], queries["old"], limit=100, rerank=None)
    aps = np.array(
        [
            ranked_precision(np.array([h.payload["label"] == label for h in hits]), int(n), 100)[0]
            for hits, label, n in zip(rows, queries["labels"], relevant, strict=True)
        ]
    )
    return float(aps @ weights), float(aps.mean())


def run_arm(arm: str, folder: Path, models: dict, queries: dict, stream: np.ndarray, args) -> list[dict]:
    order, promote, demand = ARMS[arm]
    store = open_store(folder / arm.replace(" ", "").replace("+", "-"))
    items = models["gallery"]
    index_images(store, "gallery", OnnxEncoder(models["old"]), items)
    create_pair(
        store,
        "p",
        old_collection="gallery",
        encoder=OnnxEncoder(models["new"]),
        old_encoder=OnnxEncoder(models["old"]),
    )
    rows = []
    answered = 0
    with DualIndex.open(store, "p", exact=True, demand=demand) as index:
        rerank = Rerank(args.k, deadline=5.0, promote=True) if promote else None
        while True:
            in_new = store.count("p-new")
            weighted, uniform = served_map(index, queries, models["weights"], models["relevant"])
            rows.append({"answered": answered, "in_new": in_new, "weighted": weighted, "uniform": uniform})
            if in_new >= len(items):
                break
            for q in stream[answered : answered + args.per_round]:
                index.search_vectors(queries["new"][q], queries["old"][q], limit=10, rerank=rerank)
            answered += args.per_round
            if index.promotions is not None:
                index._promoter.wait()
            if index.demand is not None:
                index.demand.flush()
            migrate(store, "p", limit=args.batch, order=order, batch=args.batch)
    store.close()
    return rows


def first_reaching(rows: list[dict], key: str, goal: float) -> tuple[int, int] | None:
    for row in rows:
        if row[key] >= goal:
            return row["in_new"], row["answered"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zipf", type=float, default=1.0, help="the stream's exponent s (weight 1/rank^s)")
    ap.add_argument("--k", type=int, default=50, help="re-rank K of the promoting arms")
    ap.add_argument("--per-round", type=int, default=100, help="queries answered between migration batches")
    ap.add_argument("--batch", type=int, default=25, help="points the migration moves a round")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    args = ap.parse_args()
    data, old, new = trained_pair(args.epochs)
    gallery = scan_image_folder(data / "train")
    tests = scan_image_folder(data / "test")
    uris = [t.uri for t in tests]
    labels = [t.label for t in tests]
    counts = {label: sum(g.label == label for g in gallery) for label in set(labels)}
    rng = np.random.default_rng(args.seed)
    popularity = rng.permutation(len(tests))  # popularity[r]: the query of rank r
    weights = np.zeros(len(tests))
    weights[popularity] = 1.0 / np.arange(1, len(tests) + 1) ** args.zipf
    weights /= weights.sum()
    total = (len(gallery) // args.batch + 2) * args.per_round
    stream = rng.choice(len(tests), size=total, p=weights)
    queries = {
        "new": OnnxEncoder(new).encode(uris, ["embedding"], query=True)["embedding"],
        "old": OnnxEncoder(old).encode(uris, ["embedding"], query=True)["embedding"],
        "labels": labels,
    }
    models = {
        "old": old,
        "new": new,
        "gallery": gallery,
        "weights": weights,
        "relevant": np.array([counts[label] for label in labels]),
    }
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {machine()}; date: {date.today()}")
    print(
        f"pair: digits, old and new small CNNs ({args.epochs} epochs, trained here), naive; gallery "
        f"{len(gallery)} training images, {len(tests)} test queries; Zipf s={args.zipf}: the top query "
        f"is {weights.max():.1%} of the stream, the top 10 {np.sort(weights)[-10:].sum():.1%}; "
        f"{args.per_round} queries, then {args.batch} points migrated, a round; "
        f"promoting arms re-rank K={args.k}\n"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="rmq-stream-") as tmp:
        for arm in args.arms:
            results[arm] = run_arm(arm, Path(tmp), models, queries, stream, args)
            print(f"  {arm}: {len(results[arm])} rounds", flush=True)
    print(
        "| arm | New (popularity-weighted mAP@100) | points in new at 95 % of New, weighted | queries then "
        "| points at 95 %, unweighted | queries then |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    for arm, rows in results.items():
        end = rows[-1]
        w = first_reaching(rows, "weighted", 0.95 * end["weighted"])
        u = first_reaching(rows, "uniform", 0.95 * end["uniform"])
        print(f"| {arm} | {end['weighted'] * 100:.1f} | {w[0]} | {w[1]} | {u[0]} | {u[1]} |")
    print("\nweighted mAP@100 (%) by points in new (every 4th round):\n")
    for arm, rows in results.items():
        shown = ", ".join(f"{r['in_new']}: {r['weighted'] * 100:.1f}" for r in rows[::4])
        print(f"- {arm}: {shown}")


if __name__ == "__main__":
    main()
