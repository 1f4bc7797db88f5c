"""``rmq probe``: re-embed a random sample of the gallery and forecast the backfill, writing nothing.

The sample comes from the old collection (the points still served from old): their
stored old vectors, their payloads, and their images fetched from the payload ``uri``
and embedded with the pair's encoder (``new``, and ``rev`` when the graph has it).
:func:`rm_qdrant.core.forecast.forecast` then simulates the backfill on it. The sample is
cached in a local file so ``rmq status`` can show the same estimate for the current
state of a running migration.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.caches import cache_root
from rm_qdrant.core.forecast import (
    DIP_TOLERANCE,
    ModeForecast,
    OldDistance,
    crowding,
    forecast,
    merged_agreement,
    merged_top_k,
    reference_top_k,
)
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.ordering import order_keys
from rm_qdrant.core.paths import payload_value
from rm_qdrant.core.planning import ERROR
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.loading import load_batch
from rm_qdrant.migration.ranking import read_all
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.layouts import active_where, ids_in_new
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import ImageSource, SourceConfig
from rm_qdrant.store import Store, Where

_BATCH = 256


@dataclass(frozen=True)
class ProbeSample:
    """A gallery sample with its old vectors and the new model's view of the same images."""

    ids: list[PointId]
    payloads: list[dict[str, Any]]
    old: np.ndarray  # stored old vectors (n, d_old)
    new: np.ndarray  # the encoder's gallery output (n, d_new)
    rev: np.ndarray | None  # the encoder's rev output (n, d_old), or None
    encoder: str  # the encoder's fingerprint
    failed: int  # sampled points whose image could not be fetched or decoded
    gallery: int = 0  # points the sample was drawn from
    decode: str = "exact"  # how its images were decoded (a sample cached before it: exact)

    @property
    def key(self) -> str:
        """A short digest of the sampled ids and vectors: two runs whose verdicts differ on
        samples with different keys were judged on different points (the points still in old
        change as the backfill goes on; an image that could not be read drops out)."""
        digest = hashlib.sha256(json.dumps([str(i) for i in self.ids]).encode())
        for rows in (self.old, self.new):
            digest.update(np.ascontiguousarray(rows, dtype=np.float32).tobytes())
        return digest.hexdigest()[:10]

    def labels(self, field: str = "label") -> list[Any] | None:
        """Each point's payload label (``field``, a payload path such as ``meta.dept``), or None
        unless every sampled point has one that names a class: a string or a number (a list,
        an object or true/false would each become a class of its own, read as text)."""
        labels = [payload_value(p, field) for p in self.payloads]
        named = all(isinstance(label, (str, int, float)) and not isinstance(label, bool) for label in labels)
        return labels if labels and named else None


def check_probe(
    store: Store, pair: PairRecord, *, doing: str = "forecast", needs: str = "no old vectors to sample"
) -> None:
    """Refuse a pair that has no backfill left to forecast (``rmq plan``: ``doing="plan"``).

    A probe samples the points still served from old, by their stored old vectors: once a
    cutover has begun or the pair rolled back no backfill is left, and once the old collection
    is gone (or its name aliases another collection, say the new one after ``finalize --alias
    OLD --drop-old``) there are no old vectors to read.

    Raises:
        ConfigError: the pair is not backfilling, or its old collection is gone.
    """
    if pair.state != "backfilling":
        raise ConfigError(f"pair {pair.name!r} is {pair.state}: there is no backfill left to {doing}")
    if not store.has_collection(pair.old_collection):
        raise ConfigError(
            f"pair {pair.name!r}: its old collection {pair.old_collection!r} is gone (deleted, or the name "
            f"is now an alias): there are {needs}"
        )


def _nothing_to_sample(pair: PairRecord, left: int, failed: int) -> str:
    """Why a pair has no sample to draw: what is left in old, and what a sample needs."""
    name = pair.name
    left_text = f"{left} point(s) left to migrate" if left else "no point left to migrate"
    failed_text = (
        f" and {failed} whose image a migration could not read ('rmq failures --name {name}' lists them; "
        "they count for nothing here)"
        if failed
        else ""
    )
    return (
        f"pair {name!r} has {left_text}{failed_text}: a sample is drawn from the points still served "
        "from old (their stored old vectors beside their re-embedded images) and needs at least 2; "
        f"nothing is left to forecast or fit heads for: 'rmq finalize --name {name}' ends the backfill"
    )


