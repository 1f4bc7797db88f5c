"""A text pair's judged queries for ``rmq eval``: a JSONL file, one query a line.

Each line is one JSON object with the query's ``"text"`` and what is relevant to it, either::

    {"text": "storm warning for the coast", "label": "weather"}
    {"text": "who won the cup final", "relevant": [812, 5077, "0b3c7a52-..."]}

- ``"label"``: the gallery points whose label field (``rmq init --label-field``) holds the same
  label are relevant, compared as text (the paper's protocol; a payload label 3 is "3");
- ``"relevant"``: the ids of the relevant gallery points (a judged query set, as TREC or BEIR
  ship them: unsigned integers or UUIDs).

``"id"`` (optional) names the gallery point the query is, when the queries are gallery
documents (every document a query, the rest the gallery): that point is left out of its own
ranking, as an image query is. Blank lines are skipped; anything else that is not such an
object stops the read at its line number, before anything is measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.errors import ConfigError, InvalidPointId, TextError
from rm_qdrant.models.text import as_text
from rm_qdrant.store.ids import normalize_id

KEYS = ("text", "label", "relevant", "id")
#: The largest query file read (a judged set of a million queries is well under it).
MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class TextQuery:
    """One judged text query.

    Attributes:
        text: the query; the pair's query prefix is put before it when it is encoded.
        label: relevant are the gallery points with this label (as text), or None.
        relevant: or the ids of the relevant gallery points.
        id: the gallery point the query itself is, left out of its ranking (None: not one).

    Raises:
        ConfigError: not exactly one of ``label`` and ``relevant``, an empty ``relevant``, or an
            id that is no point id.
        TextError: ``text`` is not text (empty, binary, over the size read).
    """

    text: str
    label: str | None = None
    relevant: frozenset[PointId] | None = None
    id: PointId | None = None

    def __post_init__(self) -> None:
        as_text(self.text)
        if (self.label is None) == (self.relevant is None):
            raise ConfigError('a query has one of "label" and "relevant" (the ids of its relevant points)')
        if self.relevant is not None and not self.relevant:
            raise ConfigError('"relevant" lists no id: the query would score 0 whatever is served')


def read_queries(path: str | os.PathLike[str]) -> list[TextQuery]:
    """The queries of a JSONL file (see the module's docstring).

    Raises:
        ConfigError: the file cannot be read, holds no query, or a line is not a query; the
            error names the line.
    """
    where = Path(path)
    try:
        size = where.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"query file {where} is {size:,} bytes, over the {MAX_BYTES:,} read")
        data = where.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read query file {where}: {exc.strerror or exc}") from None
    return parse_queries(data.splitlines(), source=str(where))


def parse_queries(lines: Iterable[bytes | str], *, source: str = "queries") -> list[TextQuery]:
    """The queries of JSONL ``lines``.

    Raises:
        ConfigError: a line that is not a query (named ``SOURCE, line N``), or no query at all.
    """
    queries = []
    for number, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}, line {number}: not UTF-8 (at byte {exc.start + 1})") from None
        if not text.strip():
            continue
        try:
            queries.append(query_of(_json(text)))
        except (ConfigError, TextError) as exc:
            raise ConfigError(f"{source}, line {number}: {exc}") from None
    if not queries:
        raise ConfigError(f'{source} holds no query: one JSON object a line, "text" and "label"/"relevant"')
    return queries


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"not JSON ({exc})") from None
    except RecursionError:
        raise ConfigError("not JSON (nested too deep)") from None


def query_of(value: Any) -> TextQuery:
    """One query from its JSON object (``{"text": ..., "label": ...}`` or ``"relevant": [...]``).

    Raises:
        ConfigError, TextError: as :class:`TextQuery`, or the object is not a query.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f'expected an object with "text" and "label" or "relevant", got {_kind(value)}')
    unknown = sorted(str(key) for key in value if key not in KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(map(repr, unknown))}: a query has {', '.join(KEYS)}")
    if "text" not in value:
        raise ConfigError('no "text"')
    if not isinstance(value["text"], str):
        raise ConfigError(f'"text" is a string, got {_kind(value["text"])}')
    return TextQuery(
        value["text"],
        label=_label(value["label"]) if "label" in value else None,
        relevant=_ids(value["relevant"]) if "relevant" in value else None,
        id=_id(value["id"], '"id"') if "id" in value else None,
    )


def _label(value: Any) -> str:
    """A label as the gallery's are compared: its text (an integer 3 is "3")."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f'"label" is a string or an integer, got {_kind(value)}')
    return str(value)


def _ids(value: Any) -> frozenset[PointId]:
    if not isinstance(value, list):
        raise ConfigError(f'"relevant" is a list of point ids, got {_kind(value)}')
    return frozenset(_id(item, '"relevant"') for item in value)


def _id(value: Any, key: str) -> PointId:
    if isinstance(value, float):  # JSON has one number type: 3.0 is no id
        raise ConfigError(f"{key}: {value!r} is no point id (ids are unsigned integers or UUIDs)")
    try:
        return normalize_id(value)
    except InvalidPointId as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _kind(value: Any) -> str:
    shown = json.dumps(value)
    return f"{type(value).__name__} {shown[:40] + '...' if len(shown) > 40 else shown}"
