"""Filters: the payload and vector conditions rm-qdrant asks a store for, whatever the backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qdrant_client import models

from rm_qdrant.core.merge import PointId
from rm_qdrant.errors import ConfigError
from rm_qdrant.store.qfilter import check_filter, range_condition


@dataclass(frozen=True)
class Where:
    """A payload filter. Every condition must hold.

    Attributes:
        must: field -> value: the field equals the value (or, for a list, any of them).
        must_not: field -> value: the field equals none of them.
        empty: fields that must be absent (or null, or an empty list).
        not_empty: fields that must be present.
        has_vector: named vectors the point must have.
        lacks_vector: named vectors the point must not have.
        slice: ``(i, n)``: the i-th of n disjoint slices of the points (by id hash).
        clauses: qdrant-client ``models.Filter`` s that must hold too (the search API's filters).
    """

    must: Mapping[str, Any] = field(default_factory=dict)
    must_not: Mapping[str, Any] = field(default_factory=dict)
    empty: tuple[str, ...] = ()
    not_empty: tuple[str, ...] = ()
    has_vector: tuple[str, ...] = ()
    lacks_vector: tuple[str, ...] = ()
    slice: tuple[int, int] | None = None
    clauses: tuple[models.Filter, ...] = ()

    def __and__(self, other: Where) -> Where:
        if self.slice is not None and other.slice is not None and self.slice != other.slice:
            raise ConfigError(f"two slices in one filter: {self.slice} and {other.slice}")
        return Where(
            {**self.must, **other.must},
            {**self.must_not, **other.must_not},
            self.empty + other.empty,
            self.not_empty + other.not_empty,
            self.has_vector + other.has_vector,
            self.lacks_vector + other.lacks_vector,
            self.slice or other.slice,
            self.clauses + other.clauses,
        )

    def __bool__(self) -> bool:
        return bool(
            self.must
            or self.must_not
            or self.empty
            or self.not_empty
            or self.has_vector
            or self.lacks_vector
            or self.slice
            or self.clauses
        )


#: What the search API takes as a filter: a qdrant-client ``models.Filter``, a :class:`Where`,
#: or a plain mapping: every key must equal its value, a list matching any of its values,
#: and a dict value is a range with Qdrant's keys (numbers, or ISO dates): ``{"label": "cat",
#: "shard": [0, 1], "created_at": {"gte": "2025-01-01"}}``. A dict with other keys is refused,
#: never read as an equality.
Filter = Where | models.Filter | Mapping[str, Any]


def with_ids(ids: Sequence[PointId]) -> Where:
    """The points whose id is one of ``ids``."""
    return Where(clauses=(models.Filter(must=[models.HasIdCondition(has_id=list(ids))]),))


def as_where(filter: Filter | None) -> Where | None:
    """Turn the public filter forms into a :class:`Where` (None when there is no condition).

    Raises:
        ConfigError: a mapping whose dict value is not a range.
    """
    if filter is None:
        return None
    if isinstance(filter, models.Filter):
        where = Where(clauses=(check_filter(filter),))
    elif isinstance(filter, Where):
        where = filter
    elif isinstance(filter, Mapping):
        where = _from_mapping(filter)
    else:
        raise ConfigError(f"a filter is a models.Filter, a Where or a dict, not {type(filter).__name__}")
    return where if where else None


def _from_mapping(filter: Mapping[str, Any]) -> Where:
    ranges = {k: v for k, v in filter.items() if isinstance(v, Mapping)}
    if not ranges:
        return Where(must=dict(filter))
    equal = {k: v for k, v in filter.items() if k not in ranges}
    clause = models.Filter(must=[range_condition(k, v) for k, v in ranges.items()])
    return Where(must=equal, clauses=(clause,))


def match_values(value: Any) -> tuple[list[Any] | None, Any]:
    """Split a filter value into (list for match-any, None) or (None, scalar for match-value)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value), None
    return None, value
