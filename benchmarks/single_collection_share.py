"""Single-collection against paired search as the backfill goes on, with and without ACORN.

The gallery of ``search_recall.py --data cifar-old`` (the old small CNN's CIFAR-10
embeddings on both sides, 50,000 points, 300 test-image queries after 20 warm-up), built by
its ``build`` at each migrated share of ``--shares``: the paired DualIndex, the
single-collection one as it is (its old prefetch with ACORN under Qdrant's own 0.4
selectivity cut-off, the default since issue 26's ACORN change), and the single-collection
one with ACORN on its prefetches
(``search_params=SearchParams(acorn=AcornSearchParams(enable=True, max_selectivity=1.0))``
per call: Qdrant's filtered-HNSW search that also walks neighbours' neighbours, for the old
prefetch's "lacks the new vector" filter). Recall@10 against the paired DualIndex's exact
top 10; p50 and p99 are medians over ``--repeats`` passes, the three in turn per pass.
``--full-scan-kb KB`` tunes every searched vector as ``rmq init --full-scan-kb KB`` does
(default: as ``rmq init`` without it).

Run: ``python benchmarks/single_collection_share.py [--shares 0.25 0.5 0.75] [--full-scan-kb KB]
[--out FILE]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
from qdrant_client import models

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import search_recall as sr  # noqa: E402
from benchmarks.cifar import ROOT  # noqa: E402
from benchmarks.search_overhead import machine  # noqa: E402
from rm_qdrant import DualIndex, open_store  # noqa: E402
from rm_qdrant.pair.record import SINGLE, ModelRef, PairRecord  # noqa: E402

ACORN = models.SearchParams(acorn=models.AcornSearchParams(enable=True, max_selectivity=1.0))
EFS = (10, 16, 24, 32, 64)
K, WARMUP, QUERIES = 10, 20, 300


def timed(index: DualIndex, queries: tuple, truth: list, ef: int, extra: dict) -> tuple[float, float, float]:
    """(recall@10, p50 ms, p99 ms) of ``index`` at ``ef`` over the timed queries."""
    q_new, q_old = queries
    for i in range(WARMUP):
        index.search_vectors(q_new[i], q_old[i], limit=K, hnsw_ef=ef, **extra)
    times, found = [], []
    for j, i in enumerate(range(WARMUP, WARMUP + QUERIES)):
        began = time.perf_counter()
        hits = index.search_vectors(q_new[i], q_old[i], limit=K, hnsw_ef=ef, **extra)
        times.append(time.perf_counter() - began)
        found.append(len({h.id for h in hits} & truth[j]) / K)
    return float(np.mean(found)), float(np.median(times)) * 1e3, float(np.percentile(times, 99)) * 1e3


def one_share(share: float, repeats: int, kb: int | None = None) -> list[str]:
    rng = np.random.default_rng(0)
    data = argparse.Namespace(data="cifar-old", n=50_000, warmup=WARMUP, queries=QUERIES)
    g_old, g_new, q_new, q_old = sr.dataset(data, rng)
    in_new = np.zeros(len(g_new), bool)
    in_new[rng.choice(len(g_new), round(len(g_new) * share), replace=False)] = True
    rows = []
    with tempfile.TemporaryDirectory(prefix="rmq-share-") as tmp:
        store = open_store(tmp)
        sr.build(store, g_old, g_new, in_new, kb)
        model = ModelRef("bench", "0", 128, "-")
        paired = DualIndex(store, PairRecord("bench", sr.OLD, sr.NEW, "rm", "cosine", model))
        one = DualIndex(
            store,
            PairRecord("bench-one", sr.ONE, sr.ONE, "rm", "cosine", model, layout=SINGLE, new_vector="new"),
        )
        timed_range = range(WARMUP, WARMUP + QUERIES)
        truth = [
            {h.id for h in paired.search_vectors(q_new[i], q_old[i], limit=K, exact=True)}
            for i in timed_range
        ]
        searchers = {
            "paired": (paired, {}),
            "single-collection": (one, {}),
            "with ACORN": (one, {"search_params": ACORN}),
        }
        figures: dict[tuple[str, int], list] = {}
        loads = []
        for _ in range(repeats):
            for ef in EFS:
                for name, (index, extra) in searchers.items():
                    figures.setdefault((name, ef), []).append(timed(index, (q_new, q_old), truth, ef, extra))
                loads.append(os.getloadavg()[0])
        store.close()
    for name in searchers:
        for ef in EFS:
            runs = figures[(name, ef)]
            p50, p99 = (statistics.median(r[i] for r in runs) for i in (1, 2))
            rows.append(f"| {share:.0%} | {name} | {ef} | {runs[0][0]:.4f} | {p50:.3f} | {p99:.3f} |")
    rows.append(f"| {share:.0%} | load 1m | | | {min(loads):.1f}-{max(loads):.1f} | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", nargs="+", type=float, default=[0.25, 0.5, 0.75])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-scan-kb", type=int, default=None, help="as rmq init --full-scan-kb")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "single_collection_share.md"
    )
    args = parser.parse_args()
    lines = [
        "# Single-collection against paired search by migrated share, with and without ACORN",
        "",
        f"- Command: `python {' '.join(sys.argv)}`",
        f"- Machine: {machine()}; date: {date.today()}",
        "- cifar-old gallery (50,000 points, 128-d, cosine), "
        + ("as `rmq init` tunes it" if args.full_scan_kb is None else f"`--full-scan-kb {args.full_scan_kb}`")
        + "; 300 queries; "
        f"recall@10 against the exact paired top 10; p50/p99 medians of {args.repeats} passes",
        "",
        "| migrated | searcher | hnsw_ef | recall@10 | p50 ms | p99 ms |",
        "|--:|---|--:|--:|--:|--:|",
    ]
    for share in args.shares:
        lines += one_share(share, args.repeats, args.full_scan_kb)
        print("\n".join(lines[-(3 * len(EFS) + 1) :]), flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
