"""The migration part of benchmarks/photo_throughput.py: ``run_migration`` on the embedded store
over one size class of the photo gallery, with a cheap encoder, against the ceilings of its
decode alone and of its encoder alone, measured in the same run.

Each size class gets an old collection of ``points`` points (random 64-d vectors) whose payload
``uri`` names the class's photos in turn (a photo serves several points: the files stay in the
page cache, as on a warm disk). Every run migrates a fresh copy of it, paired with the cheap
encoder, with 1 or 2 fetch workers, the pair created decoding ``exact`` or ``fast`` (``rmq init
--decode``); :func:`decoded_as` checks, on the stored vectors, that the migration really decoded
that way.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rm_qdrant import DualIndex, OnnxEncoder, create_pair
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.migration.ranking import prepare_order, read_all
from rm_qdrant.store import Where

MODES = ("exact", "fast")
WORKERS = (1, 2)


def old_collection(store, name: str, paths: list[Path], points: int) -> None:  # noqa: ANN001
    """``points`` old points whose ``uri`` cycles over ``paths``."""
    rng = np.random.default_rng(0)
    store.create_collection(name, dim=64, distance="cosine")
    payloads = [{"uri": str(paths[i % len(paths)])} for i in range(points)]
    store.upsert(name, list(range(points)), rng.normal(size=(points, 64)).astype(np.float32), payloads)


def fresh_pair(store, source: str, model: Path, name: str, decode: str) -> DualIndex:  # noqa: ANN001
    """A copy of ``source`` paired with ``model`` (decoding as ``decode``), its order prepared (untimed)."""
    ids, payloads, vectors = read_all(store, source, Where(), True)
    store.create_collection(f"{name}-old", dim=vectors.shape[1], distance="cosine")
    store.upsert(f"{name}-old", ids, vectors, payloads)
    create_pair(store, name, old_collection=f"{name}-old", encoder=OnnxEncoder(model), decode=decode)
    index = DualIndex.open(store, name)
    index.pair = prepare_order(store, index.pair, "random")
    return index


def migrate(index: DualIndex, workers: int, batch: int) -> dict:
    """Points a second of one whole migration of ``index``, less its index builds."""
    load = os.getloadavg()[0]
    report = run_migration(index, MigrateOptions(batch=batch, fetch_workers=workers))
    if report.failed or not report.moved:
        raise SystemExit(f"migration failed: {report.failure_sample}")
    return {
        "points_s": report.moved / (report.seconds - report.optimize_seconds),
        "load": (load + os.getloadavg()[0]) / 2,
    }


def decoded_as(store, index: DualIndex, model: Path, probe: int = 3) -> str:  # noqa: ANN001
    """Which decode mode the migrated vectors came from: ``exact``, ``fast``, ``either`` (the two
    modes give the same vectors for these photos), or ``neither``."""
    ids, payloads, vectors = read_all(store, index.pair.new_collection, Where(), True)
    uris = [payloads[i]["uri"] for i in range(probe)]
    stored = vectors[:probe] / np.linalg.norm(vectors[:probe], axis=1, keepdims=True)
    same = []
    for mode in MODES:
        mine = OnnxEncoder(model, decode=mode).encode(uris, ["new"])["new"]
        mine = mine / np.linalg.norm(mine, axis=1, keepdims=True)
        if np.allclose(mine, stored, atol=1e-5):
            same.append(mode)
    return same[0] if len(same) == 1 else ("either" if same else "neither")


def decode_ceiling(decoder: OnnxEncoder, uris: list[str], threads: int, repeats: int) -> float:
    """Images a second of the encoder's decode alone (read, decode, resize, crop) on ``threads``."""
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(decoder.decode, uris[: threads * 2]))  # warm up
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(decoder.decode, uris))
            best = min(best, time.perf_counter() - start)
    return len(uris) / best


def points_for(key: str, base: int) -> int:
    """Points a migration of class ``key`` (``"640x427"``) moves: ``base`` for 4 MP and up, more
    for smaller photos (``base`` × 4 MP / the class's MP, at most 16 × ``base``), so every run
    lasts long enough that its first and last batches, which overlap nothing, do not set its rate."""
    width, height = (int(side) for side in key.split("x"))
    return min(base * 16, max(base, round(base * 4e6 / (width * height))))


def size_class(store, key: str, paths: list[Path], model: Path, args) -> dict:  # noqa: ANN001
    """One class's runs: each mode and worker count, ``args.migration_repeats`` times (the order
    rotating), each right after its decode ceiling (the same mode, as many threads: drift on a
    shared machine hits both alike); and which mode the migrated vectors show."""
    source = f"photos-{key}"
    points = points_for(key, args.points)
    old_collection(store, source, paths, points)
    uris = [str(paths[i % len(paths)]) for i in range(points)]
    decoders = {mode: OnnxEncoder(model, decode=mode) for mode in MODES}
    combos = [(m, w) for m in MODES for w in WORKERS]
    runs: dict[str, list[dict]] = {f"{m} {w}": [] for m, w in combos}
    shown: dict[str, str] = {}
    for repeat in range(args.migration_repeats):
        for mode, workers in combos[repeat % len(combos) :] + combos[: repeat % len(combos)]:
            ceiling = decode_ceiling(decoders[mode], uris, workers, 1)
            index = fresh_pair(store, source, model, f"{key}-{mode}-{workers}-{repeat}", mode)
            runs[f"{mode} {workers}"].append({**migrate(index, workers, args.batch), "decode": ceiling})
            if repeat == 0 and workers == 1:
                shown[mode] = decoded_as(store, index, model)
    return {
        "runs": runs,
        "median": {k: statistics.median(r["points_s"] for r in v) for k, v in runs.items()},
        "decode": {k: statistics.median(r["decode"] for r in v) for k, v in runs.items()},
        "ratio": {k: statistics.median(r["points_s"] / r["decode"] for r in v) for k, v in runs.items()},
        "decoded_as": shown,
    }
