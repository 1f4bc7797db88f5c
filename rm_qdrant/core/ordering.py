"""Backfill orders: which gallery points migrate first (pure numpy, no I/O).

Each order gives every point a key; points migrate in ascending key order, so
the first to move are the ones the old model serves worst (the paper's appendix):

- ``random``: a seeded hash of the id.
- ``confidence``: the old classifier's max-softmax (payload ``old_confidence``,
  written by ``rmq index`` when the old encoder has a ``scores`` output);
  least confident first.
- ``centroid``: cosine similarity of the old vector to its class centroid
  (the payload label field, ``label`` by default); least typical first.
- ``centroid-unsupervised``: the same against spherical k-means centroids of the
  old vectors, for galleries without labels.
- ``demand``: the points searches returned from old most often first (the count
  ``rmq_demand`` that a :class:`~rm_qdrant.serving.demand.DemandLog` adds to the old
  payload), descending; the points never returned after them, in the ``random`` order.
  Demand changes while the gallery serves, so an unsharded run ranks again at its start
  (see :func:`rm_qdrant.migration.ranking.order_ready`).
- ``payload:FIELD``: any sortable payload field (numbers, or strings such as ISO
  dates), ascending; points without it go last.

A field (``payload:asset.created_at``, the label field ``meta.dept``) is a payload
path: dots go into objects (:mod:`rm_qdrant.core.paths`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.paths import check_path, payload_value
from rm_qdrant.core.planning import DEMAND
from rm_qdrant.errors import ConfigError

DEMAND_ORDER = "demand"
ORDERS = ("random", "confidence", "centroid", "centroid-unsupervised", DEMAND_ORDER, "payload:FIELD")
CONFIDENCE_FIELD = "old_confidence"
BUCKETS = 256


def check_order(spec: str) -> str:
    """Return ``spec`` if it names an order, else raise ConfigError."""
    if spec in ORDERS[:-1]:
        return spec
    if spec.startswith("payload:") and len(spec) > len("payload:"):
        check_path(spec.split(":", 1)[1], "--order payload:FIELD")
        return spec
    raise ConfigError(f"unknown backfill order {spec!r}; expected one of {', '.join(ORDERS)}")


def needs_vectors(spec: str) -> bool:
    """Whether the order reads the old vectors (the centroid orders do)."""
    return spec.startswith("centroid")


def needs_payloads(spec: str) -> bool:
    """Whether the order reads the payloads (``random`` and ``centroid-unsupervised`` do not)."""
    return spec in ("confidence", "centroid", DEMAND_ORDER) or spec.startswith("payload:")


def demand_count(payload: Mapping[str, Any]) -> int:
    """The searches that returned this point from old, as its payload says (0 when it has no
    count, or one that is not a whole number >= 0: a writer that bypasses rm-qdrant may have
    put anything there)."""
    value = payload.get(DEMAND)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return 0
    return int(min(value, 2**53))


def bucket(point_id: PointId) -> int:
    """A stable bucket in [0, BUCKETS) for sharding work by id."""
    return hashlib.blake2b(str(point_id).encode(), digest_size=2).digest()[0] % BUCKETS


def shard_buckets(index: int, count: int) -> list[int]:
    """The buckets worker ``index`` of ``count`` owns (each bucket has exactly one owner)."""
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"bad shard {index}/{count}: need 0 <= i < n")
    return [b for b in range(BUCKETS) if b % count == index]


def _random_keys(ids: Sequence[PointId], seed: int) -> np.ndarray:
    digests = (hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest() for i in ids)
    return np.array([int.from_bytes(d, "big") / 2.0**64 for d in digests])


def _demand_keys(ids: Sequence[PointId], payloads: Sequence[Mapping[str, Any]], seed: int) -> np.ndarray:
    """Minus each point's count, plus its random key in [0, 1): descending counts, and points of
    one count (those never returned among them) in the seeded random order."""
    if len(payloads) != len(ids):
        raise ConfigError(f"order {DEMAND_ORDER!r} needs the payload of every point")
    counts = np.array([demand_count(p) for p in payloads], dtype=np.float64)
    return _random_keys(ids, seed) - counts


def _numeric_field(payloads: Sequence[Mapping[str, Any]], field: str, hint: str) -> np.ndarray:
    values = [payload_value(p, field) for p in payloads]
    missing = sum(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values)
    if missing:
        raise ConfigError(f"{missing} of {len(values)} points have no numeric payload {field!r}; {hint}")
    return np.asarray(values, dtype=np.float64)


def _sortable_field(payloads: Sequence[Mapping[str, Any]], field: str) -> np.ndarray:
    """Positions in ascending order of ``field`` (numbers or strings, one kind); missing last."""
    values = [payload_value(p, field) for p in payloads]
    present = [v for v in values if v is not None]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)
    if not present or not (numbers or all(isinstance(v, str) for v in present)):
        kinds = sorted({type(v).__name__ for v in present}) or ["none"]
        raise ConfigError(
            f"payload {field!r} must be numbers or strings on the points that have it, found "
            f"{', '.join(kinds)}; choose another field for --order payload:FIELD"
        )
    if not numbers:
        values = _as_instants(values)
    order = sorted(
        range(len(values)), key=lambda i: (values[i] is None, values[i] if values[i] is not None else 0)
    )
    keys = np.empty(len(values))
    keys[order] = np.arange(len(values))
    return keys


def _as_instants(values: list[Any]) -> list[Any]:
    """ISO dates and times as UTC timestamps (a time without a zone read as UTC, as Qdrant's
    datetime filters read it), so ``...+05:00`` and ``...Z`` sort by the moment they name; any
    other string: the values unchanged (sorted as text)."""
    instants: list[Any] = []
    for value in values:
        if value is None:
            instants.append(None)
            continue
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return values
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        instants.append(moment.timestamp())
    return instants


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def _centroid_keys(vectors: np.ndarray, groups: np.ndarray) -> np.ndarray:
    unit = _unit(vectors)
    keys = np.empty(len(unit))
    for g in np.unique(groups):
        members = groups == g
        centre = _unit(unit[members].mean(axis=0, keepdims=True))[0]
        keys[members] = unit[members] @ centre
    return keys


def spherical_kmeans(vectors: np.ndarray, k: int, *, seed: int = 0, iterations: int = 20) -> np.ndarray:
    """Cluster unit vectors by cosine similarity; returns each row's cluster index."""
    unit = _unit(vectors)
    rng = np.random.default_rng(seed)
    centres = unit[rng.choice(len(unit), size=min(k, len(unit)), replace=False)]
    labels = np.zeros(len(unit), dtype=np.int64)
    for _ in range(iterations):
        labels = np.argmax(unit @ centres.T, axis=1)
        for c in range(len(centres)):
            members = unit[labels == c]
            if len(members):
                centres[c] = _unit(members.mean(axis=0, keepdims=True))[0]
    return labels


