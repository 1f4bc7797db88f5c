"""A large pair on the embedded store, half migrated: load, HNSW, search, and every rmq command's cost.

    python benchmarks/scale.py [--n 1000000]

Builds, in a qdrant-edge store under ``.cache/scale/N`` (``open_store(folder)``):

1. the old collection: N points, point i = the old small CNN's CIFAR-10 vector of image
   i mod 60,000 plus Gaussian noise (std ``--noise``), payload ``{"uri", "label"}``, so the
   images cycle over the 60,000 real JPEGs (``benchmarks/cifar_features.py``); bulk loaded
   with ``store.upsert`` in batches, then its HNSW index built (``store.optimize``) and
   searched alone (the team's collection before the upgrade);
2. the pair (``rmq init``, encoder: the trainer's graph with ``new`` and ``rev``);
3. half migrated, by bulk load rather than by ``rmq migrate`` (an honest shortcut, not the
   migration): a seeded random half of the ids gets the new model's vector (same noise
   recipe) in the new collection with the payload a migration writes, then those ids are
   deleted from old; the new collection's HNSW index is built. The old one is not
   rebuilt: its deleted points stay as tombstones, as after a real migration on this store
   (qdrant-edge has no background optimizer);
4. dual search (``DualIndex.search_vectors_batch``, both halves, merged) against a single
   collection, at a fixed ``--ef``, one query per call; recall@10 against an exact search;
5. ``rmq status``, ``rmq probe``, ``rmq migrate --prepare`` for each order and
   ``rmq migrate --limit M`` (the real migration: fetch, decode, encode, write) as
   subprocesses, each with its wall time and its own peak RSS (``/usr/bin/time``);
6. the store's size on disk.

Writes ``benchmarks/results/scale-N.md`` and ``.json``. The store is deleted at the end
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import ROOT  # noqa: E402
from benchmarks.cifar_features import cifar_features, graphs  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from rm_qdrant import DualIndex, load_pair, open_store  # noqa: E402
from rm_qdrant.core.planning import new_payload  # noqa: E402

RMQ = [sys.executable, "-m", "rm_qdrant"]
OLD, PAIR = "gallery", "scale"
ORDERS = ("random", "centroid", "centroid-unsupervised")
MB = 1024 * 1024


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def vectors(base: np.ndarray, ids: np.ndarray, noise: float, seed: int) -> np.ndarray:
    """Rows ``base[i mod len(base)]`` plus Gaussian noise, reproducible per batch."""
    rng = np.random.default_rng([seed, int(ids[0]), len(ids)])
    rows = base[ids % len(base)]
    return rows + rng.standard_normal(rows.shape, dtype=np.float32) * np.float32(noise)


def load(store, name: str, ids: np.ndarray, base: np.ndarray, payload, args, seed: int) -> float:
    """Upsert ``ids`` in batches (vectors and payloads made on the fly); returns seconds."""
    started = time.perf_counter()
    for start in range(0, len(ids), args.batch):
        chunk = ids[start : start + args.batch]
        store.upsert(
            name, chunk.tolist(), vectors(base, chunk, args.noise, seed), [payload(i) for i in chunk]
        )
        if (start // args.batch) % 50 == 0:
            say(f"  {name}: {start + len(chunk):,} / {len(ids):,}")
    return time.perf_counter() - started


def shard_info(store, name: str) -> dict[str, int]:
    info = store._open(name)[1].info()  # qdrant-edge's own counts (EdgeStore only)
    return {
        "points": int(info.points_count),
        "indexed_vectors": int(info.indexed_vectors_count),
        "segments": int(info.segments_count),
    }


def optimize(store, name: str) -> dict[str, Any]:
    started = time.perf_counter()
    store.optimize(name)
    seconds = time.perf_counter() - started
    info = shard_info(store, name)
    info["seconds"] = seconds
    info["all_indexed"] = info["indexed_vectors"] >= info["points"]
    say(f"  HNSW {name}: {seconds:.1f} s, {info}")
    return info


def latencies(search, queries: int, warmup: int) -> dict[str, float]:
    """p50/p99/mean in ms of ``search(q)`` for q in range(queries), after ``warmup`` calls."""
    for q in range(warmup):
        search(q)
    spent = []
    for q in range(queries):
        started = time.perf_counter()
        search(q)
        spent.append(1000 * (time.perf_counter() - started))
    ms = np.array(spent)
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": ms.mean(),
    }


def recall(approx: list[list[Any]], exact: list[list[Any]], k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(e[:k])) / k for a, e in zip(approx, exact, strict=True)]))


def folder_bytes(folder: Path) -> int:
    """Bytes on disk (allocated blocks) under ``folder``."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def disk(store_dir: Path) -> dict[str, int]:
    sizes = {"total": folder_bytes(store_dir)}
    for child in sorted((store_dir / "collections").iterdir()):
        sizes[child.name] = folder_bytes(child)
    return sizes


