"""Where a gallery point's image is, read from its payload (pure: no I/O).

A pair knows it in one of two ways, given to ``rmq init``:

- ``--uri-field FIELD``: the payload field that holds the image's URI or path
  (``uri`` by default, what ``rmq index`` writes); ``asset.url`` names a nested
  field (:mod:`rm_qdrant.core.paths`);
- ``--uri-template TEMPLATE``: a URI built from payload fields, e.g.
  ``s3://bucket/{sku}.jpg``, ``https://cdn.example.com/{category}/{sku}.jpg`` or
  ``https://cdn.example.com/{asset.path}``; ``{id}`` is the point's id when the
  payload has no ``id`` field. Format specs work (``{n:06d}``); a field is a payload
  path (object keys joined by dots), never attribute or index access. A value with a
  ``..`` path segment is refused: it would reach another folder than the template names.

A point whose payload lacks the field (or a template's field) fails with
"payload has no 'asset.url'"; the batch goes on.

A text pair may instead hold each document's text in its payload (``--text-field FIELD``,
nested paths too): the rule is then ``inline`` and gives the field's value wrapped in
:class:`InlineText`, which the source hands back as it is, fetching nothing. With
``--uri-field`` or ``--uri-template`` a text pair's documents are read from files, HTTP or
object storage under the same source rules as images.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.paths import check_path, payload_value
from rm_qdrant.errors import ConfigError, SourceError

_FORMATTER = string.Formatter()


@dataclass(frozen=True)
class InlineText:
    """A document's text as its payload holds it (``--text-field``): nothing to fetch.

    ``value`` is the field's raw value (the text encoder refuses what is not text);
    ``field`` names it in messages, never the text itself."""

    value: Any
    field: str


@dataclass(frozen=True)
class UriRule:
    """How to find a point's image URI in its payload: a field, or a template over fields."""

    field: str = "uri"
    template: str | None = None
    #: The field holds the document's text itself (``--text-field``), not where to fetch it.
    inline: bool = False

    def __post_init__(self) -> None:
        if self.inline:
            if self.template is not None:
                raise ConfigError("give --text-field or --uri-template, not both")
            check_path(self.field, "--text-field")
        elif self.template is not None:
            fields = template_fields(self.template)
            if not fields:
                raise ConfigError(f"--uri-template {self.template!r} uses no payload field, e.g. {{sku}}")
        else:
            check_path(self.field, "--uri-field")

    def same_image(self, point_id: PointId, before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
        """Whether two payloads of one point name the same image (a URI that cannot be built
        from one of them is not the same)."""
        if self.template is None:
            return bool(payload_value(before, self.field) == payload_value(after, self.field))
        try:
            return bool(self.uri(point_id, before) == self.uri(point_id, after))
        except SourceError:
            return False

    def uri(self, point_id: PointId, payload: Mapping[str, Any]) -> Any:
        """The point's image URI (the raw field value; the source checks it).

        Raises:
            SourceError: the field, or a template field, is missing (or empty, for a
                template) in this payload.
        """
        if self.template is None:
            value = payload_value(payload, self.field)
            if value is None:
                raise SourceError(f"payload has no {self.field!r}")
            return InlineText(value, self.field) if self.inline else value
        parts = []
        for literal, name, spec, _ in _FORMATTER.parse(self.template):
            parts.append(literal)
            if name is None:
                continue
            value = point_id if name == "id" and "id" not in payload else payload_value(payload, name)
            if value is None or value == "":
                raise SourceError(f"payload has no {name!r} for the uri template {self.template!r}")
            if isinstance(value, (list, dict, tuple, bool)):
                kind = type(value).__name__
                raise SourceError(
                    f"payload {name!r} is a {kind}, not a value for the uri template {self.template!r}"
                )
            try:
                text = format(value, spec or "")
            except (ValueError, TypeError) as exc:
                raise SourceError(f"payload {name!r} = {value!r} does not fit {{{name}:{spec}}}") from exc
            if climbs(text):
                raise SourceError(
                    f"payload {name!r} = {_short(text)} climbs out of the uri template {self.template!r} "
                    "with '..'; refused"
                )
            parts.append(text)
        return "".join(parts)

    def find(self, point_id: PointId, payload: Mapping[str, Any]) -> Any:
        """:meth:`uri`, or None where the payload lacks what the rule reads."""
        try:
            return self.uri(point_id, payload)
        except SourceError:
            return None

    def describe(self) -> str:
        return f"template {self.template}" if self.template else f"payload field {self.field!r}"


def climbs(value: str) -> bool:
    """Whether a value put into a template has a ``..`` path segment (also percent-encoded).

    A payload field fills one place in a URI; ``..`` would move the URI to another
    folder than the template names (``g1500/{sku}`` with ``sku = "../other/x.jpg"``).

    >>> climbs("../data/x.jpg"), climbs("a/%2E%2E/x.jpg"), climbs("x..y.jpg")
    (True, True, False)
    """
    text = unquote(value).replace("\\", "/")
    return ".." in text.split("/")


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 120 else shown[:117] + "..."


def template_fields(template: str) -> list[str]:
    """The payload fields a template reads, checked.

    >>> template_fields("s3://bucket/{category}/{sku}.jpg")
    ['category', 'sku']

    Raises:
        ConfigError: the template is malformed, or uses index access, conversions or a
            field that is not a payload path (:func:`~rm_qdrant.core.paths.check_path`).
    """
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ConfigError(f"bad --uri-template {template!r}: {exc}") from exc
    fields = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or any(c in name for c in "[]") or conversion or "{" in (spec or ""):
            raise ConfigError(
                f"bad --uri-template {template!r}: fields are payload names like {{sku}} or {{asset.sku}} "
                "(no indexes or conversions)"
            )
        try:
            fields.append(check_path(name, "field"))
        except ConfigError as exc:
            raise ConfigError(f"bad --uri-template {template!r}: {exc}") from exc
    return fields