def order_keys(
    spec: str,
    ids: Sequence[PointId],
    payloads: Sequence[Mapping[str, Any]],
    vectors: np.ndarray | None = None,
    *,
    seed: int = 0,
    clusters: int | None = None,
    label_field: str = "label",
) -> np.ndarray:
    """One key per point for the order ``spec``; points migrate in ascending key order.

    Raises:
        ConfigError: the order is unknown, or the points lack what it reads.
    """
    check_order(spec)
    if len(ids) == 0:
        return np.zeros(0)
    if spec == "random":
        return _random_keys(ids, seed)
    if spec == DEMAND_ORDER:
        return _demand_keys(ids, payloads, seed)
    if spec == "confidence":
        return _numeric_field(
            payloads, CONFIDENCE_FIELD, "index with an old encoder that has a 'scores' output"
        )
    if spec.startswith("payload:"):
        return _sortable_field(payloads, spec.split(":", 1)[1])
    if vectors is None or len(vectors) != len(ids):
        raise ConfigError(f"order {spec!r} needs the old vectors of every point")
    if spec == "centroid":
        labels = [payload_value(p, label_field) for p in payloads]
        odd = sorted({type(v).__name__ for v in labels if isinstance(v, (list, dict, tuple))})
        if odd:
            raise ConfigError(
                f"payload {label_field!r} holds {', '.join(odd)} values: the centroid order needs one label "
                "per point (a string or number); use 'centroid-unsupervised'"
            )
        if any(label is None for label in labels):
            missing = sum(label is None for label in labels)
            raise ConfigError(
                f"{missing} points have no {label_field!r} payload (the pair's label field, "
                "rmq init --label-field); use 'centroid-unsupervised' for unlabelled galleries"
            )
        return _centroid_keys(vectors, np.unique(np.asarray(labels, dtype=str), return_inverse=True)[1])
    k = clusters or max(2, min(100, int(np.sqrt(len(ids) / 2))))
    return _centroid_keys(vectors, spherical_kmeans(vectors, k, seed=seed))


def ranks(keys: np.ndarray) -> np.ndarray:
    """Positions 0..n-1 in ascending key order (ties keep input order)."""
    positions = np.empty(len(keys), dtype=np.int64)
    positions[np.argsort(keys, kind="stable")] = np.arange(len(keys))
    return positions