def draw_sample(
    store: Store,
    pair: PairRecord,
    encoder: OnnxEncoder | None,
    size: int,
    *,
    seed: int = 0,
    source: SourceConfig | None = None,
    workers: int = 8,
    on_plan: Callable[[int], None] | None = None,
    on_image: Callable[[], None] | None = None,
) -> ProbeSample:
    """Sample ``size`` points of the old collection and embed their images with ``encoder``
    (decoded as it decodes: the caller gives it the pair's mode, or ``rmq probe --decode``'s).

    ``encoder`` is the pair's (``rmq probe``) or the team's new backbone (``rmq fit``); the
    sample's ``new`` is its gallery output (``new``, else ``embedding``). ``on_plan(n)`` is
    told how many images will be fetched, ``on_image()`` after each one.

    Raises:
        ConfigError: no backfill left (:func:`check_probe`), no encoder, nothing to sample, or
            fewer than two images could be read.
    """
    check_probe(store, pair)
    if encoder is None:
        raise ConfigError("probe needs the pair's encoder to re-embed the sample")
    model: OnnxEncoder = encoder
    ids, _, _ = read_all(store, pair.old_collection, active_where(pair), False, with_payloads=False)
    readable = store.count(pair.old_collection, active_where(pair) & Where(empty=(ERROR,)))
    if readable < 2:
        raise ConfigError(_nothing_to_sample(pair, readable, len(ids) - readable))
    rng = np.random.default_rng(seed)
    chosen = [ids[i] for i in sorted(rng.choice(len(ids), size=min(size, len(ids)), replace=False))]
    records = store.retrieve(pair.old_collection, chosen, with_vectors=True, vector=pair.vector)
    # In id order, as chosen: a server hands points back in its segments' order, which an
    # optimizer run changes, and the holdout split and the forecast's order are by row.
    by_id = {r.id: r for r in records}
    records = [by_id[i] for i in chosen if i in by_id]
    usable = [r for r in records if r.vector is not None]
    if on_plan is not None:
        on_plan(len(usable))
    gallery = model.info.gallery_output()
    outputs = [gallery, *(["rev"] if "rev" in model.info.outputs else [])]

    with ImageSource(source or SourceConfig()) as src, ThreadPoolExecutor(workers) as pool:
        points = [(r.id, r.payload) for r in usable]
        loaded = load_batch(model, src, pair.uri_rule, points, pool, workers=workers, on_image=on_image)
    kept = [usable[row] for row in loaded.rows]
    if len(kept) < 2:
        text = model.info.modality == "text"
        raise ConfigError(
            f"only {len(kept)} of {len(records)} sampled {'documents' if text else 'images'} could be read: "
            + (
                "check the pair's --text-field (or the documents' URIs)"
                if text
                else "check the payload uris (--root, --allow-scheme)"
            )
        )
    parts: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    for start in range(0, len(kept), _BATCH):
        for name, value in model.run_pixels(loaded.pixels[start : start + _BATCH], outputs).items():
            parts[name].append(value)
    return ProbeSample(
        ids=[r.id for r in kept],
        payloads=[dict(r.payload) for r in kept],
        old=np.stack([np.asarray(r.vector, dtype=np.float32) for r in kept]),
        new=np.concatenate(parts[gallery]),
        rev=np.concatenate(parts["rev"]) if "rev" in parts else None,
        encoder=model.fingerprint,
        failed=len(records) - len(kept),
        gallery=len(ids),
        decode=model.decoding,
    )


def forecast_sample(
    sample: ProbeSample,
    *,
    order: str = "random",
    seed: int = 0,
    k: int = 10,
    label_field: str = "label",
    calibration: OldDistance | None = None,
    metric: str = "cosine",
    order_field: str | None = None,
    rerank: int | None = None,
) -> list[ModeForecast]:
    """Simulate the backfill of the sample in ``order`` (as ``rmq migrate --order`` would move it).

    ``calibration``: a calibrated naive pair's map, applied to the naive mode's old distances;
    ``metric``: the pair's distance, under which both halves are searched; ``order_field``: the
    label field ``rmq migrate --order centroid`` groups by (the pair's; default ``label_field``);
    ``rerank``: each query's merged first ``rerank`` of the sample re-ranked by the new model.
    """
    keys = order_keys(
        order, sample.ids, sample.payloads, sample.old, seed=seed, label_field=order_field or label_field
    )
    return forecast(
        sample.old,
        sample.new,
        sample.rev,
        order=np.argsort(keys, kind="stable"),
        labels=sample.labels(label_field),
        k=k,
        naive_distance=calibration,
        metric=metric,
        rerank=rerank,
    )


