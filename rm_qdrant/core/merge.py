"""Distance rank merge: the paper's way of serving two collections as one.

Pure functions, no I/O. Qdrant reports a *score* whose meaning depends on the
distance (cosine and dot: a similarity, higher is better; Euclid and Manhattan:
the distance itself). :func:`score_to_distance` is the one place that turns a
score into a distance where lower is always better; everything else compares
distances only.

Ties: equal distances are ordered by point id (:func:`id_key`: integers ascending, then UUIDs
ascending, as Qdrant orders ids), so a merged list and every page of it have one order. A
store's search cut at ``limit`` keeps which of several tied points it likes; :func:`settled`
says whether a side's answer reached past the tie at the merged list's end, or the search
must ask for more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rm_qdrant.errors import ConfigError

PointId = int | str
Source = Literal["old", "new"]
DISTANCES = ("cosine", "dot", "euclid", "manhattan")


@dataclass(frozen=True)
class Hit:
    """One search result.

    Attributes:
        id: The point's id (an int or a UUID string).
        score: Qdrant's raw score, as the collection reported it.
        distance: The same result as a distance (lower is closer). For cosine this
            is the paper's cosine distance, ``1 - cosine similarity``.
        source: ``"old"`` or ``"new"``: the collection the hit came from.
        payload: The point's payload.
        vector: The point's vector as its side stores it (``with_vectors=True`` only).
        rerank: In a re-ranked search's first K: ``new``, ``embedded`` or ``cached`` (the
            distance is the new model's), or why an old hit keeps its merged distance:
            ``late``, ``over budget``, ``unreadable`` (see :mod:`rm_qdrant.core.rerank`).
            None elsewhere.
        rerank_error: Why an ``unreadable`` hit could not be re-scored.
    """

    id: PointId
    score: float
    distance: float
    source: Source
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    vector: Any = field(default=None, compare=False, repr=False)
    rerank: str | None = field(default=None, compare=False)
    rerank_error: str | None = field(default=None, compare=False, repr=False)


def check_distance(distance: str) -> str:
    """Return ``distance`` lower-cased, or raise ConfigError if it is unknown."""
    name = distance.lower()
    if name not in DISTANCES:
        raise ConfigError(f"unknown distance {distance!r}; expected one of {', '.join(DISTANCES)}")
    return name


def score_to_distance(score: float, distance: str) -> float:
    """Convert a Qdrant score into a distance where lower means closer.

    >>> score_to_distance(0.75, "cosine")
    0.25
    """
    name = check_distance(distance)
    if name == "cosine":
        return 1.0 - score
    if name == "dot":
        return -score
    return score


def distance_line(distance: str) -> tuple[float, float]:
    """``(at, slope)`` with ``score_to_distance(score, distance) == at + slope * score``: the
    conversion checked once for a whole result list.

    >>> distance_line("cosine")
    (1.0, -1.0)
    """
    return {"cosine": (1.0, -1.0), "dot": (0.0, -1.0)}.get(check_distance(distance), (0.0, 1.0))


def higher_is_closer(distance: str) -> float:
    """+1 where a higher Qdrant score is closer (cosine, dot), -1 where the score is the distance.

    A formula ranks by its value, highest first: ``max(sign * score_old, sign * score_new)``
    is then the merge's order, and ``sign * value`` the raw score again.

    >>> higher_is_closer("euclid")
    -1.0
    """
    return 1.0 if check_distance(distance) in ("cosine", "dot") else -1.0


#: A formula's value for a prefetch that did not return the point: never the closer one.
UNSEEN = 1e30


def id_key(point_id: PointId) -> tuple[int, int | str]:
    """The order of point ids among equal distances: integers ascending, then UUIDs ascending
    (their canonical lower-case text sorts as their 128-bit value), as Qdrant orders ids.

    >>> sorted([10, "00000000-0000-0000-0000-000000000001", 9], key=id_key)
    [9, 10, '00000000-0000-0000-0000-000000000001']
    """
    return (0, point_id) if isinstance(point_id, int) else (1, str(point_id))


def rank_key(hit: Hit) -> tuple[float, tuple[int, int | str]]:
    """A hit's place in a merged list: its distance, then its id (:func:`id_key`)."""
    return (hit.distance, id_key(hit.id))


def merge(old: Iterable[Hit], new: Iterable[Hit], limit: int) -> list[Hit]:
    """Merge two hit lists into one ranked by distance, at most ``limit`` long.

    Equal distances are ordered by id (:func:`rank_key`). A point present in both lists (a
    migration interrupted between its upsert into new and its removal from old) is returned
    once, as its new copy.

    Args:
        old: Hits from the old collection, any order.
        new: Hits from the new collection, any order.
        limit: How many hits to return.

    Returns:
        The closest ``limit`` distinct points, closest first.

    Example:
        >>> a = Hit(1, 0.9, 0.1, "old"); b = Hit(2, 0.8, 0.2, "new")
        >>> [h.id for h in merge([a], [b], 2)]
        [1, 2]
    """
    if limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    new_list = list(new)
    in_new = {hit.id for hit in new_list}
    candidates = new_list + [hit for hit in old if hit.id not in in_new]
    seen: set[PointId] = set()
    merged: list[Hit] = []
    for hit in sorted(candidates, key=rank_key):
        if len(merged) == limit:
            break
        if hit.id not in seen:
            seen.add(hit.id)
            merged.append(hit)
    return merged


def settled(
    sides: Sequence[Sequence[Hit]], asked: int, merged: Sequence[Hit], want: int, bound: float = math.inf
) -> bool:
    """Whether ``merged``, the first ``want`` hits of the union of ``sides`` by :func:`rank_key`,
    is the first ``want`` of everything the searched collections hold, ties at its end included.

    Each side is one search's answer for ``asked`` hits (``asked > want``; a merged query's
    answer, whose prefetches ask as many each, is one side). A side that gave fewer gave all it
    has; one that gave ``asked`` left out only points at least as far as its farthest hit, and of
    those, which tie with the farthest is the engine's choice. So the merged list is complete
    when each side gave fewer, or reaches strictly past the distance of the last hit kept: then
    every point at that distance is in it, and the id order decides among them. Else the search
    asks for more. ``bound`` is a score threshold's distance: ties past it are cut anyway.

    Example:
        >>> a, b, c = (Hit(i, 0.5, 0.5, "new") for i in (1, 2, 3))
        >>> settled([[a, b]], 2, [a], 1)  # 3 may tie with them too
        False
        >>> settled([[a, b], []], 3, [a], 1)
        True
    """
    last = math.inf  # fewer than asked for: complete only where every side gave all it has
    if len(merged) >= want:
        last = merged[want - 1].distance
        if last > bound:
            return True
    return all(len(side) < asked or max(h.distance for h in side) > last for side in sides)
