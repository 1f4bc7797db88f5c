"""Bounds on what a team's code hands the library, checked before anything is read or written.

Payloads, filters, ids and result sizes come from other systems. Each is checked here, the
same for both stores and at every entry point (``DualIndex``, ``AsyncDualIndex``, ``rmq``, and
the store writes a migration makes), and refused in one line, with nothing written:

- a payload is a mapping of string keys to JSON values (strings, finite numbers, integers from
  -2**63 to 2**64 - 1 as Qdrant keeps them, true/false, null, lists, objects); from an
  application it nests at most :data:`MAX_PAYLOAD_DEPTH` levels and its compact JSON text is at
  most :data:`MAX_PAYLOAD_BYTES`; a store writes none deeper than :data:`STORE_MAX_DEPTH` (a
  migration copies a team's stored payloads as they are); numpy scalars are numbers (written as
  Python's; a longdouble as the float it rounds to, refused beyond float64's range), tuples are
  lists, complex numbers are refused;
- a filter nests at most :data:`MAX_FILTER_DEPTH` levels, its strings are UTF-8 and its counts
  (``values_count``, ``min_count``) unsigned 64-bit (see qfilter.check_filter);
- a point id is an integer in [0, 2**64) or a UUID (store/ids.py);
- ``limit + offset`` of a search is at most :data:`MAX_HITS`.

Why these numbers: qdrant-edge 0.9 writes a ``set_payload`` nested 128 levels deep to its
write-ahead log and then cannot read the log back (serde_json's recursion limit, 128): every
later write fails, and the collection no longer opens (docs/upstream/qdrant_edge_deep_payload.py).
A Qdrant server parses a REST request with the same limit, the request's own levels included,
and its gRPC decoder (prost) stops at 100 nested messages, a payload level taking more than one
(from their sources; no server was run here). 64 payload levels and 32 filter levels are well
inside all of them; 16 MiB is half a server's default request limit (32 MiB), so a point and
its vectors fit one request.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from rm_qdrant.errors import ConfigError, InvalidFilter, InvalidPayload

#: Levels of objects and lists a payload from an application may nest (the payload is level 1).
MAX_PAYLOAD_DEPTH = 64
#: The largest payload from an application, as compact UTF-8 JSON text.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
#: Levels a store writes at most, whoever asks (a migration copies a team's payloads as they
#: are: one a server took, deeper than 64, still moves). qdrant-edge's log breaks at 128.
STORE_MAX_DEPTH = 100
#: Levels of filters a filter may nest (``must=[Filter(...)]``, a nested condition's filter).
MAX_FILTER_DEPTH = 32
#: The most hits one search may rank: ``limit + offset``.
MAX_HITS = 2**31 - 1
#: The integers a filter matches: 64-bit signed (Qdrant's integer index and match).
INT64 = (-(2**63), 2**63 - 1)
#: The largest count a filter takes (``values_count``, ``min_count``: a server's usize).
UINT64_MAX = 2**64 - 1
#: The integers a payload holds: Qdrant keeps a JSON integer as a signed or unsigned 64-bit one.
PAYLOAD_INTS = (-(2**63), 2**64 - 1)

#: A payload path as Qdrant reads one (the grammar of search_options._steps): keys joined by dots,
#: each quoted or of letters, digits, ``_`` and ``-``, then any ``[]`` or ``[N]``.
_STEP = r'(?:"[^"]*"|[\w-]+)(?:\[\d*\])*'
_KEY_PATH = re.compile(rf"{_STEP}(?:\.{_STEP})*")

_HINTS = {
    "datetime": "give an ISO 8601 string (value.isoformat())",
    "date": "give an ISO 8601 string (value.isoformat())",
    "set": "give a list",
    "frozenset": "give a list",
    "bytes": "give a string (decoded, or base64)",
    "Decimal": "give a float or a string",
    "ndarray": "give a list (array.tolist())",
}


class _Bad(Exception):
    """A refusal on its way up to :func:`check_payload`, which names where it was found."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what, self.path = what, ""

    def at(self, step: str) -> _Bad:
        self.path = step + self.path
        return self


