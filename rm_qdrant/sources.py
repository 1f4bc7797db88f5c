"""Fetching a gallery point's source image from its URI: local files and HTTP(S).

The only module that reads images over the network. Every failure becomes a
:class:`~rm_qdrant.errors.SourceError` whose message says what went wrong, so a
migration can record it against the point and go on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

from rm_qdrant.errors import SourceError

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class SourceConfig:
    """How images are fetched.

    Attributes:
        root: Folder that relative paths are resolved against (None: as given).
        schemes: URI schemes allowed; a plain path counts as ``file``.
        timeout: Seconds for connecting and for each read over HTTP.
        retries: Extra attempts after a timeout, a refused connection or a 5xx/429.
        backoff: Seconds before the first retry; doubles each time.
        max_bytes: Largest image accepted, local or remote.
    """

    root: Path | None = None
    schemes: tuple[str, ...] = ("file", "http", "https")
    timeout: float = 10.0
    retries: int = 2
    backoff: float = 0.5
    max_bytes: int = 20 * 1024 * 1024


class ImageSource:
    """Reads image bytes for URIs under one :class:`SourceConfig`; thread-safe.

    Example:
        >>> with ImageSource(SourceConfig(root=Path("photos"))) as source:  # doctest: +SKIP
        ...     data = source.fetch("cats/001.jpg")
    """

    def __init__(self, config: SourceConfig | None = None) -> None:
        self.config = config or SourceConfig()
        self._http: httpx.Client | None = None

    def fetch(self, uri: str) -> bytes:
        """The bytes at ``uri``.

        Raises:
            SourceError: the scheme is not allowed, the file or URL cannot be read,
                or the image is larger than ``max_bytes``.
        """
        if not isinstance(uri, str) or not uri:
            raise SourceError(f"no image URI (got {uri!r})")
        scheme = urlparse(uri).scheme.lower()
        if len(scheme) <= 1:  # a plain path (or a Windows drive letter)
            scheme, path = "file", uri
        elif scheme == "file":
            path = unquote(urlparse(uri).path)
        else:
            path = ""
        if scheme not in self.config.schemes:
            allowed = ", ".join(self.config.schemes)
            raise SourceError(f"{uri}: scheme {scheme!r} is not allowed (allowed: {allowed})")
        if scheme == "file":
            return self._read_file(path)
        return self._read_http(uri)

    def _read_file(self, path: str) -> bytes:
        target = Path(path)
        if not target.is_absolute() and self.config.root is not None:
            target = self.config.root / target
        try:
            size = target.stat().st_size
            if size > self.config.max_bytes:
                raise SourceError(f"{target}: {size} bytes is over the {self.config.max_bytes}-byte limit")
            return target.read_bytes()
        except OSError as exc:
            raise SourceError(f"{target}: {exc.strerror or exc}") from exc

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(timeout=self.config.timeout, follow_redirects=True)
        return self._http

    def _read_http(self, uri: str) -> bytes:
        delay = self.config.backoff
        for attempt in range(self.config.retries + 1):
            last = attempt == self.config.retries
            try:
                return self._get(uri)
            except _Retryable as exc:
                if last:
                    raise SourceError(f"{uri}: {exc} (after {attempt + 1} attempts)") from exc
                log.info("retrying %s in %.1fs: %s", uri, delay, exc)
            time.sleep(delay)
            delay *= 2
        raise SourceError(f"{uri}: retries must be >= 0")

    def _get(self, uri: str) -> bytes:
        try:
            with self._client().stream("GET", uri) as response:
                if response.status_code in _RETRY_STATUS:
                    raise _Retryable(f"HTTP {response.status_code}")
                if response.status_code != 200:
                    raise SourceError(f"{uri}: HTTP {response.status_code}")
                declared = int(response.headers.get("content-length") or 0)
                if declared > self.config.max_bytes:
                    raise SourceError(
                        f"{uri}: {declared} bytes is over the {self.config.max_bytes}-byte limit"
                    )
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.config.max_bytes:
                        raise SourceError(f"{uri}: over the {self.config.max_bytes}-byte limit")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out after {self.config.timeout}s") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"connection failed: {exc}") from exc

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> ImageSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Retryable(Exception):
    """A failure worth another attempt (timeouts, refused connections, 5xx, 429)."""
