"""Filters: the payload and vector conditions rm-qdrant asks a store for, whatever the backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qdrant_client import models

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.paths import fits_int64
from rm_qdrant.errors import ConfigError, InvalidFilter
from rm_qdrant.store.bounds import check_key_path
from rm_qdrant.store.qfilter import check_filter, check_text, range_condition

#: The most slices a ``Where.slice`` cuts the points into (qdrant-edge's ``SliceCondition``
#: takes 32-bit counts).
MAX_SLICES = 2**32 - 1


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
        must, both = _joined(self.must, other.must, negated=False)
        must_not, neither = _joined(self.must_not, other.must_not, negated=True)
        return Where(
            must,
            must_not,
            self.empty + other.empty,
            self.not_empty + other.not_empty,
            self.has_vector + other.has_vector,
            self.lacks_vector + other.lacks_vector,
            self.slice or other.slice,
            self.clauses + other.clauses + both + neither,
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
        where = _checked(filter)
    elif isinstance(filter, Mapping):
        where = _from_mapping(filter)
    else:
        raise ConfigError(f"a filter is a models.Filter, a Where or a dict, not {type(filter).__name__}")
    return where if where else None


def _checked(where: Where) -> Where:
    """``where`` once its parts are what a :class:`Where` holds, checked as the other forms are
    (a hand-built one reached the stores unchecked: binding internals, or a raw OverflowError)."""
    for name in ("must", "must_not"):
        given = getattr(where, name)
        if not isinstance(given, Mapping):
            raise InvalidFilter(f"Where.{name} is a mapping of field -> value, not {type(given).__name__}")
        for key, value in given.items():
            if not isinstance(key, str):
                raise InvalidFilter(
                    f"Where.{name}'s keys are field names (strings), not {type(key).__name__}"
                )
            check_key_path(key)
            if isinstance(value, Mapping):
                raise InvalidFilter(
                    f"filter on {key!r}: a Where matches a value or a list of them, not a dict; "
                    f"for a range give a dict filter, {{{key!r}: {{'gte': ...}}}}"
                )
            _check_value(key, value)
    for name in ("empty", "not_empty", "has_vector", "lacks_vector"):
        given = getattr(where, name)
        if isinstance(given, str) or not all(isinstance(one, str) for one in given):
            raise InvalidFilter(f"Where.{name} is a tuple of names (strings), got {given!r:.60}")
        for one in given:
            if name in ("empty", "not_empty"):
                check_key_path(one)
            else:
                check_text(one, one)
    if where.slice is not None:
        _check_slice(where.slice)
    for clause in where.clauses:
        if not isinstance(clause, models.Filter):
            raise InvalidFilter(f"Where.clauses are models.Filter s, not {type(clause).__name__}")
        check_filter(clause)
    return where


def _check_slice(given: Any) -> None:
    ok = isinstance(given, tuple) and len(given) == 2 and all(type(n) is int for n in given)
    if not ok or not 0 <= given[0] < given[1] <= MAX_SLICES:
        raise InvalidFilter(
            f"Where.slice is (i, n): the i-th of n slices, 0 <= i < n <= {MAX_SLICES}, got {given!r:.60}"
        )


def _joined(
    first: Mapping[str, Any], second: Mapping[str, Any], *, negated: bool
) -> tuple[dict[str, Any], tuple[models.Filter, ...]]:
    """Two field -> value maps as one, and the conditions of ``second`` on a field ``first``
    has with another value, as a clause: both hold (a map keeps one value a field)."""
    joined, apart = dict(first), []
    for key, value in second.items():
        if key in joined and not _same(joined[key], value):
            apart.append(equality(key, value))
        else:
            joined[key] = value
    if not apart:
        return joined, ()
    return joined, (models.Filter(must_not=apart) if negated else models.Filter(must=apart),)


def _same(a: Any, b: Any) -> bool:
    """Equal as a filter reads them: ``1`` and ``True`` are not the same value, nor ``1`` and ``1.0``
    (a list: the same values, in any order)."""

    def spelled(value: Any) -> Any:
        many = isinstance(value, (list, tuple, set, frozenset))
        return sorted(map(repr, value)) if many else repr(value)

    return spelled(a) == spelled(b)


def equality(key: str, value: Any) -> models.FieldCondition:
    """The field equals ``value`` (or, for a list, any of its values), as qdrant-client says it."""
    many, one = match_values(value)
    match: Any = models.MatchAny(any=many) if many is not None else models.MatchValue(value=one)
    return models.FieldCondition(key=key, match=match)


def _check_value(key: str, value: Any) -> None:
    """Refuse a plain filter value no store can match as given, in one line that says what to
    give instead (a decimal number or a null would otherwise be a library's traceback)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        for one in value:
            if isinstance(one, (list, tuple, set, frozenset, bool)):
                raise InvalidFilter(
                    f"filter on {key!r}: a list matches any of its strings or integers, not {one!r}; "
                    "for true/false give one value, or a models.Filter with should conditions"
                )
            _check_value(key, one)
        if len({type(one) for one in value}) > 1:
            raise InvalidFilter(
                f"filter on {key!r}: a list matches strings or integers, not both ({value!r})"
            )
        return
    if isinstance(value, str) and not value.isascii():
        check_text(key, value)
    if isinstance(value, bool | str) or (isinstance(value, int) and fits_int64(value)):
        return
    if isinstance(value, int):
        raise InvalidFilter(
            f"filter on {key!r}: {value} is outside the 64-bit integers a filter matches "
            "(-2**63 to 2**63 - 1)"
        )
    if isinstance(value, float):
        raise InvalidFilter(
            f"filter on {key!r}: a plain value matches a string, an integer or true/false; for the "
            f"number {value} give a range, {{{key!r}: {{'gte': {value}, 'lte': {value}}}}}"
        )
    if value is None:
        raise InvalidFilter(
            f"filter on {key!r}: a plain value cannot be None; for a null or missing field give "
            "models.Filter(must=[models.IsNullCondition(...)]) or models.IsEmptyCondition"
        )
    raise InvalidFilter(
        f"filter on {key!r}: a plain value is a string, an integer, true/false or a list of them, "
        f"not {type(value).__name__}"
    )


def _from_mapping(filter: Mapping[str, Any]) -> Where:
    for key, value in filter.items():
        if not isinstance(key, str):
            raise InvalidFilter(
                f"a filter's keys are field names (strings), not {type(key).__name__} {key!r:.40}"
            )
        check_key_path(key)
        if not isinstance(value, Mapping):
            _check_value(key, value)
    ranges = {k: v for k, v in filter.items() if isinstance(v, Mapping)}
    if not ranges:
        return Where(must=dict(filter))
    equal = {k: v for k, v in filter.items() if k not in ranges}
    clause = check_filter(models.Filter(must=[range_condition(k, v) for k, v in ranges.items()]))
    return Where(must=equal, clauses=(clause,))


def match_values(value: Any) -> tuple[list[Any] | None, Any]:
    """Split a filter value into (list for match-any, None) or (None, scalar for match-value)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value), None
    return None, value