# --- the cached sample, and the estimate for the current state ------------------------------------


def cache_path(location: str, name: str) -> Path:
    """Where the last probe of pair ``name`` on ``location`` is kept (see
    :func:`~rm_qdrant.caches.cache_root`)."""
    root = cache_root()
    key = hashlib.sha256(f"{location}\n{name}".encode()).hexdigest()[:16]
    return root / f"probe-{key}.npz"


def save_sample(sample: ProbeSample, path: Path, *, k: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"ids": sample.ids, "encoder": sample.encoder, "failed": sample.failed, "k": k}
    meta["decode"] = sample.decode
    arrays: dict[str, Any] = {
        "meta": np.array(json.dumps(meta)),
        "payloads": np.array(json.dumps(sample.payloads)),
        "old": sample.old,
        "new": sample.new,
    }
    if sample.rev is not None:
        arrays["rev"] = sample.rev
    tmp = path.with_suffix(".tmp.npz")  # written whole, then moved: a reader never sees half a file
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return path


def load_sample(path: Path) -> tuple[ProbeSample, int] | None:
    """The cached sample and its k, or None when there is none (or it cannot be read)."""
    try:
        with np.load(path) as saved:
            meta = json.loads(str(saved["meta"]))
            sample = ProbeSample(
                ids=meta["ids"],
                payloads=json.loads(str(saved["payloads"])),
                old=saved["old"],
                new=saved["new"],
                rev=saved["rev"] if "rev" in saved.files else None,
                encoder=meta["encoder"],
                failed=meta["failed"],
                decode=meta.get("decode", "exact"),
            )
            return sample, int(meta["k"])
    except (OSError, ValueError, KeyError):
        return None


def estimate_now(
    store: Store, pair: PairRecord, sample: ProbeSample, *, k: int, fraction: float | None = None
) -> dict[str, Any]:
    """The label-free quality of the pair's query mode now: the sample's migrated points as they are.

    A sampled point counts as migrated when the new collection holds it. ``crowded_out`` lists
    the side (old or new) whose share of the merged top k is far below its share of the gallery
    at ``fraction``, the pair's share migrated now (:func:`~rm_qdrant.core.forecast.crowding`,
    the rule ``rmq probe`` applies at each t): a probe samples the points still in old, so where
    fewer of the sample than ``fraction`` have migrated, sampled points still in old (in a seeded
    order) stand in for the migrated points the sample could not draw.
    """
    migrated_ids = ids_in_new(store, pair, list(sample.ids))
    migrated = np.array([i in migrated_ids for i in sample.ids], dtype=bool)
    rm = pair.mode == "rm" and sample.rev is not None
    query_old = sample.rev if rm and sample.rev is not None else sample.old
    reference = reference_top_k(sample.new, k, pair.distance)
    calibration = None if rm else pair.old_distance
    now, start = (
        merged_agreement(sample.new, query_old, sample.old, mask, reference, calibration, pair.distance)
        for mask in (migrated, np.zeros_like(migrated))
    )
    served = _at_fraction(migrated, fraction)
    found = merged_top_k(sample.new, query_old, sample.old, served, k, calibration, pair.distance)
    old_share, old_gallery = float((~served)[found].mean()), float((~served).mean())
    return {
        "mode": "rm" if rm else "naive",
        "sample": len(sample.ids),
        "sample_migrated": float(migrated.mean()),
        f"recall@{k}": now[0],
        f"ndcg@{k}": now[1],
        f"recall@{k}_start": start[0],
        "below_start": now[0] < start[0] - DIP_TOLERANCE,
        "old_share_top_k": old_share,
        "old_share_gallery": old_gallery,
        "crowded_out": [asdict(c) for c in crowding(1.0 - old_gallery, old_share, old_gallery)],
        "calibrated": calibration is not None,
        "k": k,
    }


def _at_fraction(migrated: np.ndarray, fraction: float | None, seed: int = 0) -> np.ndarray:
    """``migrated``, with sampled points still in old marked migrated (seeded) up to ``fraction``."""
    extra = 0 if fraction is None else round(fraction * len(migrated)) - int(migrated.sum())
    if extra <= 0:
        return migrated
    waiting = np.flatnonzero(~migrated)
    served = migrated.copy()
    served[np.random.default_rng(seed).permutation(waiting)[:extra]] = True
    return served
