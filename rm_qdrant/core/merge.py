"""Distance rank merge: the paper's way of serving two collections as one.

Pure functions, no I/O. Qdrant reports a *score* whose meaning depends on the
distance (cosine and dot: a similarity, higher is better; Euclid and Manhattan:
the distance itself). :func:`score_to_distance` is the one place that turns a
score into a distance where lower is always better; everything else compares
distances only.
"""

from __future__ import annotations

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
    """

    id: PointId
    score: float
    distance: float
    source: Source
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    vector: Any = field(default=None, compare=False, repr=False)


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


def _order_key(hit: Hit) -> tuple[float, int, str]:
    # Deterministic ties: equal distances put the new copy first, then order by id.
    return (hit.distance, 0 if hit.source == "new" else 1, str(hit.id))


def merge(old: Iterable[Hit], new: Iterable[Hit], limit: int) -> list[Hit]:
    """Merge two hit lists into one ranked by distance, at most ``limit`` long.

    A point present in both lists (a migration interrupted between its upsert
    into new and its removal from old) is returned once, as its new copy.

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
    for hit in sorted(candidates, key=_order_key):
        if len(merged) == limit:
            break
        if hit.id not in seen:
            seen.add(hit.id)
            merged.append(hit)
    return merged


def merge_batches(old: Sequence[Sequence[Hit]], new: Sequence[Sequence[Hit]], limit: int) -> list[list[Hit]]:
    """:func:`merge` applied query by query to two equally long batches."""
    if len(old) != len(new):
        raise ConfigError(f"batch sizes differ: {len(old)} old vs {len(new)} new result lists")
    return [merge(o, n, limit) for o, n in zip(old, new, strict=True)]
