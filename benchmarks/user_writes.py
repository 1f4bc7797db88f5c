"""What an application's write through DualIndex and a search cost on a paired pair, a checkout at a time.

    python benchmarks/user_writes.py [--n 20000] [--writes 2000] [--runs 2] [--keep]
    ROOT=/path/to/other/checkout python benchmarks/user_writes.py   # the same, on that checkout

A paired pair on the embedded store over ``--n`` random 6-d points (cosine); the application
writes ``--writes`` of them through ``DualIndex.upsert_vectors`` in batches of 100 (wall time a
point: each write goes to new, then leaves old), then both collections are optimised and 300
searches of ``limit=10`` are timed (p50 after 20 warm-up searches). Run this file of each
checkout in turn to compare two (the ``rm_qdrant:`` line says which one a run imported).
``--keep`` times, instead, writes that keep the payload (``payloads=None``) of points written
once already (in new only): what reading the copy a point serves from costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("ROOT") or str(Path(__file__).resolve().parents[1]))
import rm_qdrant  # noqa: E402
from rm_qdrant import DualIndex, InputSpec, OnnxEncoder, create_pair, open_store  # noqa: E402
from rm_qdrant_exporters.linear import linear_encoder  # noqa: E402

DIM, BATCH, QUERIES, WARMUP = 6, 100, 300, 20


def encoder(folder: Path) -> OnnxEncoder:
    """An rm graph for 6-d vectors (stamped for any distance): what create_pair needs."""
    rng = np.random.default_rng(5)
    path = linear_encoder(
        folder / "rm.onnx",
        [("new", "pixels", rng.normal(size=(192, DIM))), ("rev", "new", np.eye(DIM))],
        input_spec=InputSpec(height=8, width=8, channels=3),
        name="user-writes",
        distance=None,
    )
    return OnnxEncoder(path)


def one_run(n: int, writes: int, keep: bool = False) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="rmq-writes-") as tmp:
        store = open_store(Path(tmp) / "q")
        vectors = rng.normal(size=(n, DIM)).astype(np.float32)
        store.create_collection("old", dim=DIM, distance="cosine")
        store.upsert("old", list(range(n)), vectors, [{"n": i} for i in range(n)])
        create_pair(store, "p", old_collection="old", encoder=encoder(Path(tmp)))
        index = DualIndex.open(store, "p")
        batches = [list(range(start, min(start + BATCH, writes))) for start in range(0, writes, BATCH)]
        for ids in batches if keep else []:  # first written with a payload, untimed
            index.upsert_vectors(ids, vectors[ids], [{"n": i} for i in ids])
        started = time.perf_counter()
        for ids in batches:
            index.upsert_vectors(ids, vectors[ids], None if keep else [{"n": i} for i in ids])
        per_write = (time.perf_counter() - started) / writes
        store.optimize("old")
        store.optimize("p-new")
        queries = rng.normal(size=(QUERIES, DIM)).astype(np.float32)
        times = []
        for query in queries:
            began = time.perf_counter()
            index.search_vectors(query, query, limit=10)
            times.append(time.perf_counter() - began)
        store.close()
    return per_write, statistics.median(times[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--writes", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="time writes that keep the payload")
    args = parser.parse_args()
    print(f"rm_qdrant: {Path(rm_qdrant.__file__).parent}")
    kept = " (payloads=None)" if args.keep else ""
    for run in range(args.runs):
        write, search = one_run(args.n, args.writes, args.keep)
        print(
            f"run {run + 1}: upsert_vectors{kept} {write * 1e6:.0f} µs a point; "
            f"search p50 {search * 1e3:.3f} ms; "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
