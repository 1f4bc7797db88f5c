"""qdrant-client's ``models.Filter`` as the search API's filter: read from the public forms,
and translated for qdrant-edge, whose filter model is its own.

qdrant-client takes a ``models.Filter`` as it is (one more ``must`` clause); qdrant-edge
gets the same conditions rebuilt from its classes (geo, text, nested and the rest). A
condition it cannot express is refused with a :class:`ConfigError` that names it.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Iterable, Iterator, Mapping
from datetime import date, datetime, timezone
from typing import Any

import qdrant_edge as qe
from pydantic import ValidationError
from qdrant_client import models

from rm_qdrant.errors import ConfigError, InvalidFilter
from rm_qdrant.store.bounds import (
    INT64,
    MAX_FILTER_DEPTH,
    UINT64_MAX,
    check_json_depth,
    check_key_path,
    is_utf8,
)
from rm_qdrant.store.ids import normalize_ids

#: The keys of a range, as Qdrant's ``Range``/``DatetimeRange`` have them.
RANGE_KEYS = frozenset({"gt", "gte", "lt", "lte"})
#: The last few id sets made into qdrant-edge conditions. qdrant-edge parses each UUID of a
#: ``HasIdCondition`` anew (2-3 µs an id), and a migration batch filters by the same ids in
#: several calls (claim, write, count, mark): they share one condition.
_HAS_ID: dict[frozenset, qe.HasIdCondition] = {}
_HAS_ID_KEPT, _HAS_ID_LARGEST = 8, 65_536
_HAS_ID_LOCK = threading.Lock()


def has_id(ids: Iterable[Any]) -> qe.HasIdCondition:
    """qdrant-edge's condition for the points whose id is one of ``ids`` (normalised; a set
    seen lately reuses its condition)."""
    key = frozenset(normalize_ids(ids))
    with _HAS_ID_LOCK:
        found = _HAS_ID.get(key)
    if found is None:
        found = qe.HasIdCondition(set(key))
        if len(key) <= _HAS_ID_LARGEST:
            with _HAS_ID_LOCK:
                while len(_HAS_ID) >= _HAS_ID_KEPT:
                    del _HAS_ID[next(iter(_HAS_ID))]
                _HAS_ID[key] = found
    return found


def parse_filter(raw: Mapping[str, Any]) -> models.Filter:
    """A filter in Qdrant's REST/JSON shape (``{"must": [{"key": "price", "range": {"gte": 10}}]}``).

    Raises:
        ConfigError: the mapping is not a valid Qdrant filter (the first problem, in one line).
    """
    check_json_depth(raw, 3 * MAX_FILTER_DEPTH + 8, f"a filter nested deeper than {MAX_FILTER_DEPTH} levels")
    try:
        return models.Filter.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"not a Qdrant filter: {json_path(first['loc'])}: {first['msg']}") from None


def json_path(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a path in the user's JSON: ``must[0].range.gte`` (the
    union and class names pydantic adds are left out)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" not in part and not part[:1].isupper():
            path += f".{part}" if path else part
    return path or "the filter"


def range_condition(key: str, bounds: Mapping[str, Any]) -> models.FieldCondition:
    """``{"gte": 10}`` on ``key`` as a Qdrant range: numbers give a ``Range``, dates (ISO strings
    or ``datetime``) a ``DatetimeRange``.

    Raises:
        ConfigError: a key that is not one of gt/gte/lt/lte, or a bound that is neither.
    """
    unknown = sorted(set(bounds) - RANGE_KEYS)
    if unknown or not bounds:
        raise ConfigError(
            f"filter on {key!r}: a dict value is a range with the keys gt, gte, lt, lte "
            f"(got {sorted(bounds)}); for equality with a dict, use models.Filter"
        )
    given = {k: v for k, v in bounds.items() if v is not None}  # None: that end is open, as in Range
    as_numbers = {k: _number(v) for k, v in given.items()}
    try:
        if given and None not in as_numbers.values():
            return models.FieldCondition(key=key, range=models.Range(**as_numbers))
        if given and all(isinstance(v, (str, date)) for v in given.values()):
            return models.FieldCondition(key=key, range=models.DatetimeRange(**given))
    except ValidationError:
        pass
    raise ConfigError(f"filter on {key!r}: range bounds must be numbers or dates, got {dict(bounds)}")


def _number(value: Any) -> int | float | None:
    """A range bound as a number (numpy's and Decimal included), or None where it is not one:
    a bool, or a date (pydantic would read a number as seconds since 1970)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Number) or isinstance(value, complex):
        return None
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def check_filter(filter: models.Filter) -> models.Filter:
    """``filter`` as it is, once checked as a Qdrant server checks it, so both stores answer
    alike: nested at most :data:`~rm_qdrant.store.bounds.MAX_FILTER_DEPTH` levels, every
    ``FieldCondition`` with a condition, no NaN range bound, no empty ``min_should``, integers
    and ids within 64 bits, geo points within range (local mode matched nothing for these).

    Raises:
        InvalidFilter: the first such problem, named with its key.
    """
    for condition in _every_condition(filter, 1):
        if isinstance(condition, models.FieldCondition):
            check_key_path(condition.key)
            _check_field(condition)
        elif isinstance(condition, models.IsEmptyCondition | models.IsNullCondition):
            field = (
                condition.is_empty if isinstance(condition, models.IsEmptyCondition) else condition.is_null
            )
            check_key_path(field.key)
        elif isinstance(condition, models.HasVectorCondition):
            check_text(condition.has_vector, condition.has_vector)
        elif isinstance(condition, models.HasIdCondition):
            try:
                normalize_ids(condition.has_id)
            except ConfigError as exc:
                raise InvalidFilter(f"filter by id: {exc}") from None
    return filter


