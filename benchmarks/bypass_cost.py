"""What serving a bypassing writer's stale copies from old costs a search and a count (issue 38).

    python benchmarks/bypass_cost.py [--n 20000] [--stale 20]

A paired pair on the embedded store over ``--n`` random 6-d points (cosine), ranked (random
order), half of them written to new through ``DualIndex.upsert_vectors``; then ``--stale`` of
those rewritten in old with the store directly, as a plain qdrant-client writer would. Both
collections optimised (HNSW). In one process, query by query alternated (so the machine's load
weighs on both alike): ``DualIndex.search_vectors(limit=10)`` and ``count()`` with the stale-copy
check (``after``) and with it replaced by a no-op (``before``, this checkout's code otherwise).
p50 after 20 warm-up calls, 600 calls each.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from user_writes import DIM, encoder  # noqa: E402

from rm_qdrant import DualIndex, create_pair, open_store  # noqa: E402
from rm_qdrant.migration.ranking import prepare_order  # noqa: E402
from rm_qdrant.serving import pair_points, pair_search  # noqa: E402

CALLS, WARMUP = 600, 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--stale", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(args.n, DIM)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="rmq-bypass-") as tmp:
        store = open_store(Path(tmp) / "q")
        store.create_collection("old", dim=DIM, distance="cosine")
        store.upsert("old", list(range(args.n)), vectors, [{"n": i} for i in range(args.n)])
        create_pair(store, "p", old_collection="old", encoder=encoder(Path(tmp)))
        index = DualIndex.open(store, "p")
        index.pair = prepare_order(store, index.pair, "random")
        moved = list(range(0, args.n, 2))
        for start in range(0, len(moved), 1000):
            ids = moved[start : start + 1000]
            index.upsert_vectors(ids, vectors[ids], None)
        stale = moved[: args.stale]
        store.upsert("old", stale, vectors[stale], [{"n": -1}] * len(stale))  # a plain writer
        for name in ("old", "p-new"):
            store.optimize(name)
        index = DualIndex.open(store, "p")
        load = os.getloadavg()[0]
        print(f"{args.n} points, {args.stale} stale copies; count {index.count()}; load {load:.1f}")
        real = (pair_search.without_stale, pair_points.stale_copies)
        off = (lambda store, pair, found, *rest: found, lambda *a, **k: [])
        calls = {
            "search": lambda q: index.search_vectors(q, q, limit=10),
            "count": lambda q: index.count(),
        }
        for name, call in calls.items():
            times: dict[str, list[float]] = {"before": [], "after": []}
            for k, query in enumerate(rng.normal(size=(CALLS, DIM)).astype(np.float32)):
                for flow in sorted(times, reverse=k % 2 == 1):
                    pair_search.without_stale, pair_points.stale_copies = real if flow == "after" else off
                    began = time.perf_counter()
                    call(query)
                    times[flow].append(time.perf_counter() - began)
            p50 = {flow: statistics.median(t[WARMUP:]) * 1e3 for flow, t in times.items()}
            print(f"{name}: p50 before {p50['before']:.3f} ms, after {p50['after']:.3f} ms")
        store.close()


if __name__ == "__main__":
    main()
