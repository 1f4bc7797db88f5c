"""What a search costs with and without ties at its end, a checkout at a time (issue 45, item 6).

    python benchmarks/search_ties.py [--n 20000] [--runs 3]
    ROOT=/path/to/other/checkout python benchmarks/search_ties.py   # the same, on that checkout

A pair on the embedded store over ``--n`` random 6-d points (cosine), half of them written to
new through ``DualIndex.upsert_vectors``, paired and single-collection; ``--dups``: that share of
the points are exact copies of 50 vectors (ties), queried at one of them. Both collections are
optimised (HNSW), then 300 searches a case are timed, p50 after 20 warm-up searches: ``limit=10``
and ``limit=10, offset=20``, HNSW (``exact=False``) and exact. Run this file of each checkout in
turn to compare two (the ``rm_qdrant:`` line says which one a run imported).

``--ab`` (this checkout only): in one process, on the same pair, alternate query by query the
merged search for ``limit=10`` as it ran before ties were resolved (one search a side for 10,
merged) with ``DualIndex._search`` (11 a side, asked again while a tie ends a side's answer):
the tie rule's cost, without the noise of two processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.environ.get("ROOT") or str(Path(__file__).resolve().parents[1]))
import rm_qdrant  # noqa: E402
from rm_qdrant import DualIndex, create_pair, open_store  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from user_writes import DIM, encoder  # noqa: E402

QUERIES, WARMUP, COPIED = 300, 20, 50
CASES = [(10, 0, False), (10, 20, False), (10, 0, True)]  # limit, offset, exact


def one_run(n: int, layout: str, dups: float, ab: bool = False) -> dict[Any, float]:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    copies = rng.random(n) < dups
    vectors[copies] = vectors[rng.integers(0, COPIED, int(copies.sum()))]
    with tempfile.TemporaryDirectory(prefix="rmq-ties-") as tmp:
        store = open_store(Path(tmp) / "q")
        store.create_collection("old", dim=DIM, distance="cosine")
        store.upsert("old", list(range(n)), vectors, [{"n": i} for i in range(n)])
        single = {"layout": "single-collection", "new_vector": "new"} if layout == "single" else {}
        create_pair(store, "p", old_collection="old", encoder=encoder(Path(tmp)), **single)
        index = DualIndex.open(store, "p")
        moved = list(range(0, n, 2))
        for start in range(0, len(moved), 1000):
            ids = moved[start : start + 1000]
            index.upsert_vectors(ids, vectors[ids], None, old_vectors=vectors[ids] if single else None)
        for name in {"old", index.pair.new_collection}:
            store.optimize(name)
        queries = rng.normal(size=(QUERIES, DIM)).astype(np.float32)
        if dups:
            queries = vectors[rng.integers(0, COPIED, QUERIES)]  # a query at copies: a tie at its end
        p50 = ab_p50(index, rng.normal(size=(1500, 1, DIM)).astype(np.float32)) if ab else {}
        for limit, offset, exact in [] if ab else CASES:
            times = []
            for query in queries:
                began = time.perf_counter()
                index.search_vectors(query, query, limit=limit, offset=offset, exact=exact)
                times.append(time.perf_counter() - began)
            p50[(limit, offset, exact)] = statistics.median(times[WARMUP:])
        store.close()
    return p50


def ab_p50(index: DualIndex, queries: np.ndarray) -> dict[Any, float]:
    """p50 of the untied merge (``before``) and of DualIndex._search (``after``), alternated."""
    from rm_qdrant.core.merge import merge
    from rm_qdrant.serving.search_options import SearchOptions

    opts = SearchOptions()

    def before(q: np.ndarray) -> None:
        new_q, old_q, _ = index._queries(q, q)
        found, _ = index._search_once(new_q, old_q, 10, None, opts)
        [merge(old, new, 10) for old, new in found]

    flows = {"before": before, "after": lambda q: index._search(q, q, 10, None, opts)}
    times: dict[Any, list[float]] = {name: [] for name in flows}
    for k, query in enumerate(queries):
        for name in sorted(flows, reverse=k % 2 == 1):
            began = time.perf_counter()
            flows[name](query)
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(t[WARMUP:]) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dups", type=float, default=0.0, help="share of points that are copies")
    parser.add_argument("--ab", action="store_true", help="before/after in one process (see above)")
    args = parser.parse_args()
    print(f"rm_qdrant: {Path(rm_qdrant.__file__).parent}")
    for run in range(args.runs):
        for layout in ("paired", "single"):
            p50 = one_run(args.n, layout, args.dups, args.ab)
            if args.ab:
                cases = "; ".join(f"{name} {t * 1e3:.3f} ms" for name, t in p50.items())
                print(f"run {run + 1} {layout}: p50 limit 10 {cases}; load {os.getloadavg()[0]:.1f}")
                continue
            cases = "; ".join(
                f"limit {lim} offset {off}{' exact' if ex else ''} {t * 1e3:.3f} ms"
                for (lim, off, ex), t in p50.items()
            )
            print(f"run {run + 1} {layout}: p50 {cases}; load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
