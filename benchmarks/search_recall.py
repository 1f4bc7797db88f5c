"""Dual search at equal recall: what DualIndex costs over one collection when both reach a recall.

    python benchmarks/search_recall.py --data cifar
    python benchmarks/search_recall.py --data gaussian
    python benchmarks/search_recall.py --data cifar-old [--full-scan-kb KB --out search_recall-cifar-old-kbKB]

A gallery halfway through a backfill: a random ``--new-share`` of its points migrated, the
rest not, served by a DualIndex in ``rm`` mode in both layouts of a pair: ``paired`` (new
points in a new collection with their new-model vectors, the rest in old with their old-model
vectors) and ``single-collection`` (one collection holding every point's old vector as the
unnamed vector and, for the same migrated points, the new one as the named vector ``new``;
DualIndex sends one query: a prefetch per vector and a ``max`` formula). Beside them one
collection of every point's new vector (what serves once the backfill is done). All
HNSW-indexed (``store.optimize``), embedded EdgeStore. ``cifar``: benchmarks/cifar_features.py's
vectors, N train images as the gallery, held-out test images as queries; dual sends a query's
``new`` vector to new and ``rev`` (ψ) to old, single sends ``new``. ``cifar-old``: the old small
CNN's CIFAR embeddings (cifar_features.old_features) on both sides, as gaussian has its vectors.
``gaussian``:
search_overhead.py's setup (N standard normal vectors, the same on both sides, the same query
vector to both).

Truth: each one's exact top-k (``exact=True``; the paired dual's checked against numpy over
the union, the single-collection one against the paired one), timed head to head for the
exact ratios. The sweep runs each searcher alone over the queries at each ``hnsw_ef``: single,
the paired DualIndex as it is (``same ef``) and per-side variants (a store wrapper rewrites
each side's ef), the single-collection DualIndex (both prefetches get hnsw_ef). At each recall
target, each dual's cheapest ef and single's run head to head (the paired ``same ef``, the
single-collection one and single interleaved in one run). Writes
benchmarks/results/search_recall-<data>.md and .json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.search_overhead import indexed, load, machine  # noqa: E402
from rm_qdrant import DualIndex, open_store  # noqa: E402
from rm_qdrant.pair.record import SINGLE, ModelRef, PairRecord  # noqa: E402
from rm_qdrant.store import Where  # noqa: E402

OLD, NEW, ALL, ONE = "bench-old", "bench-new", "bench-all", "bench-one"
SAME, SC = "same ef", "single-collection"  # the paired DualIndex as it is; the one-collection one
RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = (0.95, 0.99)


class SideEf:
    """The store, except that search gives each collection the ef ``pick(ef, name)`` says."""

    def __init__(self, store, pick):
        self._store, self._pick = store, pick

    def __getattr__(self, name):
        return getattr(self._store, name)

    def search(self, name, queries, **kw):
        params = kw["search_params"]  # DualIndex sends its ef in search_params
        ef = self._pick(params.hnsw_ef, name)
        return self._store.search(
            name, queries, **{**kw, "search_params": params.model_copy(update={"hnsw_ef": ef})}
        )


def variants(limit, share):
    """Per-side ef rules: name -> (ef, collection) -> that side's ef (None: DualIndex as it is)."""
    return {
        SAME: None,
        "ef x share": lambda ef, name: max(limit, round(ef * share[name])),
        "old at limit": lambda ef, name: limit if name == OLD else ef,
        "old at ef/2": lambda ef, name: max(limit, ef // 2) if name == OLD else ef,
    }


def dataset(args, rng):
    """(gallery old vectors, gallery new vectors, query new vectors, query old-side vectors)."""
    if args.data == "gaussian":
        gallery = rng.standard_normal((args.n, 128), dtype=np.float32)
        queries = rng.standard_normal((args.warmup + args.queries, 128), dtype=np.float32)
        return gallery, gallery, queries, queries
    if args.data == "cifar-old":
        from benchmarks.cifar_features import old_features

        uris, vectors = old_features()
        test = np.array(["/test/" in u for u in uris])
        train, held_out = np.flatnonzero(~test), np.flatnonzero(test)
        g = np.sort(rng.choice(train, args.n, replace=False)) if args.n < len(train) else train
        q = rng.choice(held_out, args.warmup + args.queries, replace=False)
        return vectors[g], vectors[g], vectors[q], vectors[q]
    from benchmarks.cifar_features import cifar_features

    f = cifar_features()
    test = np.array(["/test/" in u for u in f.uris])
    train, held_out = np.flatnonzero(~test), np.flatnonzero(test)
    g = np.sort(rng.choice(train, args.n, replace=False)) if args.n < len(train) else train
    q = rng.choice(held_out, args.warmup + args.queries, replace=False)
    return f.old[g], f.new[g], f.new[q], f.rev[q]


def build(store, g_old, g_new, in_new, kb, batch=5_000):
    """The four collections, HNSW-built; a note on the build."""
    ids = np.arange(len(g_new))
    olds, news = ids[~in_new], ids[in_new]
    load(store, OLD, olds, g_old[olds], batch)
    load(store, NEW, news, g_new[news], batch)
    load(store, ALL, ids, g_new, batch)
    load(store, ONE, ids, g_old, batch)  # every point's old vector (unnamed) ...
    store.add_vector(ONE, "new", dim=g_new.shape[1], distance="cosine")
    for i in range(0, len(news), batch):  # ... and the migrated points' new one, as migration adds it
        part = news[i : i + batch]
        store.set_vectors(ONE, part.tolist(), g_new[part], vector="new", where=Where(lacks_vector=("new",)))
    tuned = tune(store, {OLD: [""], NEW: [""], ALL: [""], ONE: ["", "new"]}, kb)
    t0 = time.perf_counter()
    for name in (OLD, NEW, ALL, ONE):
        store.optimize(name)
    # indexed_vectors_count counts each vector: ONE holds the old one of every point, and the new one
    held = {c: store.count(c) for c in (OLD, NEW, ALL)} | {ONE: len(ids) + len(news)}
    built = [(c, indexed(store, c), held[c]) for c in held]
    warn = "" if all(i == c for _, i, c in built) else "WARNING, not all indexed (plain search): "
    return (
        f"{tuned}; HNSW built in {time.perf_counter() - t0:.1f} s; {warn}vectors indexed/held: "
        + ", ".join(f"{name} {i:,}/{c:,}" for name, i, c in built)
    )


def tune(store, vectors, kb):
    """What ``rmq init`` does to the vectors a pair searches: with ``--full-scan-kb KB``, KB on
    every one; without, 1,000 KB on the single-collection pair's ``new`` vector alone."""
    from rm_qdrant.operations.create import tune_search
    from rm_qdrant.store.tuning import SERVING_FULL_SCAN_KB

    if kb is None:
        tune_search(store, {ONE: ["new"]}, SERVING_FULL_SCAN_KB)
        return (
            f"full_scan_threshold {SERVING_FULL_SCAN_KB} KB on the single-collection pair's new vector, "
            "Qdrant's default on the rest (rmq init without --full-scan-kb)"
        )
    tune_search(store, vectors, kb)
    return f"full_scan_threshold {kb} KB on every searched vector (as rmq init --full-scan-kb {kb} sets it)"


def load1():
    return os.getloadavg()[0]


def union_truth(g_old, g_new, in_new, q_new, q_old, k):
    """Brute-force top-k ids over the union (old side cos(q_old, old), new side cos(q_new, new)),
    and per side the median cosine distance of that side's own k-th nearest point."""

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    sims = np.where(in_new, unit(q_new) @ unit(g_new).T, unit(q_old) @ unit(g_old).T)
    kth = {
        s: 1 - np.median(-np.partition(-sims[:, m], k - 1, axis=1)[:, k - 1])
        for s, m in (("old", ~in_new), ("new", in_new))
    }
    return np.argsort(-sims, axis=1, kind="stable")[:, :k], kth


def timed_rounds(searchers, n_queries, warmup):
    """Run every searcher on every query, rotating who goes first; ms and ids per searcher."""
    names = list(searchers)
    for i in range(warmup):
        for fn in searchers.values():
            fn(i)
    times, ids = ({s: [] for s in names} for _ in range(2))
    for j in range(n_queries):
        r = j % len(names)
        for s in names[r:] + names[:r]:
            t0 = time.perf_counter()
            found = searchers[s](warmup + j)
            times[s].append((time.perf_counter() - t0) * 1e3)
            ids[s].append(found)
    return times, ids


def summary(times, found, truth, k):
    """Recall@k of ``found`` against ``truth``, p50 and p99 of ``times``."""
    rec = np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)])
    p50, p99 = np.percentile(times, [50, 99])
    return {"recall": float(rec), "p50_ms": float(p50), "p99_ms": float(p99), "load": load1()}


