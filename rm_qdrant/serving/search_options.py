"""The per-call options of :meth:`DualIndex.search`, in qdrant-client's vocabulary, and what
they do to a merged hit list (threshold, offset, payload selection)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from qdrant_client import models

from rm_qdrant.core.merge import Hit, PointId, score_to_distance
from rm_qdrant.core.planning import MOVING
from rm_qdrant.errors import ConfigError
from rm_qdrant.pair.bypass import stale_among
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.store import Store, Where
from rm_qdrant.store.base import ScoredRecord
from rm_qdrant.store.bounds import MAX_HITS
from rm_qdrant.store.filters import with_ids
from rm_qdrant.store.params import check_consistency, check_timeout, merge_params, with_defaults
from rm_qdrant.store.points import present_ids

#: What ``with_payload`` takes, as qdrant-client does.
PayloadSelection = bool | Sequence[str] | models.PayloadSelectorInclude | models.PayloadSelectorExclude


@dataclass(frozen=True)
class SearchOptions:
    """What one search asks besides its vectors, limit and filter.

    Attributes:
        score_threshold: Qdrant's: keep hits at least this close, in the pair's score
            (cosine, dot: ``score >= t``; euclid, manhattan: ``score <= t``). It is compared
            with each hit's merged :attr:`Hit.distance` (``distance <= score_to_distance(t)``),
            so an old hit of a naive pair is judged on its calibrated distance.
        offset: skip this many merged hits (each side is searched for ``limit + offset + 1``, and
            more where points tie at the end: pages of tied points follow their ids' order).
        with_payload: True, False (empty payloads), the field names to keep (Qdrant's paths:
            ``meta.dept``, ``items[].sku``), or ``models.PayloadSelectorInclude`` / ``Exclude``.
        with_vectors: attach each hit's vector, as the side it came from stores it.
        exact: scan every point (None: the index's default).
        hnsw_ef: HNSW search breadth (None: the index's default).
        search_params: qdrant-client's ``models.SearchParams`` (or a dict of its fields):
            ``indexed_only``, ``quantization``, ``acorn``, and ``exact`` / ``hnsw_ef`` unless
            given above (a different value there is a ConfigError).
        timeout: the request's timeout in seconds, for a server.
        consistency: how many replicas a server reads (an int, or ``models.ReadConsistencyType``).
    """

    score_threshold: float | None = None
    offset: int = 0
    with_payload: PayloadSelection = True
    with_vectors: bool = False
    exact: bool | None = None
    hnsw_ef: int | None = None
    search_params: models.SearchParams | Mapping[str, Any] | None = None
    timeout: int | None = None
    consistency: models.ReadConsistency | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.offset, int) or isinstance(self.offset, bool) or self.offset < 0:
            raise ConfigError(f"offset must be an integer >= 0, got {self.offset!r}")
        if self.score_threshold is not None and (
            isinstance(self.score_threshold, bool) or not isinstance(self.score_threshold, (int, float))
        ):
            raise ConfigError(f"score_threshold must be a number, got {self.score_threshold!r}")
        if self.score_threshold is not None and _not_a_float(self.score_threshold):
            raise ConfigError(
                f"score_threshold {self.score_threshold!r} is not a number a score compares with "
                "(give a finite number, or None)"
            )
        names = _selector_fields(self.with_payload)
        if not isinstance(self.with_payload, bool) and (
            isinstance(names, str)
            or not isinstance(names, Sequence)
            or not all(isinstance(f, str) for f in names)
        ):
            raise ConfigError(
                "with_payload is True, False, a list of field names or models.PayloadSelectorInclude/"
                f"Exclude, got {self.with_payload!r}"
            )
        if not isinstance(self.with_payload, bool):
            _tree(tuple(names))  # a path Qdrant cannot read is one line now, not an empty payload
        if not isinstance(self.with_vectors, bool):
            raise ConfigError(f"with_vectors is True or False, got {self.with_vectors!r}")
        if self.exact is not None and not isinstance(self.exact, bool):
            raise ConfigError(f"exact is True or False, got {self.exact!r}")
        if self.hnsw_ef is not None and (
            not isinstance(self.hnsw_ef, int)
            or isinstance(self.hnsw_ef, bool)
            or not 0 < self.hnsw_ef <= MAX_HITS
        ):
            raise ConfigError(f"hnsw_ef must be an integer from 1 to {MAX_HITS}, got {self.hnsw_ef!r}")
        check_timeout(self.timeout)
        check_consistency(self.consistency)

    def params(self, exact: bool, hnsw_ef: int | None) -> models.SearchParams:
        """This call's search parameters, an index's ``exact`` / ``hnsw_ef`` where it sets neither.

        Raises:
            ConfigError: bad ``search_params``, or ones that contradict ``exact`` / ``hnsw_ef``.
        """
        return with_defaults(merge_params(self.search_params, self.exact, self.hnsw_ef), exact, hnsw_ef)

    def bound(self, distance: str) -> float:
        """The farthest merged distance ``score_threshold`` keeps (infinity: no threshold)."""
        if self.score_threshold is None:
            return math.inf
        return score_to_distance(float(self.score_threshold), distance)

    def finish(self, hits: list[Hit], limit: int, distance: str) -> list[Hit]:
        """The merged list (``limit + offset`` long, ties in id order) as the caller asked for it."""
        if self.score_threshold is not None:
            bound = self.bound(distance)
            hits = [h for h in hits if h.distance <= bound]
        hits = hits[self.offset : self.offset + limit]
        if self.with_payload is True:
            return hits
        kept = selector(self.with_payload)  # the paths parsed once for the whole list
        return [replace(h, payload=kept(h.payload)) for h in hits]


def _not_a_float(value: float) -> bool:
    """NaN, or an integer too large to be a float."""
    try:
        return math.isnan(float(value))
    except OverflowError:
        return True


def selector(fields: PayloadSelection) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What ``with_payload`` keeps of a payload, as Qdrant's payload selector keeps it: ``a.b``
    goes into an object, ``a[].b`` into each item of a list, ``a[]`` keeps the list; a list
    named without ``[]`` (or by an index, ``a[0]``) keeps none of its items.
    ``models.PayloadSelectorExclude`` keeps the rest instead. The paths are parsed once: apply
    the function to each payload of a result."""
    if fields is True:
        return lambda payload: payload
    if fields is False:
        return lambda payload: {}
    if isinstance(fields, models.PayloadSelectorExclude):
        dropped = _tree(tuple(fields.exclude))
        return lambda payload: _dropped(payload, dropped)
    kept = _tree(tuple(_selector_fields(fields)))
    return lambda payload: _kept(payload, kept)


def _selector_fields(given: Any) -> Any:
    """The field names of a ``with_payload`` other than True/False (what it is, if not a selector)."""
    if isinstance(given, models.PayloadSelectorInclude):
        return given.include
    if isinstance(given, models.PayloadSelectorExclude):
        return given.exclude
    return given


#: One key of a payload path, as Qdrant reads it: quoted (any characters but a quote) or
#: letters, digits, ``_`` and ``-``; then any ``[]`` (every item of a list) or ``[N]``.
_STEP = re.compile(r'(?:"([^"]*)"|([\w-]+))((?:\[\d*\])*)')


def _steps(name: str) -> list[Any]:
    """The steps of a payload path (a key, None for ``[]``, an int for ``[N]``).

    Raises:
        ConfigError: not a path Qdrant reads (``a..b``, ``sp ace``, an unclosed quote).
    """
    bad = ConfigError(f"with_payload: {name!r} is not a payload path (keys joined by dots; quote others)")
    steps: list[Any] = []
    at = 0
    while True:
        step = _STEP.match(name, at)
        if step is None:
            raise bad
        steps.append(step.group(1) if step.group(1) is not None else step.group(2))
        steps += [None if i == "" else int(i) for i in re.findall(r"\[(\d*)\]", step.group(3))]
        at = step.end()
        if at == len(name):
            return steps
        if name[at] != "." or at + 1 == len(name):
            raise bad
        at += 1


def _tree(fields: tuple[str, ...]) -> dict[Any, Any]:
    """The fields as a tree of steps (see :func:`_steps`); True: all below."""
    tree: dict[Any, Any] = {}
    for name in fields:
        steps = _steps(name)
        node = tree
        for step in steps[:-1]:
            node = node.setdefault(step, {})
            if node is True:  # a shorter field keeps all of it already
                break
        else:
            node[steps[-1]] = True
    return tree


def _kept(value: Any, tree: dict[Any, Any]) -> Any:
    if isinstance(value, dict):
        return {k: v if tree[k] is True else _kept(v, tree[k]) for k, v in value.items() if k in tree}
    if isinstance(value, list):
        below = tree.get(None)
        if below is None:
            return []
        return value if below is True else [_kept(item, below) for item in value]
    return value


def _dropped(value: Any, tree: dict[Any, Any]) -> Any:
    if isinstance(value, dict):
        return {
            k: v if k not in tree else _dropped(v, tree[k])
            for k, v in value.items()
            if tree.get(k) is not True
        }
    if isinstance(value, list):
        below = tree.get(None)
        if below is None:
            return value
        return [] if below is True else [_dropped(item, below) for item in value]
    return value


def without_copies(
    store: Store, pair: PairRecord, found: list[list[ScoredRecord]], queries: Any, args: dict[str, Any]
) -> tuple[list[list[ScoredRecord]], list[set[PointId]]]:
    """Old's hits ``found`` for ``queries`` (searched with ``args``), less the points a migration
    step has already written to new; and the ids dropped from each row.

    Such a point is marked ``rmq_moving`` in old and present in new: a step cut short between
    its write and the removal from old, or one under way. It serves from new alone: if its copy
    is among the closest, new's own search finds it; its old copy, at its old distance, would be
    the point served by the wrong model. A list that lost hits is searched again, twice as deep
    each time (a batch of copies gathered near the query costs a few rounds, not one a hit), so
    it still holds the closest ``limit`` points old serves. New is read only when a hit is marked.
    """
    limit, rows, dropped = args["limit"], list(found), [set() for _ in found]
    copied: set[PointId] = set()
    checked: set[PointId] = set()
    for row, hits in enumerate(found):
        asked = limit
        while True:
            marked = [r.id for r in hits if r.payload.get(MOVING) is not None and r.id not in checked]
            if marked:
                checked.update(marked)
                copied |= present_ids(store, pair.new_collection, marked)
            kept = [r for r in hits if r.id not in copied]
            dropped[row] |= {r.id for r in hits if r.id in copied}
            rows[row] = kept[:limit]
            if len(kept) >= limit or len(hits) < asked:  # enough, or old has no more
                break
            asked *= 2
            hits = store.search(pair.old_collection, queries[row : row + 1], **{**args, "limit": asked})[0]
    return rows, dropped


def without_stale(
    store: Store, pair: PairRecord, found: list[list[ScoredRecord]], queries: Any, args: dict[str, Any]
) -> list[list[ScoredRecord]]:
    """New's hits ``found`` (searched with ``args``) less the stale copies: points whose old copy
    a writer that bypasses rm-qdrant rewrote after they migrated serve from old (see bypass.py).
    One read of old for every row's hits; a row that lost hits is searched again, twice as deep
    each time, so it still holds ``limit`` points."""
    stale = stale_among(store, pair, list({r.id for hits in found for r in hits}))
    if not stale:
        return found
    limit, rows = args["limit"], list(found)
    for row, hits in enumerate(found):
        asked = limit
        while any(r.id in stale for r in hits):
            kept = [r for r in hits if r.id not in stale]
            rows[row] = kept[:limit]
            if len(kept) >= limit or len(hits) < asked:  # enough, or new has no more
                break
            asked *= 2
            hits = store.search(pair.new_collection, queries[row : row + 1], **{**args, "limit": asked})[0]
            stale |= stale_among(store, pair, [r.id for r in hits if r.id not in stale])
            rows[row] = [r for r in hits if r.id not in stale][:limit]
    return rows


def with_late_copies(
    store: Store,
    pair: PairRecord,
    found: list[list[ScoredRecord]],
    dropped: list[set[PointId]],
    queries: Any,
    args: dict[str, Any],
) -> list[list[ScoredRecord]]:
    """New's hits ``found`` (searched with ``args`` at the same time as old's, as on a server),
    with the copies :func:`without_copies` dropped from old that they lack: new's search may have
    run before such a copy landed. Those ids alone are searched again, under the same filter."""
    rows = list(found)
    for row, hits in enumerate(found):
        if missing := list(dropped[row] - {r.id for r in hits}):
            only = {"filter": (args["filter"] or Where()) & with_ids(missing), "limit": len(missing)}
            late = store.search(pair.new_collection, queries[row : row + 1], **{**args, **only})[0]
            rows[row] = hits + late
    return rows


def with_vectors_of(store: Store, pair: PairRecord, rows: list[list[Hit]]) -> list[list[Hit]]:
    """The hits with their vectors, read from the side each came from (one read per side).

    A point rewritten between the search and this read gives its vector as of the read; one
    deleted meanwhile keeps ``vector=None``.
    """
    sides = {
        "old": (pair.old_collection, pair.vector),
        "new": (pair.new_collection, pair.new_using),
    }
    vectors: dict[tuple[str, PointId], Any] = {}
    for source, (name, vector) in sides.items():
        ids = list({h.id for hits in rows for h in hits if h.source == source})
        if ids:
            for record in store.retrieve(name, ids, with_vectors=True, vector=vector, with_payload=False):
                vectors[(source, record.id)] = record.vector
    return [[replace(h, vector=vectors.get((h.source, h.id))) for h in hits] for hits in rows]
