"""What recording search demand costs (issue 44, ``rmq migrate --order demand``).

    python benchmarks/demand_cost.py [--n 50000] [--out benchmarks/results/demand_cost.md]

A paired pair on the embedded store over ``--n`` random 6-d points (cosine; payloads of a URI
and a label, as a gallery has), its old collection optimised (HNSW). Measured in one process:

- ``record``: :meth:`DemandLog.record` of one query's old hits (5 ids of a 10-hit list), the ids
  drawn from a Zipf stream (exponent 1.1) over the gallery; the mean of 200,000 calls and the
  p50/p99 of batches of 1,000 calls, per call;
- ``flush``: :meth:`DemandLog.flush` of N distinct counted ids (N = 100, 1,000, 10,000), first
  onto points without a count, then onto points that have one; the median of 5 flushes each;
- per query, amortised: at Q queries/s with ``flush_every`` 5 s, one flush carries the distinct
  old hits of 5 Q queries of the Zipf stream; the record plus that flush shared by its queries,
  next to a ``DualIndex.search_vectors(limit=10)`` p50/p99 on the same pair for scale, alone and
  while a thread flushes 1,000 ids back to back (the worst a flusher can do to searches);
- the ranking an unsharded ``--order demand`` run does at its start (``prepare_order``: read
  every old payload, write every rank), once.

Figures on a shared 2-core machine: the 1-minute load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_overhead import machine  # noqa: E402
from user_writes import DIM, encoder  # noqa: E402

from rm_qdrant import DualIndex, create_pair, load_pair, open_store  # noqa: E402
from rm_qdrant.migration.ranking import prepare_order  # noqa: E402
from rm_qdrant.serving.demand import DemandLog  # noqa: E402

ZIPF, OLD_HITS, RECORDS, CHUNK, FLUSH_EVERY = 1.1, 5, 200_000, 1_000, 5.0
SIZES, RATES, REPEATS = (100, 1_000, 10_000), (20, 200), 5


def zipf_queries(rng: np.random.Generator, n: int, queries: int) -> list[list[int]]:
    """``queries`` lists of OLD_HITS distinct ids, popular ids drawn most (a Zipf rank over a
    fixed shuffle of the gallery)."""
    shuffle = rng.permutation(n)
    out = []
    for _ in range(queries):
        ranks = set()
        while len(ranks) < OLD_HITS:
            ranks.add(int(min(rng.zipf(ZIPF), n)) - 1)
        out.append([int(shuffle[r]) for r in ranks])
    return out


def time_records(demand: DemandLog, queries: list[list[int]]) -> tuple[float, float, float]:
    """Mean, p50 and p99 µs per record call (chunks of CHUNK calls timed together)."""
    per_chunk = []
    for start in range(0, len(queries), CHUNK):
        chunk = queries[start : start + CHUNK]
        began = time.perf_counter()
        for ids in chunk:
            demand.record(ids)
        per_chunk.append((time.perf_counter() - began) / len(chunk) * 1e6)
    demand.flush()  # leave nothing behind for the flush timings
    return (
        statistics.fmean(per_chunk),
        float(np.percentile(per_chunk, 50)),
        float(np.percentile(per_chunk, 99)),
    )


def time_flush(demand: DemandLog, ids: list[int]) -> float:
    """Milliseconds of one flush of ``ids`` (counted once each)."""
    demand.record(ids)
    began = time.perf_counter()
    written = demand.flush()
    seconds = time.perf_counter() - began
    if written != len(ids):
        raise RuntimeError(f"flush wrote {written} of {len(ids)} points")
    return seconds * 1e3


def median_ms(call: Callable[[], float]) -> float:
    return statistics.median(call() for _ in range(REPEATS))


def build(folder: Path, n: int):
    rng = np.random.default_rng(0)
    store = open_store(folder / "q")
    store.create_collection("old", dim=DIM, distance="cosine")
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    for start in range(0, n, 5_000):
        ids = list(range(start, min(n, start + 5_000)))
        payloads = [{"uri": f"s3://bucket/photos/{i:08d}.jpg", "label": f"class-{i % 100}"} for i in ids]
        store.upsert("old", ids, vectors[ids], payloads)
    create_pair(store, "p", old_collection="old", encoder=encoder(folder))
    store.optimize("old")
    return store


def search_ms(index: DualIndex, rng: np.random.Generator) -> tuple[float, float]:
    """p50 and p99 ms of 500 searches (after 20 warm-up ones)."""
    times = []
    for query in rng.normal(size=(520, DIM)).astype(np.float32):
        began = time.perf_counter()
        index.search_vectors(query, query, limit=10)
        times.append(time.perf_counter() - began)
    kept = np.array(times[20:]) * 1e3
    return float(np.percentile(kept, 50)), float(np.percentile(kept, 99))


def search_while_flushing(index: DualIndex, demand: DemandLog, ids: list[int], rng) -> tuple[float, float]:
    """:func:`search_ms` while another thread flushes ``ids`` over and over."""
    done = threading.Event()

    def flushing() -> None:
        while not done.is_set():
            demand.record(ids)
            demand.flush()

    thread = threading.Thread(target=flushing)
    thread.start()
    try:
        return search_ms(index, rng)
    finally:
        done.set()
        thread.join()


def measure(store, n: int) -> list[str]:
    rng = np.random.default_rng(1)
    pair = load_pair(store, "p")
    lines = []
    with DemandLog(store, pair, flush_every=3600) as demand:
        mean, p50, p99 = time_records(demand, zipf_queries(rng, n, RECORDS))
        lines.append(
            f"record, {OLD_HITS} old hits of a 10-hit list: mean {mean:.2f} µs, p50 {p50:.2f} µs, "
            f"p99 {p99:.2f} µs a query ({RECORDS:,} queries, Zipf {ZIPF})"
        )
        lines.append("")
        lines.append("| distinct ids | flush, points without a count | flush, points with one |")
        lines.append("|---:|---:|---:|")
        for size in (s for s in SIZES if s <= n):
            fresh = rng.choice(np.arange(n), size=size, replace=False).tolist()
            first = time_flush(demand, fresh)  # these have no count yet (or a few from the stream)
            again = median_ms(lambda ids=fresh: time_flush(demand, ids))
            lines.append(f"| {size:,} | {first:.1f} ms | {again:.1f} ms |")
        lines.append("")
        index = DualIndex.open(store, "p")
        alone = search_ms(index, rng)
        busy = search_while_flushing(
            index, demand, rng.choice(np.arange(n), min(n, 1_000), False).tolist(), rng
        )
        lines.append(
            "search_vectors(limit=10) on this pair, for scale: "
            f"p50 {alone[0]:.2f} ms, p99 {alone[1]:.2f} ms; "
            f"while a thread flushes 1,000 ids back to back: p50 {busy[0]:.2f} ms, p99 {busy[1]:.2f} ms"
        )
        lines.append("")
        lines.append("| queries/s | distinct old hits a flush | flush | record + flush share, a query |")
        lines.append("|---:|---:|---:|---:|")
        for rate in RATES:
            window = zipf_queries(rng, n, int(rate * FLUSH_EVERY))
            distinct = sorted({i for ids in window for i in ids})
            flush = median_ms(lambda ids=distinct: time_flush(demand, ids))
            share = mean + flush * 1e3 / len(window)
            lines.append(f"| {rate} | {len(distinct):,} | {flush:.1f} ms | {share:.1f} µs |")
    began = time.perf_counter()
    prepare_order(store, pair, "demand")
    lines.append("")
    lines.append(
        f"ranking {n:,} old points in demand order (each unsharded run): {time.perf_counter() - began:.1f} s"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="gallery size")
    parser.add_argument("--out", type=Path, help="also write the figures to this Markdown file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmq-demand-") as tmp:
        store = build(Path(tmp), args.n)
        try:
            lines = measure(store, args.n)
        finally:
            store.close()
    head = [
        "# What recording search demand costs",
        "",
        f"`python benchmarks/demand_cost.py --n {args.n}`: embedded store, paired pair of {args.n:,} "
        f"points; {machine()}; load {os.getloadavg()[0]:.1f} (1 min) at the end.",
        "",
    ]
    text = "\n".join(head + lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
