"""Fetching a gallery point's source image from its URI: local files, HTTP(S), S3 and GCS.

The only package that reads images from where a gallery keeps them. Every failure
becomes a :class:`~rm_qdrant.errors.SourceError` whose message says what went
wrong, with credentials redacted, so a migration can record it against the point
and go on. No fetch can hang: files are opened without blocking and read with a
bound, and a fetch over the network has one deadline for the whole transfer.
``s3://`` and ``gs://`` need the ``s3`` extra (boto3); see :mod:`rm_qdrant.sources.s3`
for where their credentials and endpoints come from.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from rm_qdrant.core.redact import redact
from rm_qdrant.core.uris import InlineText
from rm_qdrant.errors import ConfigError, SourceError
from rm_qdrant.sources.files import confine, read_file
from rm_qdrant.sources.http import HttpFetcher
from rm_qdrant.sources.s3 import S3Fetcher
from rm_qdrant.sources.settings import Header, header_values, parse_header

__all__ = ["ImageSource", "SourceConfig", "shown", "source_kind"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_SHOWN_LENGTH = 300


@dataclass(frozen=True)
class SourceConfig:
    """How images are fetched.

    Attributes:
        root: Folder that local image paths are confined to (None: any path, as given).
            A relative path is taken under it; every local path (relative, absolute or
            ``file://``) must resolve, symbolic links and ``..`` included, to a file
            under it, else the fetch is refused.
        schemes: URI schemes allowed; a plain path counts as ``file``.
        timeout: Seconds one network fetch may take in all (connect, redirects, body).
        retries: Extra attempts after a timeout, a refused connection, a 5xx/429 or
            (S3, GCS) throttling.
        backoff: Seconds before the first retry; doubles each time.
        max_bytes: Largest image file accepted, local or remote.
        max_pixels: Largest image accepted once its header is read (width × height);
            bounds the memory a decode takes, which ``max_bytes`` does not.
        allow_private: Let HTTP(S) fetches reach loopback, private, link-local and
            metadata addresses (refused by default). ``s3://`` and ``gs://`` go to the
            configured endpoint whatever the URI, so the guard does not apply to them.
        max_redirects: Redirects followed per fetch.
        headers: HTTP(S) request headers, ``(name, value)``; a value written ``$NAME`` is
            read from the environment when the source opens. Never shown: output prints
            ``***`` (or the ``$NAME``) in place of a value.
    """

    root: Path | None = None
    schemes: tuple[str, ...] = ("file", "http", "https", "s3", "gs")
    timeout: float = 10.0
    retries: int = 2
    backoff: float = 0.5
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    allow_private: bool = False
    max_redirects: int = 5
    headers: tuple[Header, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        for name, value in self.headers:
            parse_header(f"{name}: {value}")
        for name in ("timeout", "backoff"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0) or (name == "timeout" and value == 0):
                raise ConfigError(f"--{name} must be a positive number of seconds, got {value}")
        for name in ("retries", "max_bytes", "max_pixels", "max_redirects"):
            if getattr(self, name) < (0 if name in ("retries", "max_redirects") else 1):
                raise ConfigError(f"{name} out of range: {getattr(self, name)}")


def _resolved(root: Path) -> Path:
    try:
        resolved = root.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a link loop; a NUL byte
        raise ConfigError(f"--root {shown(root)} cannot be resolved: {exc}") from exc
    if not resolved.is_dir():  # a typo would otherwise fail every point, one by one
        raise ConfigError(f"--root {shown(root)} is not a folder")
    return resolved


def scheme_of(uri: str) -> tuple[str, bool]:
    """A URI's scheme, lower-cased (``file`` for a plain path), and whether it was written out."""
    if uri[0] == "/":  # an absolute path, the usual local case: no pattern to match
        return "file", False
    match = _SCHEME.match(uri)
    explicit = match is not None and len(match.group(1)) > 1  # not a Windows drive letter
    return (match.group(1).lower() if match is not None and explicit else "file"), explicit


def source_kind(uri: object) -> str | None:
    """Where a URI's image comes from, as settings refuse or allow it: its scheme and host
    (``http://cdn.example.com``, ``s3://bucket``; never a user name or password), ``file`` for
    a local path, None for no URI. A refused private network, a missing header or a wrong
    endpoint fails every image of one kind and none of another."""
    if isinstance(uri, InlineText):
        return "payload"
    if not isinstance(uri, str) or not uri:
        return None
    scheme, _ = scheme_of(uri)
    if scheme == "file":
        return "file"
    try:
        host = urlsplit(uri).hostname or ""
    except ValueError:  # a malformed URI: its fetch says why
        host = ""
    return f"{scheme}://{host}"


def shown(uri: object) -> str:
    """How a URI appears in messages, logs and payloads: credentials redacted, length bounded
    (a text held in the payload appears as its field, never as the text)."""
    if isinstance(uri, InlineText):
        return f"payload field {uri.field!r}"
    text = redact(str(uri))
    return text if len(text) <= _SHOWN_LENGTH else text[:_SHOWN_LENGTH] + "..."


class ImageSource:
    """Reads image bytes for URIs under one :class:`SourceConfig`; thread-safe.

    Args:
        config: how to fetch.
        stop: once set, no fetch starts another attempt (a run is stopping).

    Example:
        >>> with ImageSource(SourceConfig(root=Path("photos"))) as source:  # doctest: +SKIP
        ...     data = source.fetch("cats/001.jpg")
    """

    def __init__(self, config: SourceConfig | None = None, *, stop: threading.Event | None = None) -> None:
        self.config = config or SourceConfig()
        self._stop = stop
        self._root = None if self.config.root is None else _resolved(Path(self.config.root))
        self._headers = header_values(self.config.headers)
        self._http: HttpFetcher | None = None
        self._objects: S3Fetcher | None = None
        self._lock = threading.Lock()
        self._retries = 0

    @property
    def retries(self) -> int:
        """Network fetches retried so far (each retry of a timeout, a refused connection, a 5xx
        or throttling counts once; see :mod:`rm_qdrant.sources.retry`)."""
        return self._retries

    def _retried(self) -> None:
        with self._lock:
            self._retries += 1

    def fetch(self, uri: object) -> Any:
        """The bytes at ``uri`` (a text held in the payload, :class:`InlineText`: its value, as it is).

        Raises:
            SourceError: the URI is malformed or its scheme not allowed, a local path
                resolves outside ``root``, the file, URL or object cannot be read, or the
                image is larger than ``max_bytes``.
        """
        if isinstance(uri, InlineText):
            return uri.value
        if not isinstance(uri, str) or not uri:
            raise SourceError(f"no image URI (got {shown(repr(uri))})")
        scheme, explicit = scheme_of(uri)
        if scheme not in self.config.schemes:
            allowed = ", ".join(self.config.schemes)
            raise SourceError(f"{shown(uri)}: scheme {scheme!r} is not allowed (allowed: {allowed})")
        if self._stop is not None and self._stop.is_set():
            raise SourceError(f"{shown(uri)}: not fetched, the run is stopping")
        if scheme == "file":  # the name is made only for an error: most files are read
            target = self._path(uri, explicit, lambda: shown(uri))
            confined = self._root is not None
            return read_file(
                target, max_bytes=self.config.max_bytes, shown=lambda: shown(uri), follow=not confined
            )
        name = shown(uri)
        if scheme in ("http", "https"):
            return self._fetcher().get(uri, shown=name, stop=self._stop, on_retry=self._retried)
        if scheme in ("s3", "gs"):
            return self._object_fetcher().get(uri, shown=name, stop=self._stop, on_retry=self._retried)
        raise SourceError(f"{name}: rm-qdrant cannot fetch {scheme!r} URIs")

    def _path(self, uri: str, has_scheme: bool, name: Callable[[], str]) -> str | Path:
        if has_scheme:  # file://host/path
            try:
                uri = unquote(urlsplit(uri).path)
            except ValueError as exc:
                raise SourceError(f"{name()}: malformed URI: {exc}") from exc
        if self._root is not None:
            return confine(Path(uri), self._root, shown=name)
        return Path(uri) if uri.endswith("/") else uri  # a Path drops a trailing slash; os.open would not

    def is_local(self, uri: object) -> bool:
        """Whether ``uri`` names a local file (a path or ``file://``): read from a disk, not a network."""
        if isinstance(uri, InlineText):
            return True  # in the payload already
        return isinstance(uri, str) and bool(uri) and scheme_of(uri)[0] == "file"

    def _fetcher(self) -> HttpFetcher:
        with self._lock:
            if self._http is None:
                c = self.config
                self._http = HttpFetcher(
                    timeout=c.timeout,
                    retries=c.retries,
                    backoff=c.backoff,
                    max_bytes=c.max_bytes,
                    max_redirects=c.max_redirects,
                    allow_private=c.allow_private,
                    schemes=tuple(s for s in c.schemes if s in ("http", "https")),
                    headers=self._headers,
                )
            return self._http

    def _object_fetcher(self) -> S3Fetcher:
        with self._lock:
            if self._objects is None:
                c = self.config
                self._objects = S3Fetcher(
                    timeout=c.timeout, retries=c.retries, backoff=c.backoff, max_bytes=c.max_bytes
                )
            return self._objects

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._objects is not None:
            self._objects.close()

    def __enter__(self) -> ImageSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