def equal_recall(rows, labels, make, args):
    """At each target, each dual's cheapest ef and single's, timed head to head: the paired
    ``same ef`` and the single-collection DualIndex in one interleaved run with single, each
    per-side variant in its own run with single."""
    equal = []
    for target in TARGETS:
        best = {}
        for s in ["single", *labels]:
            hit = [r for r in rows if r["searcher"] == s and r["recall"] >= target]
            best[s] = min(hit, key=lambda r: r["ef"]) if hit else None
        base = best.pop("single")
        for group in [[SAME, SC]] + [[s] for s in best if s not in (SAME, SC)]:
            entries = {s: {"target": target, "searcher": s, "ef": best[s] and best[s]["ef"]} for s in group}
            timed = [s for s in group if best[s] is not None]
            if timed and (base is not None or len(timed) > 1):  # the two layouts, single or not
                fns = {s: make(s, best[s]["ef"]) for s in timed}
                if base is not None:
                    fns["single"] = make("single", base["ef"])
                times, _ = timed_rounds(fns, args.queries, args.warmup)
                pct = {s: np.percentile(t, [50, 99]).tolist() for s, t in times.items()}
                for s in timed:
                    e = entries[s] | {"dual_recall": best[s]["recall"], "load": load1()}
                    for i, p in enumerate((50, 99)):
                        e[f"dual_p{p}_ms"] = pct[s][i]
                        if base is not None:
                            e["single_recall"], e[f"single_p{p}_ms"] = base["recall"], pct["single"][i]
                            e[f"p{p}_ratio"] = pct[s][i] / pct["single"][i]
                        if s == SC and SAME in timed:
                            e[f"p{p}_vs_paired"] = pct[SC][i] / pct[SAME][i]
                    entries[s] = e
            for e in entries.values():
                equal.append(e | {"single_ef": base and base["ef"]})
    return equal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=["cifar", "cifar-old", "gaussian"], default="cifar")
    ap.add_argument("--n", type=int, default=50_000, help="gallery size (cifar: at most the 50,000 train)")
    ap.add_argument("--new-share", type=float, default=0.5, help="fraction of the gallery already in new")
    ap.add_argument("--queries", type=int, default=300, help="timed queries (after warm-up)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--efs", default="10,16,24,32,48,64,96,128,192,256,384,512,768,1024,1536,2048")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--full-scan-kb", type=int, default=None, help="as rmq init --full-scan-kb [default: as rmq init]"
    )
    ap.add_argument("--out", default=None, help="results file stem (default: search_recall-<data>)")
    args = ap.parse_args()
    wall = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    efs, k = [int(e) for e in args.efs.split(",")], args.limit

    g_old, g_new, q_new, q_old = dataset(args, rng)
    n = len(g_new)
    in_new = np.zeros(n, bool)
    in_new[rng.choice(n, round(n * args.new_share), replace=False)] = True
    share = {OLD: 1 - in_new.mean(), NEW: in_new.mean()}
    rows, exact, notes = [], {}, []
    with tempfile.TemporaryDirectory(prefix="rmq-recall-") as tmp:
        store = open_store(tmp)
        notes.append(build(store, g_old, g_new, in_new, args.full_scan_kb))
        model = ModelRef("bench", "0", 128, "-")
        pairs = {
            "paired": PairRecord("bench", OLD, NEW, "rm", "cosine", model),
            SC: PairRecord("bench-one", ONE, ONE, "rm", "cosine", model, layout=SINGLE, new_vector="new"),
        }
        rules, indexes = variants(k, share), []

        def make(label, ef, exact_=False):
            """A searcher: query number -> top-k ids."""
            if label == "single":
                return lambda i: [
                    h.id for h in store.search(ALL, q_new[i : i + 1], limit=k, exact=exact_, hnsw_ef=ef)[0]
                ]
            pick = rules.get(label)
            pair = pairs[SC if label == SC else "paired"]
            index = DualIndex(store if pick is None else SideEf(store, pick), pair, exact=exact_, hnsw_ef=ef)
            indexes.append(index)
            # exact per call: an index's own exact=True is lost where the call sets none (issue 26
            # report: store/params.py merge_params names exact=False)
            call = {"exact": True} if exact_ else {}
            return lambda i: [h.id for h in index.search_vectors(q_new[i], q_old[i], limit=k, **call)]

        # Exact: the truth, and the exact latency ratios (the three interleaved).
        exact_fns = {s: make(s, None, True) for s in (SAME, SC, "single")}
        times, found = timed_rounds(exact_fns, args.queries, args.warmup)
        truth = {s: [f[:k] for f in found[s]] for s in found}
        exact = {"dual" if s == SAME else s: summary(times[s], found[s], truth[s], k) for s in found}
        brute, kth = union_truth(g_old, g_new, in_new, q_new[args.warmup :], q_old[args.warmup :], k)
        same = sum(f == b.tolist() for f, b in zip(truth[SAME], brute, strict=True))
        layouts = sum(a == b for a, b in zip(truth[SC], truth[SAME], strict=True))
        exact["single_collection_equal_to_paired"] = layouts
        from_old = np.mean([[not in_new[i] for i in f] for f in truth[SAME]])
        notes += [
            f"exact paired dual top-{k} = numpy top-{k} over the union (ids, in order) for "
            f"{same}/{args.queries} queries; {from_old:.1%} of its hits come from old "
            f"({share[OLD]:.0%} of the gallery); "
            f"median cosine distance of each side's own {k}th nearest: old {kth['old']:.3f}, "
            f"new {kth['new']:.3f}",
            f"exact single-collection dual top-{k} = exact paired dual top-{k} (ids, in order) for "
            f"{layouts}/{args.queries} queries",
        ]
        if share[OLD] == share[NEW]:
            notes.append(
                "`ef x share` at 2 ef makes the very searches of `same ef` at ef: their gap is noise"
            )

        # The sweep: one searcher at a time over all queries (a searcher run twice on a query
        # finds its graph path in cache, so variants are not interleaved with each other).
        for ef in efs:
            for s in ["single", *rules, SC]:
                times, found = timed_rounds({s: make(s, ef)}, args.queries, args.warmup)
                ref = truth[s if s in (SC, "single") else SAME]
                rows.append({"searcher": s, "ef": ef, **summary(times[s], found[s], ref, k)})
            print(f"  ef {ef}: done", file=sys.stderr, flush=True)

        equal = equal_recall(rows, [*rules, SC], make, args)
        for index in indexes:
            index.close()
        store.close()
    for p in ("p50", "p99"):
        exact[f"{p}_ratio"] = exact["dual"][f"{p}_ms"] / exact["single"][f"{p}_ms"]
        exact[f"single_collection_{p}_ratio"] = exact[SC][f"{p}_ms"] / exact["single"][f"{p}_ms"]
        exact[f"single_collection_{p}_vs_paired"] = exact[SC][f"{p}_ms"] / exact["dual"][f"{p}_ms"]
    notes.append(f"total wall time: {time.perf_counter() - wall:.0f} s")
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    sizes = f"N={n:,} ({n - in_new.sum():,} old-only, {in_new.sum():,} migrated"
    text = markdown(date, args, sizes, rules, rows, equal, exact, notes)
    print(text)
    out = RESULTS / (args.out or f"search_recall-{args.data}")
    out.with_suffix(".md").write_text(text)
    record = {"command": f"python {shlex.join(sys.argv)}", "machine": machine(), "date": date}
    record |= {"args": vars(args), "rows": rows, "equal_recall": equal, "exact": exact}
    out.with_suffix(".json").write_text(json.dumps({**record, "notes": notes}, indent=1) + "\n")


