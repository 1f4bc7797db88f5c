"""What a re-ranked query costs: p50/p99 ms and images read per query, by K, on the embedded store.

    python benchmarks/rerank_cost.py                      # CIFAR-size JPEGs, small CNN and ResNet-18 size
    python benchmarks/rerank_cost.py --photos --k 10 50   # the realistic photo gallery's sizes

A pair over ``--n`` CIFAR-10 test JPEGs (32x32) indexed by an old small CNN (random weights: the
cost of a model is its size, not its weights; benchmarks/convnet.py), an rm graph of the chosen
size as the new model, ``--moved`` of the gallery migrated. Each query image (from CIFAR-10
train, never in the gallery) is searched for 10 hits without a re-rank and with ``rerank=K``,
alternating which goes first so machine noise hits both alike. ``cold``: every query's
old candidates are read from disk and embedded (the cache turned off); ``warm``: the same
queries a second time with the cache on, the new-model vectors from it. ``--photos``: the
gallery is the realistic photo gallery (benchmarks/photo_gallery.py: 640x427 to 4240x2832
JPEG, PNG, WebP), decoded to the graph's 224x224 input. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import cifar_root  # noqa: E402
from benchmarks.convnet import RESNET18_SIZE, SMALL, convnet_encoder  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, migrate, open_store  # noqa: E402
from rm_qdrant.core.rerank import Rerank  # noqa: E402
from rm_qdrant.operations.indexing import ImageItem, scan_image_folder  # noqa: E402

MODELS = {"small-cnn": SMALL, "resnet18-size": RESNET18_SIZE}


def gallery_items(args: argparse.Namespace, tmp: Path) -> tuple[list[ImageItem], list[str], int]:
    """The gallery's items, the query images, and the graph's input size."""
    if args.photos:
        from benchmarks.photo_gallery import build, default_folder

        folder, _ = build(default_folder())
        photos = sorted(p for p in folder.iterdir() if p.suffix in (".jpg", ".png", ".webp"))
        # each point its own path (a link to one of the photos): the cache and the reads see N items
        links = tmp / "photos"
        links.mkdir()
        items = []
        for i in range(args.n):
            photo = photos[i % len(photos)]
            link = links / f"{i}{photo.suffix}"
            link.symlink_to(photo)
            items.append(ImageItem(str(link), "photo"))
        return items, [str(p) for p in photos[: args.queries]], 224
    items = scan_image_folder(cifar_root() / "test")[: args.n]
    queries = [i.uri for i in scan_image_folder(cifar_root() / "train")[: args.queries]]
    return items, queries, 32


def timed(index: DualIndex, query: str, rerank: Rerank | None) -> tuple[float, int]:
    reads = index._reranker.reads if index._reranker is not None else 0
    start = time.perf_counter()
    index.search(query, limit=10, rerank=rerank)
    seconds = time.perf_counter() - start
    after = index._reranker.reads if index._reranker is not None else 0
    return seconds * 1000, after - reads


def measure(store, name: str, queries: list[str], k: int, deadline: float) -> dict:
    """Plain and re-ranked queries, alternating; ``cold`` with the cache off (every candidate
    read and embedded for each query), ``warm`` with it on, the second time round."""
    plain, cold, warm, reads = [], [], [], []
    with DualIndex.open(store, name) as index:
        index.search(queries[0], limit=10)  # sessions loaded, first search paid
        rerank = Rerank(k, deadline=deadline)
        index._rescorer().cache.max_bytes = 0
        for i, query in enumerate(queries):
            order = [None, rerank] if i % 2 else [rerank, None]
            for plan in order:
                ms, read = timed(index, query, plan)
                if plan is None:
                    plain.append(ms)
                else:
                    cold.append(ms)
                    reads.append(read)
        index._rescorer().cache.max_bytes = 1 << 30
        for query in queries:
            timed(index, query, rerank)
        for query in queries:
            warm.append(timed(index, query, rerank)[0])
    return {"plain": plain, "cold": cold, "warm": warm, "reads": reads}


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5_000, help="gallery images")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--k", type=int, nargs="+", default=[10, 50, 100])
    ap.add_argument("--moved", type=float, default=0.0, help="share of the gallery migrated first")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument(
        "--deadline", type=float, default=5.0, help="per-query deadline (s): long, to time it all"
    )
    ap.add_argument("--photos", action="store_true", help="the realistic photo gallery instead of CIFAR-10")
    args = ap.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="rmq-rerank-items-")
    items, queries, size = gallery_items(args, Path(scratch.name))
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {machine()}; date: {date.today()}")
    what = "photo gallery (640x427 to 4240x2832)" if args.photos else "CIFAR-10 test JPEGs (32x32)"
    print(
        f"gallery: {len(items):,} {what}, {args.moved:.0%} migrated; {len(queries)} queries, limit 10; "
        f"graph input {size}x{size}; embedded store; deadline {args.deadline} s\n"
    )
    print(
        "| new model | K | plain p50 ms | re-rank cold p50 | cold p99 | images read / query "
        "| warm p50 | warm p99 |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for key in args.models:
        with tempfile.TemporaryDirectory(prefix="rmq-rerank-") as tmp:
            folder = Path(tmp)
            old = convnet_encoder(
                folder / "old.onnx", heads={"embedding": ("features", 64)}, size=size, seed=1
            )
            rm = convnet_encoder(
                folder / "rm.onnx",
                heads={"new": ("features", 128), "rev": ("new", 64)},
                stages=MODELS[key],
                size=size,
                seed=2,
            )
            store = open_store(folder / "qdrant")
            index_images(store, "gallery", OnnxEncoder(old), items, batch_size=500)
            create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(rm))
            if args.moved:
                migrate(store, "p", until=args.moved)
            for k in args.k:
                got = measure(store, "p", queries, k, args.deadline)
                print(
                    f"| {key} | {k} | {p(got['plain'], 50):.1f} | {p(got['cold'], 50):.1f} | "
                    f"{p(got['cold'], 99):.1f} | {statistics.mean(got['reads']):.1f} | "
                    f"{p(got['warm'], 50):.1f} | {p(got['warm'], 99):.1f} |",
                    flush=True,
                )
            store.close()


if __name__ == "__main__":
    main()
