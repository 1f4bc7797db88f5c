"""Search overhead of DualIndex (old + new collection, merged) over one collection.

    python benchmarks/search_overhead.py --mode both

Loads N random vectors (standard normal, fixed seed) into an embedded EdgeStore
(``open_store(tmpdir)``) twice: split 50/50 between an old collection (even ids)
and a new one (odd ids) that a DualIndex serves, and whole into a single
collection. Both sides hold the same vectors, so the union's exact top-k is well
defined. Each query runs through ``DualIndex.search_vectors`` (same vector for
both sides) and ``store.search`` on the single collection, alternating which goes
first, so machine noise hits both alike. Prints p50/p99 latency, their ratios,
recall@k against numpy brute force, a merge-correctness count (exact mode) and
upsert throughput as a Markdown table.

Modes: ``exact`` searches with ``exact=True`` right after loading; ``hnsw`` calls
``store.optimize`` on every collection (qdrant-edge has no background optimizer)
and searches with ``exact=False``; ``both`` runs exact, then builds HNSW, then hnsw.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shlex
import sys
import tempfile
import time

import numpy as np

from rm_qdrant import DualIndex, open_store
from rm_qdrant.pair.record import ModelRef, PairRecord

OLD, NEW, ALL = "bench-old", "bench-new", "bench-all"


def load(store, name, ids, vectors, batch):
    """Create ``name`` and upsert ``vectors`` in batches; return seconds spent upserting."""
    store.create_collection(name, dim=vectors.shape[1], distance="cosine")
    start = time.perf_counter()
    for i in range(0, len(ids), batch):
        store.upsert(name, ids[i : i + batch].tolist(), vectors[i : i + batch])
    return time.perf_counter() - start


def exact_topk(gallery, queries, k):
    """Brute-force cosine top-k ids (ids are row numbers), best first."""
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    scores = q @ g.T
    part = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1)
    return np.take_along_axis(part, order, axis=1)


def floor_search(store, limit, exact, ef):
    """The floor under DualIndex: two raw qdrant-edge ``shard.query`` calls (old, then new) and
    ``rm_qdrant.core.merge`` on their results (reaches into EdgeStore: benchmark only)."""
    import qdrant_edge as qe

    from rm_qdrant.core.merge import Hit, merge

    shards = [(store._open(OLD)[1], "old"), (store._open(NEW)[1], "new")]
    params = qe.SearchParams(hnsw_ef=ef, exact=exact)

    def run(q):
        row, sides = q.tolist(), []
        for shard, side in shards:
            request = qe.QueryRequest(
                limit=limit, query=qe.Query.Nearest(row), params=params, with_payload=True
            )
            sides.append([Hit(p.id, p.score, 1.0 - p.score, side, p.payload) for p in shard.query(request)])
        return [h.id for h in merge(sides[0], sides[1], limit)]

    return run


def measure(dual, store, queries, limit, warmup):
    """Interleave dual, single and floor searches per query (who goes first rotates); return ms
    arrays and result ids."""

    call = {"exact": True} if dual.exact else {}  # per call: see search_recall.py's make

    def run_dual(q):
        return [h.id for h in dual.search_vectors(q, q, limit=limit, **call)]

    def run_single(q):
        hits = store.search(ALL, q[None, :], limit=limit, exact=dual.exact, hnsw_ef=dual.hnsw_ef)
        return [r.id for r in hits[0]]

    run_floor = floor_search(store, limit, dual.exact, dual.hnsw_ef)
    for q in queries[:warmup]:
        run_dual(q), run_single(q), run_floor(q)
    times = {"dual": [], "single": [], "floor": []}
    ids = {"dual": [], "single": [], "floor": []}
    order = [("dual", run_dual), ("single", run_single), ("floor", run_floor)]
    for i, q in enumerate(queries[warmup:]):
        for side, fn in order[i % 3 :] + order[: i % 3]:
            t0 = time.perf_counter()
            found = fn(q)
            times[side].append((time.perf_counter() - t0) * 1e3)
            ids[side].append(found)
    return {s: np.array(t) for s, t in times.items()}, ids


def recall(found, truth, k):
    return float(
        np.mean([len(set(f[:k]) & set(t[:k].tolist())) / k for f, t in zip(found, truth, strict=True)])
    )


def table_row(mode, times, found, truth, k):
    (d50, d99), (s50, s99) = (np.percentile(times[s], [50, 99]) for s in ("dual", "single"))
    rd, rs = recall(found["dual"], truth, k), recall(found["single"], truth, k)
    return (
        f"| {mode} | {d50:.3f} | {s50:.3f} | {d50 / s50:.2f}x | {d99:.3f} | {s99:.3f} "
        f"| {d99 / s99:.2f}x | {rd:.4f} | {rs:.4f} | {os.getloadavg()[0]:.1f} |"
    )


def floor_line(mode, times):
    """DualIndex against the floor (two raw searches plus the merge), issue 26's goal of 1.25."""
    (d50, d99), (f50, f99) = (np.percentile(times[s], [50, 99]) for s in ("dual", "floor"))
    ratio = d50 / f50
    return (
        f"{mode}: DualIndex.search_vectors p50 {d50 * 1e3:.0f} us (p99 {d99 * 1e3:.0f}), floor (two raw "
        f"shard.query + core.merge) p50 {f50 * 1e3:.0f} us (p99 {f99 * 1e3:.0f}): {ratio:.2f}x, "
        f"overhead {(d50 - f50) * 1e3:.0f} us (goal <= 1.25x: {'met' if ratio <= 1.25 else 'missed'}); "
        f"load 1m {os.getloadavg()[0]:.1f}"
    )


