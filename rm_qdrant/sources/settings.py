"""Source settings as plain data (what a pair record keeps), and HTTP request headers.

A header is ``Name: value``. Its value is a secret as far as output goes: it is shown
as ``***``. Where it holds ``$NAME`` or ``${NAME}`` (``Bearer $CDN_TOKEN``), each names an
environment variable read when images are fetched, so the secret itself is never stored;
output shows the variables and masks the rest. ``$$`` is a literal ``$``. Pure: no network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rm_qdrant.errors import ConfigError

__all__ = ["Header", "from_settings", "header_values", "parse_header", "shown_header", "shown_settings"]

Header = tuple[str, str]
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_REFERENCE = re.compile(rf"\$\$|{_VARIABLE.pattern}")  # $$ is a literal $
#: The settings a pair may record, by the name of the SourceConfig field, and their option.
OPTIONS = {
    "root": "--root",
    "schemes": "--allow-scheme",
    "timeout": "--timeout",
    "max_pixels": "--max-pixels",
    "allow_private": "--allow-private-network",
    "headers": "--http-header",
}


def parse_header(text: str) -> Header:
    """``"Name: value"`` as ``(name, value)``; the value is never echoed in an error.

    >>> parse_header("Authorization: $CDN_TOKEN")
    ('Authorization', '$CDN_TOKEN')
    """
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _TOKEN.fullmatch(name) or not value:
        raise ConfigError("--http-header takes 'Name: value' (a header name, a colon, then its value)")
    _check_value(name, value)
    return name, value


def _check_value(name: str, value: str) -> None:
    if not value.isascii() or any(c in value for c in "\r\n\0"):
        raise ConfigError(f"--http-header {name}: the value holds a line break, NUL or non-ASCII; refused")


def shown_header(header: Header) -> str:
    """How a header appears in output: its variables as written, every other word ``***``.

    >>> shown_header(("Authorization", "Bearer ${CDN_TOKEN}"))
    'Authorization: *** ${CDN_TOKEN}'
    """
    name, value = header
    words = [w if _VARIABLE.fullmatch(w) else "***" for w in value.split()]
    return f"{name}: {' '.join(words) if any(w != '***' for w in words) else '***'}"


def header_values(headers: tuple[Header, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers to send, each ``$NAME`` or ``${NAME}`` in a value read from the environment now.

    Raises:
        ConfigError: a variable is not set in the environment (or holds a line break).
    """
    environ = os.environ if environ is None else environ

    def variable(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        key = match.group(1) or match.group(2)
        if key not in environ:
            raise ConfigError(f"--http-header {name}: ${key} is not set in the environment")
        return environ[key]

    sent = {}
    for name, value in headers:
        if "$" in value:
            value = _REFERENCE.sub(variable, value)
            _check_value(name, value)
        sent[name] = value
    return sent


def from_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """SourceConfig keyword arguments from recorded settings (plain data: lists, strings)."""
    known = {k: v for k, v in settings.items() if k in OPTIONS}
    if "root" in known:
        known["root"] = Path(known["root"])
    if "schemes" in known:
        known["schemes"] = tuple(known["schemes"])
    if "headers" in known:
        known["headers"] = tuple((str(n), str(v)) for n, v in known["headers"])
    return known


def shown_value(key: str, value: Any) -> str:
    """One setting's value as output shows it (headers redacted)."""
    if key == "headers":
        return ", ".join(shown_header(h) for h in value) or "-"
    if key == "schemes":
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def shown_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded settings as plain data safe to print: header values redacted."""
    out = dict(settings)
    if "headers" in out:
        out["headers"] = [shown_header((str(n), str(v))) for n, v in out["headers"]]
    return out
