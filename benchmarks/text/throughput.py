"""How much the migration of a text pair keeps of its encoder's own speed (issue 41's goal: ≥ 0.8).

The bundled corpus's 6,000 gallery definitions (rm_qdrant/data/text), the real new model
(all-MiniLM-L6-v2, int8 ONNX, from the pinned ``text-demo`` extra), stamped as ``rmq model
stamp --tokenizer`` stamps it. Three figures, texts a second, on the same texts in the same
batches (``--batch``, the migration's default 500), each the median of ``--runs``:

- ``encoder alone``: ``run_pixels`` on rows tokenised beforehand (the graph and its pooling only);
- ``tokenise + encode``: each batch tokenised by the encoder's own ``decode`` (as the
  migration's fetch threads do, on one thread here), then ``run_pixels``;
- ``migration``: ``rm_qdrant.migrate`` of a paired text pair on the embedded store, texts in the
  payload (``--text-field``): read, tokenise, encode, write and settle, as ``rmq migrate`` runs.

Run: ``python benchmarks/text/throughput.py [--batch 500] [--runs 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import rm_qdrant  # noqa: E402
from rm_qdrant.evaluation.text_corpus import load_text_corpus, stamp_demo_models  # noqa: E402
from rm_qdrant.models.text import load_encoder  # noqa: E402
from rm_qdrant.store import open_store  # noqa: E402


def encoder_alone(encoder, rows: np.ndarray, batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(rows), batch):
        encoder.run_pixels(rows[start : start + batch])
    return len(rows) / (time.perf_counter() - started)


def tokenise_and_encode(encoder, texts: list[str], batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        rows = np.stack([encoder.decode(t) for t in texts[start : start + batch]])
        encoder.run_pixels(rows)
    return len(texts) / (time.perf_counter() - started)


def migration(folder: Path, graph: Path, texts: list[str], batch: int, run: int) -> float:
    with open_store(folder / f"store-{run}") as store:
        store.create_collection("docs", dim=384, distance="cosine")
        rng = np.random.default_rng(run)
        old = rng.normal(size=(len(texts), 384)).astype(np.float32)  # the old model's: never read
        ids = list(range(len(texts)))
        store.upsert("docs", ids, old, [{"text": t} for t in texts])
        rm_qdrant.init(
            store, "docs", old_collection="docs", encoder=graph, old_encoder=graph, text_field="text"
        )
        started = time.perf_counter()
        report = rm_qdrant.migrate(store, "docs", batch=batch)
        seconds = time.perf_counter() - started
    assert report.moved == len(texts), report
    return len(texts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    texts = list(load_text_corpus().gallery.texts)
    with tempfile.TemporaryDirectory(prefix="rmq-text-throughput-") as tmp:
        folder = Path(tmp)
        graph = stamp_demo_models(folder)[1]
        encoder = load_encoder(graph)
        rows = np.stack([encoder.decode(t) for t in texts])
        encoder_alone(encoder, rows[:500], args.batch)  # warm
        figures: dict[str, list[float]] = {"encoder alone": [], "tokenise + encode": [], "migration": []}
        for run in range(args.runs):
            figures["encoder alone"].append(encoder_alone(encoder, rows, args.batch))
            figures["tokenise + encode"].append(tokenise_and_encode(encoder, texts, args.batch))
            figures["migration"].append(migration(folder, graph, texts, args.batch, run))
        tokens = rows[:, 1].sum(axis=1)
        shape = f"{tokens.mean():.1f} tokens on average (max {tokens.max()})"
        print(f"{len(texts):,} texts, {shape}, batch {args.batch}")
        base = statistics.median(figures["encoder alone"])
        print(f"{'':20}{'texts/s (median)':>18}{'runs':>28}{'of encoder alone':>18}")
        for name, values in figures.items():
            shown = ", ".join(f"{v:,.0f}" for v in values)
            median = statistics.median(values)
            print(f"{name:20}{median:18,.0f}{shown:>28}{median / base:18.2f}")


if __name__ == "__main__":
    main()