def _check_field(c: models.FieldCondition) -> None:
    if all(getattr(c, name) is None for name in _FIELD_CONDITIONS):
        raise InvalidFilter(
            f"filter on {c.key!r}: a FieldCondition needs a condition ({', '.join(_FIELD_CONDITIONS)})"
        )
    for p in _geo_points(c):
        if not (-180 <= p.lon <= 180 and -90 <= p.lat <= 90):
            raise InvalidFilter(
                f"filter on {c.key!r}: a geo point needs lon within [-180, 180] and "
                f"lat within [-90, 90], got lon={p.lon:g}, lat={p.lat:g}"
            )
    if isinstance(c.range, models.Range):
        for end in ("gt", "gte", "lt", "lte"):
            bound = getattr(c.range, end)
            if isinstance(bound, float) and math.isnan(bound):
                raise InvalidFilter(f"filter on {c.key!r}: range bound {end} is NaN (give a number, or None)")
    if c.geo_radius is not None and not c.geo_radius.radius >= 0:  # NaN too
        raise InvalidFilter(
            f"filter on {c.key!r}: a geo radius is a distance in meters, 0 or more, got {c.geo_radius.radius}"
        )
    if c.values_count is not None:
        for end in ("gt", "gte", "lt", "lte"):
            check_count(f"filter on {c.key!r}: values_count.{end}", getattr(c.values_count, end))
    match = c.match
    given = [getattr(match, "value", None)] + list(getattr(match, "any", None) or [])
    given += list(getattr(match, "except_", None) or [])
    for name in ("text", "phrase", "text_any"):
        given.append(getattr(match, name, None))
    for value in given:
        if type(value) is str and not value.isascii():
            check_text(c.key, value)
        if type(value) is int and not INT64[0] <= value <= INT64[1]:
            raise InvalidFilter(
                f"filter on {c.key!r}: {value} is outside the 64-bit integers a filter matches "
                "(-2**63 to 2**63 - 1)"
            )


def check_count(what: str, count: Any) -> None:
    """Refuse a count a server reads as an unsigned 64-bit integer (``values_count``,
    ``min_count``) where it is not one: the embedded store's binding raised a raw OverflowError."""
    if count is not None and not 0 <= count <= UINT64_MAX:
        raise InvalidFilter(f"{what} is a count from 0 to 2**64 - 1, got {count}")


def check_text(key: Any, text: str) -> None:
    """Refuse a filter string that is not UTF-8 (a lone surrogate), as a payload's is refused:
    the embedded store's binding failed in four lines, local mode matched nothing."""
    if not is_utf8(text):
        raise InvalidFilter(
            f"filter on {key!r:.60}: {text!r:.60} is not UTF-8 text (it holds a lone surrogate)"
        )


#: The conditions a ``FieldCondition`` may carry: a server refuses one with none of them.
_FIELD_CONDITIONS = (
    "match",
    "range",
    "geo_bounding_box",
    "geo_radius",
    "geo_polygon",
    "values_count",
    "is_empty",
    "is_null",
)


def _every_condition(filter: models.Filter, depth: int) -> Iterator[Any]:
    if depth > MAX_FILTER_DEPTH:
        raise InvalidFilter(f"a filter nested deeper than the {MAX_FILTER_DEPTH} levels a filter may have")
    if filter.min_should is not None:
        check_count("min_should.min_count", filter.min_should.min_count)
    if filter.min_should is not None and filter.min_should.min_count < 1:
        raise InvalidFilter(f"min_should.min_count is at least 1, got {filter.min_should.min_count}")
    if filter.min_should is not None and not filter.min_should.conditions:
        raise InvalidFilter(
            f"min_should asks for {filter.min_should.min_count} of no conditions: give its conditions"
        )
    groups = [filter.must, filter.should, filter.must_not]
    groups.append(None if filter.min_should is None else filter.min_should.conditions)
    for group in groups:
        for c in group if isinstance(group, list) else [] if group is None else [group]:
            if isinstance(c, models.Filter):
                yield from _every_condition(c, depth + 1)
            elif isinstance(c, models.NestedCondition):
                check_key_path(c.nested.key)
                yield from _every_condition(c.nested.filter, depth + 1)
            else:
                yield c


