"""Re-rank: the new model re-scores what the merged search found (pure: no I/O, no clock).

The old half of a backfilling pair is served through an approximation of the new model (ψ's
reverse vectors, or a calibrated old model), however it is trained. A re-rank takes the merged
list's first K hits, has the new model embed the old hits among them from their source (what
the migration would do to those points anyway, only earlier), and orders the K by the new
model's distances: new's hits already have theirs. A hit whose item could not be read in time
keeps its merged distance, and says why on :attr:`Hit.rerank`.

The states a hit of a re-ranked list carries (:attr:`Hit.rerank`):

- ``new``: from the new collection; its distance is the new model's already.
- ``embedded``: from old, embedded by the new model for this query.
- ``cached``: from old, its new-model vector computed for an earlier query.
- ``late``: from old, not read within the deadline; it keeps its merged distance.
- ``over budget``: from old, not read: the query's fetch budget was spent on closer hits.
- ``unreadable``: from old, its item could not be read or embedded (:attr:`Hit.rerank_error`
  says why); it keeps its merged distance.

Hits past the first K keep their merged order after the K, and ``rerank`` None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rm_qdrant.core.merge import Hit, PointId, check_distance, distance_line, rank_key
from rm_qdrant.errors import ConfigError

#: The largest K a re-rank takes: each of the K may be an image to read and embed.
MAX_RERANK = 10_000
#: Seconds a query waits for its candidates' items by default.
DEFAULT_DEADLINE = 0.5
#: A search's ``rerank`` default: the pair's recorded re-rank (``rmq init --rerank``).
PAIR_DEFAULT = "pair"
#: States of a hit whose distance is the new model's.
RESCORED = ("new", "embedded", "cached")


@dataclass(frozen=True)
class Rerank:
    """How a search re-ranks its merged list with the new model.

    Attributes:
        k: re-rank the merged list's first ``k`` hits (1 to :data:`MAX_RERANK`).
        deadline: seconds the query waits for the old hits' items (fetched and decoded in
            parallel); an item not read by then keeps its merged distance (``late``).
        budget: most items one query reads (None: ``k``); the closest old hits are read first,
            the rest keep their merged distance (``over budget``). 0: the cache alone.
        promote: write the vectors embedded for a query to new through the migration's
            claim/settle protocol, so a point users see migrates first.
    """

    k: int
    deadline: float = DEFAULT_DEADLINE
    budget: int | None = None
    promote: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= MAX_RERANK:
            raise ConfigError(f"rerank must be an integer from 1 to {MAX_RERANK:,}, got {self.k!r}")
        deadline = self.deadline
        if (
            isinstance(deadline, bool)
            or not isinstance(deadline, (int, float))
            or not math.isfinite(deadline)
            or deadline <= 0
        ):
            raise ConfigError(f"the re-rank deadline is a number of seconds > 0, got {deadline!r}")
        budget = self.budget
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
            raise ConfigError(f"the re-rank fetch budget is an integer >= 0 (0: cache only), got {budget!r}")
        if not isinstance(self.promote, bool):
            raise ConfigError(f"promote is True or False, got {self.promote!r}")

    def to_dict(self) -> dict[str, Any]:
        """The fields a pair record keeps."""
        return {"k": self.k, "deadline": self.deadline, "budget": self.budget, "promote": self.promote}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Rerank:
        """A recorded re-rank (fields this version does not know are left out).

        Raises:
            ConfigError: a recorded value out of range.
        """
        if not isinstance(raw, Mapping) or "k" not in raw:
            raise ConfigError(f"a recorded re-rank is an object with k, got {raw!r}")
        known = {k: raw[k] for k in ("k", "deadline", "budget", "promote") if k in raw}
        return cls(**known)

    @property
    def reads(self) -> int:
        """Most items a query reads."""
        return self.k if self.budget is None else min(self.budget, self.k)


def recorded_rerank(raw: Any, pair: str) -> Rerank | None:
    """Pair ``pair``'s recorded re-rank (``raw``, its record's field; None: none recorded).

    Raises:
        ConfigError: one this version cannot read (another version wrote it, or a hand edit),
            saying how to rewrite it; a search that gives ``rerank`` itself does not read it.
    """
    if raw is None:
        return None
    try:
        return Rerank.from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(
            f"pair {pair!r} records a re-rank this version cannot read ({exc}): "
            f"'rmq switch-encoder --name {pair} --rerank K' (or --no-rerank) rewrites it"
        ) from None


def as_rerank(value: Rerank | int | None, *, promote: bool | None = None) -> Rerank | None:
    """A search's ``rerank`` argument as a :class:`Rerank` (None: no re-rank); ``promote``, if
    given, overrides the one in ``value``."""
    if value is None:
        if promote:
            raise ConfigError("promote=True needs a re-rank (rerank=K): promotion writes its vectors")
        return None
    if isinstance(value, Rerank):
        return value if promote is None else replace(value, promote=promote)
    return Rerank(value, promote=bool(promote))


def new_distances(query: np.ndarray, vectors: np.ndarray, distance: str) -> np.ndarray:
    """The distances (lower is closer) from one query to each row of ``vectors``, as the new
    collection's ``distance`` measures them (cosine: ``1 - cos``; dot: ``-dot``; Euclid: L2;
    Manhattan: L1), in float64.

    >>> new_distances(np.array([1.0, 0.0]), np.array([[0.0, 2.0], [3.0, 0.0]]), "cosine").tolist()
    [1.0, 0.0]
    """
    name = check_distance(distance)
    q = np.asarray(query, dtype=np.float64).reshape(-1)
    v = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), -1)
    if name == "cosine":
        norms = np.linalg.norm(v, axis=1) * np.linalg.norm(q)
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = (v @ q) / norms
        return 1.0 - np.where(norms > 0, cos, 0.0)
    if name == "dot":
        return -(v @ q)
    if name == "euclid":
        return np.linalg.norm(v - q, axis=1)
    return np.abs(v - q).sum(axis=1)


def score_of(distance: float, metric: str) -> float:
    """The Qdrant score a distance stands for under ``metric`` (:func:`score_to_distance`'s inverse)."""
    at, slope = distance_line(metric)
    return (distance - at) / slope


@dataclass(frozen=True)
class Rescored:
    """What a re-rank learnt about one old hit: its new-model distance, or why it has none."""

    state: str  # embedded, cached, late, over budget, unreadable
    distance: float | None = None
    error: str | None = None


def reranked(hits: list[Hit], k: int, found: Mapping[PointId, Rescored], metric: str) -> list[Hit]:
    """``hits`` (a merged list, closest first) with its first ``k`` ordered by the new model's
    distances: new's hits as they are, old hits with a distance in ``found`` at that distance,
    the others at their merged distance; equal distances in id order (:func:`rank_key`).
    Each of the first ``k`` says what it is (:attr:`Hit.rerank`); the rest follow as they were.

    >>> a, b = Hit(1, 0.9, 0.1, "old"), Hit(2, 0.8, 0.2, "new")
    >>> [h.id for h in reranked([a, b], 2, {1: Rescored("embedded", 0.5)}, "cosine")]
    [2, 1]
    """
    head = []
    for hit in hits[:k]:
        if hit.source == "new":
            head.append(replace(hit, rerank="new"))
            continue
        got = found.get(hit.id)
        if got is None:  # a hit the re-rank did not reach: its merged distance, unmarked
            head.append(replace(hit, rerank="late"))
        elif got.distance is None:
            head.append(replace(hit, rerank=got.state, rerank_error=got.error))
        else:
            score = score_of(got.distance, metric)
            head.append(replace(hit, distance=got.distance, score=score, rerank=got.state))
    return sorted(head, key=rank_key) + hits[k:]