def rmq(store_dir: Path, *args: object) -> dict[str, Any]:
    """Run one rmq command as a child process: wall seconds, its own peak RSS, stdout.

    The peak RSS comes from ``/usr/bin/time``: a child forked from this (large) process would
    report this process's size as its own high-water mark.
    """
    command = [*RMQ, "--qdrant", str(store_dir), "-q", *map(str, args)]
    with tempfile.NamedTemporaryFile("r") as rss_file:
        started = time.perf_counter()
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", rss_file.name, *command],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - started
        rss = int(rss_file.read().split()[-1]) / 1024  # KiB
    shown = " ".join(map(str, args))
    if done.returncode:
        sys.exit(f"failed: rmq {shown}\n{done.stdout}\n{done.stderr}")
    say(f"  rmq {shown}: {seconds:.1f} s, peak RSS {rss:,.0f} MiB")
    return {"command": f"rmq {shown}", "seconds": seconds, "peak_rss_mib": rss, "stdout": done.stdout}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1_000_000, help="points in the gallery")
    parser.add_argument("--batch", type=int, default=10_000, help="points per upsert")
    parser.add_argument("--noise", type=float, default=0.01, help="std of the noise per dimension")
    parser.add_argument("--ef", type=int, default=64, help="HNSW search breadth of every search")
    parser.add_argument("--queries", type=int, default=500, help="timed searches per row")
    parser.add_argument("--recall-queries", type=int, default=50, help="queries checked against exact")
    parser.add_argument("--migrate", type=int, default=50_000, help="points the real migration moves")
    parser.add_argument("--sample", type=int, default=2000, help="rmq probe --sample")
    parser.add_argument("--work", type=Path, help="store folder [default: .cache/scale/N]")
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = parser.parse_args(argv)
    n = args.n
    work = args.work or ROOT / ".cache" / "scale" / str(n)
    store_dir = work / "store"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ["RMQ_CACHE_DIR"] = str(work / "cache")  # rmq probe's sample cache
    run_started = time.perf_counter()
    load_start = os.getloadavg()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    )

    features = cifar_features()
    old_graph, pair_graph = graphs()
    uris, labels = features.uris, [str(x) for x in features.labels]
    ids = np.arange(n, dtype=np.int64)
    migrated = np.sort(np.random.default_rng(0).permutation(n)[: n // 2])
    # Queries: images of the gallery, as the models embed them (no noise).
    query_images = np.random.default_rng(1).choice(len(uris), size=args.queries, replace=False)
    result: dict[str, Any] = {"n": n, "migrated_by_bulk_load": len(migrated), "ef": args.ef}
    result["rm_qdrant_commit"] = commit.stdout.strip() or "unknown"

    def payload(i: int) -> dict[str, Any]:
        return {"uri": uris[i % len(uris)], "label": labels[i % len(labels)]}

    # --- 1. the old collection: load, index, search alone -------------------------------------
    say(f"loading {n:,} points into the old collection")
    store = open_store(store_dir)
    store.create_collection(OLD, dim=features.old.shape[1], distance="cosine")
    seconds = load(store, OLD, ids, features.old, payload, args, seed=10)
    result["load_old"] = {"points": n, "seconds": seconds, "points_per_s": n / seconds}
    result["disk_after_load"] = disk(store_dir)
    say(f"building the HNSW index of {OLD}")
    result["hnsw_old"] = optimize(store, OLD)
    result["disk_after_hnsw"] = disk(store_dir)

    old_q = features.old[query_images]
    single = lambda q: store.search(OLD, old_q[q : q + 1], limit=10, hnsw_ef=args.ef)  # noqa: E731
    result["search_single"] = latencies(single, args.queries, warmup=20)
    m = min(args.recall_queries, args.queries)
    approx = [
        [h.id for h in store.search(OLD, old_q[q : q + 1], limit=10, hnsw_ef=args.ef)[0]] for q in range(m)
    ]
    exact = [[h.id for h in store.search(OLD, old_q[q : q + 1], limit=10, exact=True)[0]] for q in range(m)]
    result["search_single"]["recall@10"] = recall(approx, exact, 10)
    say(f"  single search: {result['search_single']}")
    store.close()

    # --- 2. the pair ------------------------------------------------------------------------------
    init = rmq(store_dir, "init", "--name", PAIR, "--old-collection", OLD, "--encoder", pair_graph)

    # --- 3. half migrated by bulk load ------------------------------------------------------------
    store = open_store(store_dir)
    pair = load_pair(store, PAIR)
    say(f"bulk loading {len(migrated):,} points into {pair.new_collection}, deleting them from {OLD}")
    seconds = load(
        store, pair.new_collection, migrated, features.new, lambda i: new_payload(payload(i)), args, seed=20
    )
    result["load_new"] = {
        "points": len(migrated),
        "seconds": seconds,
        "points_per_s": len(migrated) / seconds,
    }
    started = time.perf_counter()
    for start in range(0, len(migrated), args.batch):
        store.delete(OLD, migrated[start : start + args.batch].tolist())
    seconds = time.perf_counter() - started
    result["delete_old"] = {
        "points": len(migrated),
        "seconds": seconds,
        "points_per_s": len(migrated) / seconds,
    }
    result["hnsw_new"] = optimize(store, pair.new_collection)
    result["old_after_delete"] = shard_info(store, OLD)

    # --- 4. dual search against one collection ----------------------------------------------------
    new_q, rev_q = features.new[query_images], features.rev[query_images]
    index = DualIndex(store, pair, hnsw_ef=args.ef)
    exact_index = DualIndex(store, pair, exact=True)
    dual = lambda q: index.search_vectors_batch(new_q[q : q + 1], rev_q[q : q + 1], limit=10)  # noqa: E731
    result["search_dual"] = latencies(dual, args.queries, warmup=20)
    approx = [[h.id for h in dual(q)[0]] for q in range(m)]
    exact = [
        [h.id for h in exact_index.search_vectors_batch(new_q[q : q + 1], rev_q[q : q + 1], limit=10)[0]]
        for q in range(m)
    ]
    result["search_dual"]["recall@10"] = recall(approx, exact, 10)
    say(f"  dual search: {result['search_dual']}")
    side = lambda q: store.search(pair.new_collection, new_q[q : q + 1], limit=10, hnsw_ef=args.ef)  # noqa: E731
    result["search_new_alone"] = latencies(side, args.queries, warmup=20)
    say(f"  new collection alone: {result['search_new_alone']}")
    store.close()

    # --- 5. rmq commands ----------------------------------------------------------------------------
    commands = {"init": init, "startup": rmq(store_dir, "--help")}
    commands["status"] = rmq(store_dir, "status", "--name", PAIR, "--json")
    commands["probe"] = rmq(store_dir, "probe", "--name", PAIR, "--sample", args.sample, "--json")
    for order in (*[o for o in ORDERS if o != "random"], "random"):  # random last: the migration's order
        commands[f"prepare {order}"] = rmq(
            store_dir, "migrate", "--name", PAIR, "--prepare", "--order", order
        )
    moved = rmq(store_dir, "migrate", "--name", PAIR, "--limit", args.migrate, "--json")
    report = json.loads(moved["stdout"])
    moved.update(moved=report["moved"], failed=report["failed"], engine_seconds=report["seconds"])
    commands["migrate"] = moved
    commands["status after"] = rmq(store_dir, "status", "--name", PAIR, "--json")
    commands["status after"]["report"] = json.loads(commands["status after"]["stdout"])
    for entry in commands.values():
        entry.pop("stdout")
    result["commands"] = commands
    result["disk_end"] = disk(store_dir)
    result["wall_seconds"] = time.perf_counter() - run_started
    result["load_start"], result["load_end"] = load_start, os.getloadavg()
    result["peak_rss_self_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    write(args, result)


def _rate(entry: dict[str, Any]) -> str:
    return f"{entry['seconds']:.1f} s, {entry['points_per_s']:,.0f} points/s"


def write(args: argparse.Namespace, r: dict[str, Any]) -> None:
    n, half = r["n"], r["migrated_by_bulk_load"]
    date = datetime.date.today().isoformat()
    command = "python benchmarks/scale.py " + shlex.join(sys.argv[1:])
    c, old = r["commands"], r["old_after_delete"]
    ho, hn = r["hnsw_old"], r["hnsw_new"]

    def hnsw(info: dict[str, Any]) -> str:
        if info["indexed_vectors"] == 0:
            return "not built: below qdrant-edge's indexing threshold, searched by full scan"
        return (
            f"{info['seconds']:.1f} s ({info['points'] / info['seconds']:,.0f} points/s); "
            f"{info['indexed_vectors']:,} vectors indexed ({'all' if info['all_indexed'] else 'NOT all'})"
        )

    s, d, a = r["search_single"], r["search_dual"], r["search_new_alone"]
    mig = c["migrate"]
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    rows = [
        ("bulk load, old collection", f"{n:,} points", _rate(r["load_old"])),
        ("bulk load, new collection (the migrated half)", f"{half:,} points", _rate(r["load_new"])),
        ("delete the migrated half from old", f"{half:,} points", _rate(r["delete_old"])),
        ("HNSW build, old (`store.optimize`)", f"{ho['points']:,} points", hnsw(ho)),
        ("HNSW build, new", f"{hn['points']:,} points", hnsw(hn)),
        (
            "search, single collection (old, before the migration)",
            f"{n:,} points, ef {args.ef}",
            f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms; recall@10 {s['recall@10']:.3f}",
        ),
        (
            "search, dual (old + new, merged)",
            f"{n - half:,} + {half:,}, ef {args.ef}",
            f"p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms; recall@10 {d['recall@10']:.3f}",
        ),
        (
            "search, new collection alone",
            f"{half:,} points, ef {args.ef}",
            f"p50 {a['p50_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms",
        ),
    ]
    for key, label in (
        ("startup", "`rmq --help` (interpreter and imports alone)"),
        ("status", "`rmq status`"),
        ("probe", f"`rmq probe --sample {args.sample}`"),
        *[(f"prepare {o}", f"`rmq migrate --prepare --order {o}`") for o in ORDERS],
        ("status after", "`rmq status` after the migration below"),
    ):
        e = c[key]
        rows.append(
            (
                label,
                ""
                if key == "startup"
                else f"{n - half - (mig['moved'] if key == 'status after' else 0):,} old points",
                f"{e['seconds']:.1f} s, peak RSS {e['peak_rss_mib']:,.0f} MiB",
            )
        )
    rows.append(
        (
            f"`rmq migrate --limit {args.migrate}` (real: fetch, decode, encode, write)",
            f"{mig['moved']:,} moved, {mig['failed']} failed",
            f"{mig['moved'] / mig['engine_seconds']:,.0f} points/s "
            f"({mig['engine_seconds']:.1f} s in the engine, {mig['seconds']:.1f} s wall), "
            f"peak RSS {mig['peak_rss_mib']:,.0f} MiB",
        )
    )
    de = r["disk_end"]
    rows.append(
        (
            "store size on disk",
            "end of the run",
            f"{gib(de['total'])} (old {gib(de[OLD])}, new {gib(de[f'{PAIR}-new'])}); "
            f"after the load {gib(r['disk_after_load']['total'])}, "
            f"after HNSW {gib(r['disk_after_hnsw']['total'])}",
        )
    )
    lines = [
        f"# A pair at scale: {n:,} points on the embedded store, half migrated",
        "",
        f"- Command: `{command.strip()}`",
        f"- Code: rm_qdrant at commit {r['rm_qdrant_commit']}",
        f"- Machine: {machine()}; date {date}; load average {r['load_start'][0]:.2f} at the start, "
        f"{r['load_end'][0]:.2f} at the end (a shared machine: other work can slow any row)",
        f"- Whole run: {r['wall_seconds'] / 60:.1f} min; peak RSS of the benchmark process "
        f"{r['peak_rss_self_mib']:,.0f} MiB (each rmq command's own peak is in its row)",
        "- Data: point i = CIFAR-10 image i mod 60,000 (the real JPEG is its payload `uri`, with `label`); "
        f"old vector = the old small CNN's 128-d embedding + N(0, {args.noise}²) per dimension; new vector "
        "likewise from the trainer's graph (`new`)",
        f"- Queries: the graphs' own vectors of {args.queries} gallery images (old for the single search, "
        "new and rev for the dual one), one per call after 20 warm-up calls, query encoding not timed; "
        f"recall@10 against an exact search (`exact=True`) of the same collection(s) on "
        f"{min(args.recall_queries, args.queries)} of them",
        f"- Half migrated by bulk load, not by `rmq migrate`: a random half of the ids written to the new "
        "collection with the payload a migration writes, then deleted from old. The old HNSW graph keeps "
        f"them as tombstones, as a real migration on this store would (afterwards old holds "
        f"{old['points']:,} points, {old['indexed_vectors']:,} indexed vectors, {old['segments']} segments). "
        f"Only the last `rmq migrate` row moved points through the real migration",
        "",
        "| step | size | result |",
        "|---|---|---|",
        *[f"| {a} | {b} | {v} |" for a, b, v in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = ROOT / "benchmarks" / "results" / f"scale-{n}"
    out.with_suffix(".md").write_text(text)
    r.update(command=command, date=date, machine=machine())
    out.with_suffix(".json").write_text(json.dumps(r, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