def goals(equal, exact, searcher, key):
    """Issue 13's goals line for one DualIndex (``key``: its exact ratios' prefix)."""
    ours = [e for e in equal if e["searcher"] == searcher and "p50_ratio" in e]
    ratios = [e[f"p{p}_ratio"] for e in ours for p in (50, 99)]
    at_equal = "; ".join(f"{e['target']}: p50 {e['p50_ratio']:.2f}x, p99 {e['p99_ratio']:.2f}x" for e in ours)
    p50, p99 = exact[f"{key}p50_ratio"], exact[f"{key}p99_ratio"]
    return (
        f"dual/single <= 1.3 at equal recall: {at_equal or 'no target reached'} "
        f"({'met' if ratios and max(ratios) <= 1.3 else 'missed'}); exact <= 1.1: p50 {p50:.2f}x, "
        f"p99 {p99:.2f}x ({'met' if max(p50, p99) <= 1.1 else 'missed'})."
    )


def markdown(date, args, sizes, rules, rows, equal, exact, notes):
    """The report: goals, the equal-recall table, the sweep, the exact ratios."""
    k, efs = args.limit, sorted({r["ef"] for r in rows})
    side = "; ".join(f"{s}: old {pick(32, OLD)}, new {pick(32, NEW)}" for s, pick in rules.items() if pick)
    lines = [
        f"# Dual search at equal recall ({args.data})",
        "",
        f"Command: `python {shlex.join(sys.argv)}`  ",
        f"Machine: {machine()}; a shared machine: `load 1m` is os.getloadavg()[0] beside each figure  ",
        f"Date: {date}",
        "",
        f"Setup: {sizes}; paired: old-only points in an old collection, migrated ones in new; "
        "single-collection: one collection, every point's old vector (unnamed) and the migrated "
        "points' new vector (`new`); single: all in one collection as new vectors), 128-d, cosine, "
        f"rm pair, limit {k}, {args.queries} queries after {args.warmup} warm-up, embedded EdgeStore "
        "(the paired DualIndex searches old then new; the single-collection one sends one query, "
        f"two prefetches and a max formula). Recall@{k} against each one's exact top-{k}.",
        "",
        f"Issue 13 goals, paired DualIndex as it is (`same ef`): {goals(equal, exact, SAME, '')}  ",
        f"Single-collection DualIndex: {goals(equal, exact, SC, 'single_collection_')}",
        "",
        "## At equal recall: each one's cheapest hnsw_ef reaching the target, timed head to head",
        "",
        "`same ef` (paired DualIndex as it is: both sides get hnsw_ef), `single-collection` (both "
        "prefetches get hnsw_ef) and single run in one interleaved run (who goes first rotates per "
        "query); each other paired variant runs alone against single. Those rewrite each side's ef "
        f"(at 32: {side}). `vs paired`: single-collection / `same ef`, from the same run.",
        "",
        "| target | dual | dual ef | dual recall | single ef | single recall | dual p50 ms "
        "| single p50 ms | p50 dual/single | dual p99 ms | single p99 ms | p99 dual/single "
        "| p50 vs paired | p99 vs paired | load 1m |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for e in equal:
        if "dual_p50_ms" not in e:
            cells = f"{e['ef'] or 'not reached'} | | {e['single_ef'] or 'not reached'} | | | | | | | | | | |"
        else:
            vs = " | ".join(
                f"{e[f'p{p}_vs_paired']:.2f}x" if f"p{p}_vs_paired" in e else "" for p in (50, 99)
            )
            if "p50_ratio" in e:
                single = (
                    f"{e['single_ef']} | {e['single_recall']:.4f} | {e['dual_p50_ms']:.3f} "
                    f"| {e['single_p50_ms']:.3f} | {e['p50_ratio']:.2f}x | {e['dual_p99_ms']:.3f} "
                    f"| {e['single_p99_ms']:.3f} | {e['p99_ratio']:.2f}x"
                )
            else:  # single did not reach the target: the layouts against each other only
                single = f"not reached | | {e['dual_p50_ms']:.3f} | | | {e['dual_p99_ms']:.3f} | |"
            cells = f"{e['ef']} | {e['dual_recall']:.4f} | {single} | {vs} | {e['load']:.1f} |"
        lines.append(f"| {e['target']} | {e['searcher']} | {cells}")
    lines += [
        "",
        "## Recall and latency by hnsw_ef (each searcher alone over all queries)",
        "",
        f"| searcher | {' | '.join(str(e) for e in efs)} |",
        "|---|" + "--:|" * len(efs),
    ]
    for s in ["single", *rules, SC]:
        mine = [r for r in rows if r["searcher"] == s]
        for key, fmt in (
            ("recall", "{:.4f}"),
            ("p50_ms", "{:.3f}"),
            ("p99_ms", "{:.3f}"),
            ("load", "{:.1f}"),
        ):
            lines.append(
                f"| {s} {key.replace('_ms', ' ms')} | {' | '.join(fmt.format(r[key]) for r in mine)} |"
            )
    d, one, s1 = exact["dual"], exact[SC], exact["single"]
    lines += [
        "",
        "## Exact search (exact=True), the three interleaved",
        "",
        "| searcher | p50 ms | p99 ms | load 1m |\n|---|--:|--:|--:|",
        f"| paired dual | {d['p50_ms']:.3f} | {d['p99_ms']:.3f} | {d['load']:.1f} |",
        f"| single-collection dual | {one['p50_ms']:.3f} | {one['p99_ms']:.3f} | {one['load']:.1f} |",
        f"| single | {s1['p50_ms']:.3f} | {s1['p99_ms']:.3f} | {s1['load']:.1f} |",
        f"| paired dual / single | {exact['p50_ratio']:.2f}x | {exact['p99_ratio']:.2f}x |",
        f"| single-collection dual / single | {exact['single_collection_p50_ratio']:.2f}x "
        f"| {exact['single_collection_p99_ratio']:.2f}x |",
        f"| single-collection / paired dual | {exact['single_collection_p50_vs_paired']:.2f}x "
        f"| {exact['single_collection_p99_vs_paired']:.2f}x |",
        "",
        *[f"- {note}" for note in notes],
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