def _geo_points(c: models.FieldCondition) -> list[models.GeoPoint]:
    points = []
    if c.geo_bounding_box is not None:
        points += [c.geo_bounding_box.top_left, c.geo_bounding_box.bottom_right]
    if c.geo_radius is not None:
        points.append(c.geo_radius.center)
    if c.geo_polygon is not None:
        rings = [c.geo_polygon.exterior, *(c.geo_polygon.interiors or [])]
        points += [p for ring in rings for p in ring.points]
    return points


def to_edge(filter: models.Filter) -> qe.Filter:
    """The same filter in qdrant-edge's classes.

    Raises:
        ConfigError: a condition the embedded store cannot express.
    """
    return qe.Filter(
        must=_conditions(filter.must),
        should=_conditions(filter.should),
        must_not=_conditions(filter.must_not),
        min_should=None
        if filter.min_should is None
        else qe.MinShould(_conditions(filter.min_should.conditions) or [], filter.min_should.min_count),
    )


def _conditions(given: Any) -> list[Any] | None:
    if given is None:
        return None
    return [_condition(c) for c in (given if isinstance(given, list) else [given])]


def _condition(c: Any) -> Any:
    if isinstance(c, models.Filter):
        return to_edge(c)
    if isinstance(c, models.FieldCondition):
        return _field(c)
    if isinstance(c, models.IsEmptyCondition):
        return qe.IsEmptyCondition(c.is_empty.key)
    if isinstance(c, models.IsNullCondition):
        return qe.IsNullCondition(c.is_null.key)
    if isinstance(c, models.HasIdCondition):
        return has_id(c.has_id)
    if isinstance(c, models.HasVectorCondition):
        return qe.HasVectorCondition(c.has_vector)
    if isinstance(c, models.NestedCondition):
        return qe.NestedCondition(c.nested.key, to_edge(c.nested.filter))
    raise ConfigError(f"the embedded store cannot filter by {type(c).__name__}")


def _field(c: models.FieldCondition) -> qe.FieldCondition:
    count = c.values_count
    return qe.FieldCondition(
        key=c.key,
        match=None if c.match is None else _match(c.key, c.match),
        range=None if c.range is None else _range(c.range),
        values_count=None
        if count is None
        else qe.ValuesCount(lt=count.lt, gt=count.gt, lte=count.lte, gte=count.gte),
        is_empty=c.is_empty,
        is_null=c.is_null,
        **_geo(c),
    )


def _geo(c: models.FieldCondition) -> dict[str, Any]:
    def point(p: models.GeoPoint) -> qe.GeoPoint:
        return qe.GeoPoint(lon=p.lon, lat=p.lat)

    def ring(line: models.GeoLineString) -> list[qe.GeoPoint]:
        return [point(p) for p in line.points]

    geo: dict[str, Any] = {}
    if (box := c.geo_bounding_box) is not None:
        geo["geo_bounding_box"] = qe.GeoBoundingBox(point(box.top_left), point(box.bottom_right))
    if (circle := c.geo_radius) is not None:
        geo["geo_radius"] = qe.GeoRadius(point(circle.center), circle.radius)
    if (polygon := c.geo_polygon) is not None:
        holes = [ring(r) for r in polygon.interiors] if polygon.interiors else None
        geo["geo_polygon"] = qe.GeoPolygon(ring(polygon.exterior), holes)
    return geo


def bool_refusal(key: str) -> ConfigError:
    """qdrant-edge 0.9's binding reads True / False as the integers 1 / 0: a match on them finds
    no boolean payload, and finds integer ones instead. The embedded store refuses it."""
    return ConfigError(
        f"filter on {key!r}: the embedded store (qdrant-edge) cannot match true/false values; "
        "use a Qdrant server or qdrant-client's local mode, or store the field as 0/1 or text"
    )


def _match(key: str, match: Any) -> Any:
    if isinstance(getattr(match, "value", None), bool):  # MatchAny / MatchExcept take no bools
        raise bool_refusal(key)
    if isinstance(match, models.MatchValue):
        return qe.MatchValue(match.value)
    if isinstance(match, models.MatchAny):
        return qe.MatchAny(list(match.any))
    if isinstance(match, models.MatchExcept):
        return qe.MatchExcept(list(match.except_))
    if isinstance(match, models.MatchText):
        return qe.MatchText(match.text)
    if isinstance(match, models.MatchPhrase):
        return qe.MatchPhrase(match.phrase)
    if isinstance(match, models.MatchTextAny):
        return qe.MatchTextAny(match.text_any)
    raise ConfigError(f"filter on {key!r}: the embedded store cannot match by {type(match).__name__}")


def _range(r: models.Range | models.DatetimeRange) -> Any:
    bounds = {k: getattr(r, k) for k in ("gt", "gte", "lt", "lte")}
    if isinstance(r, models.DatetimeRange):
        return qe.RangeDateTime(**{k: None if v is None else _iso(v) for k, v in bounds.items()})
    return qe.RangeFloat(**{k: None if v is None else float(v) for k, v in bounds.items()})


def _iso(value: datetime | date) -> str:
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if value.tzinfo is None:  # Qdrant reads a date without a zone as UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat()
