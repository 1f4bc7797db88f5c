"""What an application's rewrite of existing points through DualIndex costs on a single-collection
pair, a checkout at a time.

    python benchmarks/single_writes.py [--n 20000] [--writes 2000] [--runs 3]
    ROOT=/path/to/other/checkout python benchmarks/single_writes.py   # the same, on that checkout

A single-collection pair on the embedded store over ``--n`` random 6-d points (cosine, the old
vector unnamed, the new one ``new``); the application rewrites ``--writes`` of them through
``DualIndex.upsert_vectors`` in batches of 100, first with payloads, then keeping them
(``payloads=None``): CPU time a point for each (all threads), and the least of the runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("ROOT") or str(Path(__file__).resolve().parents[1]))
import rm_qdrant  # noqa: E402
from rm_qdrant import DualIndex, create_pair, open_store  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from user_writes import BATCH, DIM, encoder  # noqa: E402


def one_run(n: int, writes: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="rmq-single-writes-") as tmp:
        store = open_store(Path(tmp) / "q")
        vectors = rng.normal(size=(n, DIM)).astype(np.float32)
        store.create_collection("photos", dim=DIM, distance="cosine")
        store.upsert("photos", list(range(n)), vectors, [{"n": i} for i in range(n)])
        rm = encoder(Path(tmp))
        create_pair(
            store, "p", old_collection="photos", encoder=rm, layout="single-collection", new_vector="new"
        )
        index = DualIndex.open(store, "p")
        timed = []
        for payloads in (True, False):
            started = (
                time.process_time()
            )  # CPU time of every thread: steadier than wall time on a busy machine
            for start in range(0, writes, BATCH):
                ids = list(range(start, min(start + BATCH, writes)))
                index.upsert_vectors(ids, vectors[ids], [{"n": i} for i in ids] if payloads else None)
            timed.append((time.process_time() - started) / writes)
        store.close()
    return timed[0], timed[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--writes", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the rollback warning each write without old vectors gives
    print(f"rm_qdrant: {Path(rm_qdrant.__file__).parent}")
    runs = []
    for run in range(args.runs):
        given, kept = one_run(args.n, args.writes)
        runs.append((given, kept))
        print(
            f"run {run + 1}: rewrite with payload {given * 1e6:.0f} µs CPU a point, "
            f"payload kept {kept * 1e6:.0f} µs; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    given, kept = (min(column) for column in zip(*runs, strict=True))
    print(f"least: rewrite with payload {given * 1e6:.0f} µs CPU a point, payload kept {kept * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
