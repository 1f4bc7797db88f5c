"""Payload paths: a field named anywhere rm-qdrant reads a payload (pure: no I/O).

A path is what ``--uri-field``, ``--label-field``, a ``--uri-template`` field and a
``payload:FIELD`` order name. It follows Qdrant's key syntax for nested payload: a
dot goes into an object, so ``asset.url`` is ``payload["asset"]["url"]``, the key a
Qdrant filter on that field uses too.

- A top-level key that itself contains a dot is found first: ``asset.url`` reads
  ``payload["asset.url"]`` when the payload has that key, else the nested path.
  (A dotted key below the top level cannot be named.)
- A path is dictionary lookups only: no attribute access, no list indexes (Qdrant's
  ``a[0]``/``a[]`` are refused), at most :data:`MAX_DEPTH` keys.
- A missing key, a value that is not an object on the way, and a null value are
  all "the payload has no such field".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rm_qdrant.errors import ConfigError

#: Most keys one path may have: deeper payloads are not what a field names.
MAX_DEPTH = 16


def check_path(path: str, option: str) -> str:
    """Return ``path`` if it names a payload field, else raise ConfigError naming ``option``.

    >>> check_path("asset.url", "--uri-field")
    'asset.url'

    Raises:
        ConfigError: the path is empty, has an empty key (``a..b``, ``.a``), a list
            index (``a[0]``), or more than :data:`MAX_DEPTH` keys.
    """
    keys = path.split(".")
    if not path or "" in keys:
        raise ConfigError(
            f"{option} {path!r} is not a payload field: name it like 'url', or 'asset.url' for a nested one"
        )
    if "[" in path or "]" in path:
        raise ConfigError(
            f"{option} {path!r}: list indexes are not read; a payload field is object keys "
            "joined by dots, like 'asset.url'"
        )
    if len(keys) > MAX_DEPTH:
        raise ConfigError(f"{option} {path!r} is {len(keys)} keys deep; at most {MAX_DEPTH} are read")
    return path


def payload_value(payload: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` in ``payload``, or None where it has none.

    >>> payload_value({"asset": {"url": "s3://b/1.jpg"}}, "asset.url")
    's3://b/1.jpg'
    >>> payload_value({"asset.url": "top", "asset": {"url": "nested"}}, "asset.url")
    'top'
    >>> payload_value({"asset": "s3://b/1.jpg"}, "asset.url") is None
    True
    """
    if path in payload:
        return payload[path]
    keys = path.split(".")
    if len(keys) < 2 or len(keys) > MAX_DEPTH:
        return None
    value: Any = payload
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def integer_text(text: str) -> int | None:
    """The integer ``text`` spells as Qdrant stores one (64-bit, no leading zeros: "007" is a
    string), or None."""
    if not re.fullmatch(r"-?(0|[1-9][0-9]{0,18})", text):  # bounded: int() of 5,000 digits raises
        return None
    value = int(text)
    return value if fits_int64(value) else None


def fits_int64(value: int) -> bool:
    """Whether ``value`` is one of the integers a Qdrant payload holds (64-bit, signed)."""
    return -(2**63) <= value < 2**63
