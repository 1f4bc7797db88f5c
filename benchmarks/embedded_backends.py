"""Which embedded backend: qdrant-client's local mode or qdrant-edge?

Loads the same N random vectors into each backend's on-disk store and times the
writes (points/s) and exact top-10 queries (p50/p99 ms), interleaving the two
backends' queries so machine noise hits both alike.

Run: ``python benchmarks/embedded_backends.py [--n 50000] [--dim 128] [--queries 200]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from qdrant_client import QdrantClient, models

from rm_qdrant import open_store


def percentiles(samples: list[float]) -> str:
    ms = np.asarray(samples) * 1000
    return f"{np.percentile(ms, 50):.2f} / {np.percentile(ms, 99):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1_000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Local mode is not recommended")  # that is the point
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(args.n, args.dim)).astype(np.float32)
    queries = rng.normal(size=(args.queries, args.dim)).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        client = QdrantClient(path=str(Path(tmp) / "client"))
        client.create_collection(
            "c", vectors_config=models.VectorParams(size=args.dim, distance=models.Distance.COSINE)
        )
        edge = open_store(Path(tmp) / "edge")
        edge.create_collection("c", dim=args.dim, distance="cosine")

        load = {}
        start = time.perf_counter()
        for i in range(0, args.n, args.batch):
            ids = list(range(i, min(i + args.batch, args.n)))
            client.upload_points(
                "c", [models.PointStruct(id=j, vector=vectors[j].tolist()) for j in ids], wait=True
            )
        load["qdrant-client local"] = args.n / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(0, args.n, args.batch):
            ids = list(range(i, min(i + args.batch, args.n)))
            edge.upsert("c", ids, vectors[ids])
        load["qdrant-edge (EdgeStore)"] = args.n / (time.perf_counter() - start)

        times: dict[str, list[float]] = {k: [] for k in load}
        agree = 0
        for q in queries:
            t0 = time.perf_counter()
            a = client.query_points("c", query=q.tolist(), limit=10).points
            t1 = time.perf_counter()
            b = edge.search("c", q[None, :], limit=10, exact=True)[0]
            t2 = time.perf_counter()
            times["qdrant-client local"].append(t1 - t0)
            times["qdrant-edge (EdgeStore)"].append(t2 - t1)
            agree += [p.id for p in a] == [h.id for h in b]
        client.close()
        edge.close()

    print(f"N={args.n}, dim={args.dim}, cosine, exact top-10, {args.queries} queries\n")
    print("| backend | upsert to disk (points/s) | query p50 / p99 (ms) |")
    print("|---|---|---|")
    for name in load:
        print(f"| {name} | {load[name]:,.0f} | {percentiles(times[name])} |")
    print(f"\nsame top-10 ids on both: {agree}/{args.queries} queries")


if __name__ == "__main__":
    main()