def tune(store):
    """What ``rmq init`` does to the vectors a pair searches, where this code has it (issue 26)."""
    try:
        from rm_qdrant.operations.create import tune_search
        from rm_qdrant.store.tuning import SERVING_FULL_SCAN_KB
    except ImportError:
        return "full_scan_threshold: Qdrant's default (this code has no tune_search)"
    tune_search(store, {OLD: [""], NEW: [""], ALL: [""]})
    return f"full_scan_threshold {SERVING_FULL_SCAN_KB} KB on every collection (as rmq init sets it)"


def indexed(store, name):
    """HNSW-indexed vectors of a collection (reaches into EdgeStore: benchmark only)."""
    return store._open(name)[1].info().indexed_vectors_count


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    edge = importlib.metadata.version("qdrant-edge-py")
    return f"nproc {cores}, {cpu}, Python {platform.python_version()}, qdrant-edge {edge}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50_000, help="gallery size (split 50/50 for dual)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=300, help="timed queries (after warm-up)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--batch", type=int, default=5_000, help="upsert batch size")
    ap.add_argument("--mode", choices=["exact", "hnsw", "both"], default="both")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hnsw-ef", type=int, default=None, help="HNSW search breadth (Qdrant's default)")
    args = ap.parse_args()
    wall = time.perf_counter()

    rng = np.random.default_rng(args.seed)
    gallery = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    queries = rng.standard_normal((args.warmup + args.queries, args.dim), dtype=np.float32)
    truth = exact_topk(gallery, queries[args.warmup :], args.limit)
    ids = np.arange(args.n)
    even, odd = ids[0::2], ids[1::2]

    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="rmq-bench-") as tmp:
        store = open_store(tmp)
        t_split = load(store, OLD, even, gallery[even], args.batch)
        t_split += load(store, NEW, odd, gallery[odd], args.batch)
        t_single = load(store, ALL, ids, gallery, args.batch)
        notes.append(
            f"upsert throughput (batches of {args.batch}): split old+new {args.n / t_split:,.0f} pts/s, "
            f"single {args.n / t_single:,.0f} pts/s"
        )
        model = ModelRef("bench", "0", args.dim, "-")
        pair = PairRecord("bench", OLD, NEW, "rm", "cosine", model)

        modes = ["exact", "hnsw"] if args.mode == "both" else [args.mode]
        floors = []
        for mode in modes:
            exact = mode == "exact"
            if not exact:
                notes.append(tune(store))
                built = []
                for name in (OLD, NEW, ALL):
                    t0 = time.perf_counter()
                    store.optimize(name)
                    seconds = time.perf_counter() - t0
                    built.append(f"{name} {seconds:.1f} s ({indexed(store, name):,} indexed)")
                notes.append("HNSW build (store.optimize): " + ", ".join(built))
                if any(indexed(store, c) < store.count(c) for c in (OLD, NEW, ALL)):
                    notes.append(
                        "WARNING: not every vector is HNSW-indexed (N below the indexing threshold?)"
                    )
            dual = DualIndex(store, pair, exact=exact, hnsw_ef=args.hnsw_ef)  # vectors only, no encoder
            times, found = measure(dual, store, queries, args.limit, args.warmup)
            dual.close()
            rows.append(table_row(mode, times, found, truth, args.limit))
            floors.append(floor_line(mode, times))
            if exact:
                ordered = sum(f == t.tolist() for f, t in zip(found["dual"], truth, strict=True))
                as_set = sum(set(f) == set(t.tolist()) for f, t in zip(found["dual"], truth, strict=True))
                notes.append(
                    f"merge check (exact): {ordered}/{len(truth)} queries' merged top-{args.limit} ids "
                    f"equal the brute-force top-{args.limit} over the union in order "
                    f"({as_set}/{len(truth)} as sets)"
                )
        store.close()

    k = args.limit
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"machine: {machine()}")
    print(
        f"setup: N={args.n:,} ({len(even):,} old + {len(odd):,} new vs {args.n:,} in one), "
        f"dim {args.dim}, cosine, limit {k}, hnsw_ef {args.hnsw_ef or 'default'}, "
        f"{args.queries} queries after {args.warmup} warm-up, "
        f"embedded EdgeStore (dual searches old then new, in turn), interleaved; load 1m: "
        "os.getloadavg()[0] (a shared machine)\n"
    )
    print(
        "| mode | dual p50 ms | single p50 ms | p50 ratio | dual p99 ms | single p99 ms "
        f"| p99 ratio | dual recall@{k} | single recall@{k} | load 1m |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for row in rows:
        print(row)
    print()
    for line in floors:
        print(f"- {line}")
    for note in notes:
        print(f"- {note}")
    print(f"- total wall time: {time.perf_counter() - wall:.1f} s")


if __name__ == "__main__":
    main()
