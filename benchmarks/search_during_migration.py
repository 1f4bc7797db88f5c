"""Search latency while a migration runs, against the same search after it, on the embedded store.

Indexes CIFAR-10 JPEGs (real files from ../shared/data) into an old collection with a random
64-d CNN (benchmarks/convnet.py), builds its index, then migrates a fresh copy of it in a
``--layout`` to a 128-d encoder that costs almost nothing (the CPU side of a GPU backfill),
once for each ``--optimize-every`` (seconds between the migration's index builds; ``none``:
only at the end of the run). A thread searches through ``DualIndex.search_vectors`` (limit
10, random queries, fixed seed) the whole time; after the run (and its last build) the same
queries run again. Prints p50, p99 and the longest search, the migration's throughput and the
time it spent building indexes, and the 1-minute load average (``os.getloadavg()``) beside
each figure: the machine may be shared.

Note: qdrant-edge 0.9 holds Python's GIL while it builds an index, so every thread of the
process (a search, the migration's own fetches) waits for a build: it shows as the longest
search.

Run: ``python benchmarks/search_during_migration.py [--n 20000] [--layout paired]
[--optimize-every none 10 30]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cifar import cifar_root  # noqa: E402
from benchmarks.convnet import NULL, SMALL, convnet_encoder  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder  # noqa: E402
from rm_qdrant.migration.migrate import MigrateOptions, run_migration  # noqa: E402
from rm_qdrant.migration.ranking import prepare_order, read_all  # noqa: E402
from rm_qdrant.pair.record import LAYOUTS, SINGLE  # noqa: E402
from rm_qdrant.store import Where  # noqa: E402


def copy_gallery(store, model: Path, name: str, layout: str) -> DualIndex:
    """A fresh, indexed copy of the gallery's old collection, paired with ``model``, ordered (untimed)."""
    ids, payloads, vectors = read_all(store, "gallery", Where(), True)
    store.create_collection(f"{name}-old", dim=vectors.shape[1], distance="cosine")
    for start in range(0, len(ids), 5_000):
        end = start + 5_000
        store.upsert(f"{name}-old", ids[start:end], vectors[start:end], payloads[start:end])
    new_vector = "new" if layout == SINGLE else None
    create_pair(
        store,
        name,
        old_collection=f"{name}-old",
        encoder=OnnxEncoder(model),
        layout=layout,
        new_vector=new_vector,
    )
    index = DualIndex.open(store, name)
    index.pair = prepare_order(store, index.pair, "random")
    store.optimize(f"{name}-old")  # the gallery as it served before the backfill
    return index


def searching(index: DualIndex, queries: tuple[np.ndarray, np.ndarray], stop: threading.Event) -> list[float]:
    """Search ``queries`` round and round until ``stop``; the latencies in milliseconds."""
    new, old = queries
    times: list[float] = []
    k = 0
    while not stop.is_set():
        started = time.perf_counter()
        index.search_vectors(new[k % len(new)], old[k % len(old)], limit=10)
        times.append((time.perf_counter() - started) * 1e3)
        k += 1
    return times


def figures(times: list[float]) -> str:
    p50, p99 = np.percentile(times, [50, 99])
    return f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, longest {max(times):.0f} ms ({len(times)} searches)"


def one_run(store, model: Path, name: str, layout: str, every: float | None, batch: int) -> None:
    index = copy_gallery(store, model, name, layout)
    rng = np.random.default_rng(0)
    queries = (rng.normal(size=(200, 128)).astype(np.float32), rng.normal(size=(200, 64)).astype(np.float32))
    stop = threading.Event()
    during: list[float] = []
    thread = threading.Thread(target=lambda: during.extend(searching(index, queries, stop)))
    thread.start()
    report = run_migration(index, MigrateOptions(batch=batch, fetch_workers=4, optimize_every=every))
    load_during = os.getloadavg()[0]
    stop.set()
    thread.join()
    stop = threading.Event()
    after: list[float] = []
    thread = threading.Thread(target=lambda: after.extend(searching(index, queries, stop)))
    thread.start()
    time.sleep(max(3.0, min(report.seconds, 10.0)))
    stop.set()
    thread.join()
    shown = "none (end only)" if every is None else f"{every:g} s"
    print(
        f"| {layout} | {shown} | {report.moved / report.seconds:,.0f} points/s | "
        f"{report.optimize_seconds:.1f} s of {report.seconds:.1f} s | {figures(during)} "
        f"| {load_during:.1f} | {figures(after)} | {os.getloadavg()[0]:.1f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="images in the gallery (CIFAR-10 train)")
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--layout", choices=list(LAYOUTS), nargs="+", default=["paired"])
    parser.add_argument("--optimize-every", nargs="+", default=["none", "30"], help="seconds, or none")
    parser.add_argument(
        "--small", action="store_true", help="the tiny CNN (~6 M multiply-adds) as the new encoder"
    )
    args = parser.parse_args()
    items = scan_image_folder(cifar_root() / "train")[: args.n]
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {machine()}; load average at start {os.getloadavg()[0]:.1f} (shared machine)")
    print(f"gallery: {args.n:,} CIFAR-10 JPEGs, batch {args.batch}, embedded store\n")
    print(
        "| layout | optimize every | migration | building indexes | search while migrating | load "
        "| search after | load |\n|---|---|--:|--:|---|--:|---|--:|"
    )
    with tempfile.TemporaryDirectory(prefix="rmq-searchmig-") as tmp:
        folder = Path(tmp)
        old = OnnxEncoder(convnet_encoder(folder / "old.onnx", heads={"embedding": ("features", 64)}, seed=1))
        store = open_store(folder / "qdrant")
        index_images(store, "gallery", old, items, batch_size=args.batch)
        heads = {"new": ("features", 128), "rev": ("new", 64)}
        model = convnet_encoder(
            folder / "new.onnx", heads=heads, stages=SMALL if args.small else NULL, seed=2
        )
        for r, (layout, every) in enumerate((la, ev) for la in args.layout for ev in args.optimize_every):
            seconds = None if every == "none" else float(every)
            one_run(store, model, f"run{r}", layout, seconds, args.batch)
        store.close()


if __name__ == "__main__":
    main()