def check_payload(
    payload: Any,
    *,
    what: str = "payload",
    depth: int = MAX_PAYLOAD_DEPTH,
    size: int | None = MAX_PAYLOAD_BYTES,
) -> dict[str, Any]:
    """``payload`` as both stores hold it, or :class:`InvalidPayload` in one line: at most
    ``depth`` levels and ``size`` bytes of JSON (None: any size).

    Returns the payload itself where nothing needs converting (the usual case), else a copy
    with numpy scalars as Python numbers and tuples as lists.

    Example:
        >>> check_payload({"n": np.int64(3), "tags": ("a", "b")})
        {'n': 3, 'tags': ['a', 'b']}
    """
    if not isinstance(payload, Mapping):
        raise InvalidPayload(f"a {what} is a mapping of field names to values, not {type(payload).__name__}")
    total = [0]
    try:
        checked = _value(payload, 1, total, depth)
    except _Bad as bad:
        path = bad.path.lstrip(".")
        where = f" at {path if len(path) <= 60 else path[:40] + '...' + path[-16:]}" if path else ""
        raise InvalidPayload(f"{what}{where}: {bad.what}") from None
    # total[0] bounds the JSON text from above: only a payload that might be too large is encoded
    if size is not None and total[0] > size:
        text = json.dumps(checked, ensure_ascii=False, separators=(",", ":")).encode()
        if len(text) > size:
            raise InvalidPayload(f"{what}: {len(text):,} bytes of JSON, over the {size:,} a payload may hold")
    return checked


def check_payloads(payloads: Any, *, store: bool = False) -> list[Any]:
    """:func:`check_payload` of each payload of a write (None stays None: keep the point's);
    ``store``: a store's own bounds (:data:`STORE_MAX_DEPTH`, any size), not an application's."""
    check = check_stored if store else check_payload
    return [None if p is None else check(p) for p in payloads]


def check_stored(payload: Any) -> dict[str, Any]:
    """:func:`check_payload` with a store's own bounds (see :func:`check_payloads`)."""
    return check_payload(payload, depth=STORE_MAX_DEPTH, size=None)


def _value(value: Any, depth: int, size: list[int], limit: int) -> Any:
    kind = type(value)
    if kind is str:
        size[0] += 6 * len(value) + 3  # a character is at most 6 bytes of JSON ("\u001f")
        if not value.isascii():
            _utf8(value)
        return value
    if value is None or kind is bool:
        size[0] += 6
        return value
    if kind is int or kind is float:
        size[0] += 26
        return _number(value)
    if isinstance(value, Mapping | list | tuple):
        if depth > limit:
            raise _Bad(f"nested deeper than the {limit} levels a payload may have")
        size[0] += 2
        walk = _object if isinstance(value, Mapping) else _list
        return walk(value, depth, size, limit)
    return _other(value, size)


def _object(value: Mapping[Any, Any], depth: int, size: list[int], limit: int) -> Any:
    """The object checked; a copy only where something in it is converted (or it is not a dict)."""
    out: dict[str, Any] | None = None if type(value) is dict else {}
    for n, (key, item) in enumerate(value.items()):
        name = key if type(key) is str else _key(key)
        if not name.isascii():
            try:
                _utf8(name)
            except _Bad as bad:
                raise bad.at(".?") from None
        kind = type(item)
        if kind is str and item.isascii():  # the usual field: no call for it
            size[0] += 6 * (len(name) + len(item)) + 7
            checked = item
        else:
            size[0] += 6 * len(name) + 4
            try:
                checked = _value(item, depth + 1, size, limit)
            except _Bad as bad:
                raise bad.at(f".{name:.40}") from None
        if out is None and (checked is not item or name is not key):
            out = dict(itertools.islice(value.items(), n))  # what came before is unchanged
        if out is not None:
            out[name] = checked
    return value if out is None else out


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise _Bad(f"a field name is a string, not {type(key).__name__} ({key!r:.40})")
    return str.__str__(key)  # a str subclass (an enum): its text


def _list(value: list[Any] | tuple[Any, ...], depth: int, size: list[int], limit: int) -> Any:
    out: list[Any] | None = None if type(value) is list else []
    for i, item in enumerate(value):
        try:
            checked = _value(item, depth + 1, size, limit)
        except _Bad as bad:
            raise bad.at(f"[{i}]") from None
        if out is None and checked is not item:
            out = list(value[:i])
        if out is not None:
            out.append(checked)
        size[0] += 1
    return value if out is None else out


def _number(value: int | float) -> int | float:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Bad(f"{value} is not a number JSON holds (give a finite number, or null)")
        return value
    if not PAYLOAD_INTS[0] <= value <= PAYLOAD_INTS[1]:
        raise _Bad(f"{value} is outside the 64-bit integers a payload holds (-2**63 to 2**64 - 1)")
    return value


def _other(value: Any, size: list[int]) -> Any:
    """A value of another type: a numpy scalar or an int/float/str subclass (an enum) as the
    plain number or string, anything else refused."""
    if isinstance(value, np.complexfloating):
        raise _Bad(f"a complex number ({value!r:.40}) is not a JSON value: give its real and imaginary parts")
    if isinstance(value, np.floating) and not isinstance(value, np.float64 | np.float32 | np.float16):
        return _value(_long_float(value), 1, size, 1)  # its .item() is itself: it would recurse
    if isinstance(value, np.generic) and isinstance(value, np.number | np.bool_):
        return _value(value.item(), 1, size, 1)
    if isinstance(value, bool):
        return bool(value)
    for plain in (int, float, str):  # str(an enum) is its name: str.__str__ gives the text
        if isinstance(value, plain):
            return _value(str.__str__(value) if plain is str else plain(value), 1, size, 1)
    name = type(value).__name__
    hint = _HINTS.get(name, "give a string, a number, true/false, null, a list or an object")
    raise _Bad(f"a {name} is not a JSON value: {hint}")


def _long_float(value: np.floating) -> float:
    """An ``np.longdouble`` as the float JSON holds, refused where it does not fit one (beyond
    float64's range, or a value float64 holds only as 0)."""
    number = float(value)
    if np.isfinite(value) and (not math.isfinite(number) or (number == 0 and value != 0)):
        raise _Bad(
            f"a {type(value).__name__} beyond the 64-bit floats a payload holds (give a float or a string)"
        )
    return number


def _utf8(text: str) -> None:
    if not is_utf8(text):
        raise _Bad(f"{text!r:.60} is not UTF-8 text (it holds a lone surrogate)")


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogate: the shell's undecodable bytes)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_hits(limit: Any, offset: Any) -> None:
    """Refuse a search whose ``limit + offset`` is over :data:`MAX_HITS` (the stores' own integers
    are 64-bit: a larger one was an OverflowError from the embedded store's binding)."""
    if isinstance(limit, int) and isinstance(offset, int) and limit + offset > MAX_HITS:
        raise ConfigError(f"limit + offset is {limit + offset}, over the {MAX_HITS} hits one search may rank")


def check_json_depth(value: Any, limit: int, refusal: str) -> None:
    """Refuse parsed JSON (dicts and lists) nested more than ``limit`` levels, with ``refusal``
    as the one line; checked without recursion, before a parser that recurses sees it."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, Mapping) else node)
            if isinstance(child, Mapping | list)
        ]
        if not level:
            return
    raise InvalidFilter(refusal)


def check_key_path(key: Any) -> str:
    """``key`` if it is a payload path a filter may name, else :class:`InvalidFilter` (the
    embedded store and local mode refused ``""`` or ``a..b`` with different errors)."""
    if isinstance(key, str) and not is_utf8(key):
        raise InvalidFilter(f"filter on {key!r:.60}: not UTF-8 text (it holds a lone surrogate)")
    if not isinstance(key, str) or _KEY_PATH.fullmatch(key) is None:
        raise InvalidFilter(
            f"filter on {key!r:.60}: not a payload path (keys joined by dots, like 'meta.dept'; quote others)"
        )
    return key
