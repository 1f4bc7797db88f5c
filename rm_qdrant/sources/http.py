"""Fetching a gallery image over HTTP(S): one deadline per fetch, the SSRF guard, bounded bodies.

The guard and the deadline sit below httpx, in the network backend its connection
pool uses: every connection (redirects included) goes to an address checked by
:mod:`rm_qdrant.sources.network_guard`, and every socket read or write waits at most until
the fetch's deadline, so a server that trickles its headers or its body one byte at
a time is cut off at ``timeout`` seconds, not after minutes.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpcore
import httpx

from rm_qdrant.core.redact import redact
from rm_qdrant.errors import AddressRefused, SourceError, Unresolvable
from rm_qdrant.sources.network_guard import resolve_public
from rm_qdrant.sources.retry import Retryable, with_retries

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def _decoder(encoding: str, shown: str) -> Any:
    """A zlib decoder for the body's Content-Encoding (None: as sent); one layer only."""
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return zlib.decompressobj()
    raise SourceError(f"{shown}: unsupported Content-Encoding {encoding!r} (one layer of gzip or deflate)")


def _inflate(decoder: Any, data: bytes, room: int, shown: str) -> bytes:
    try:
        return bytes(decoder.decompress(data, max(room, 1)))
    except zlib.error as exc:
        raise SourceError(f"{shown}: the body is not valid gzip/deflate data: {exc}") from exc


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every wait ends at the current fetch's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, remaining: Callable[[], float]) -> None:
        self._inner, self._remaining = inner, remaining

    def _wait(self, timeout: float | None) -> float:
        left = self._remaining()
        if left <= 0:
            raise httpcore.ReadTimeout("the fetch deadline has passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._wait(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._wait(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None):  # type: ignore[no-untyped-def]
        tls = self._inner.start_tls(ssl_context, server_hostname, self._wait(timeout))
        return _DeadlineStream(tls, self._remaining)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _GuardedBackend(httpcore.SyncBackend):
    """Connects only to addresses the guard allows (unless told otherwise), under the deadline."""

    def __init__(self, remaining: Callable[[], float], *, allow_private: bool) -> None:
        self._remaining, self._allow_private = remaining, allow_private

    def connect_tcp(  # type: ignore[override]
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        address = host if self._allow_private else resolve_public(host, port)
        left = self._remaining()
        wait = left if timeout is None else min(timeout, left)
        stream = super().connect_tcp(address, port, max(wait, 1e-3), local_address, socket_options)
        return _DeadlineStream(stream, self._remaining)


class HttpFetcher:
    """GETs image bytes; thread-safe (one deadline per calling thread).

    Args:
        timeout: seconds one attempt may take in all (connect, redirects, headers, body).
        retries: extra attempts after a timeout, a failed connection or a 5xx/429.
        backoff: seconds before the first retry; doubles each time.
        max_bytes: largest body accepted.
        max_redirects: redirects followed per fetch.
        allow_private: let fetches reach loopback, private and link-local addresses.
        schemes: schemes a redirect may lead to.
        headers: sent with every request (values never logged or shown).
    """

    def __init__(
        self,
        *,
        timeout: float,
        retries: int,
        backoff: float,
        max_bytes: int,
        max_redirects: int,
        allow_private: bool,
        schemes: tuple[str, ...],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if retries < 0:
            raise SourceError(f"retries must be >= 0, got {retries}")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.max_bytes, self.max_redirects, self.schemes = max_bytes, max_redirects, schemes
        self._local = threading.local()
        transport = httpx.HTTPTransport()
        transport._pool = httpcore.ConnectionPool(  # the one way to give httpx a network backend
            ssl_context=httpx.create_ssl_context(),
            network_backend=_GuardedBackend(self._remaining, allow_private=allow_private),
        )
        # trust_env=False: a proxy from the environment would fetch on our behalf, past the guard.
        self._client = httpx.Client(
            transport=transport,
            timeout=timeout,
            trust_env=False,
            headers={"Accept-Encoding": "gzip, deflate", **(headers or {})},  # gzip: what _decoder handles
        )

    def _remaining(self) -> float:
        return getattr(self._local, "deadline", float("inf")) - time.monotonic()

    def get(
        self,
        uri: str,
        *,
        shown: str,
        stop: threading.Event | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> bytes:
        """The body at ``uri``, retried with backoff; ``stop`` set means no further attempt.

        Raises:
            SourceError: with ``shown`` (the redacted URI) and the reason.
        """
        return with_retries(
            lambda: self._attempt(uri, shown),
            shown=shown,
            retries=self.retries,
            backoff=self.backoff,
            stop=stop,
            on_retry=on_retry,
        )

    def _attempt(self, uri: str, shown: str) -> bytes:
        self._local.deadline = time.monotonic() + self.timeout
        try:
            request: httpx.Request | None = self._client.build_request("GET", uri)
            if request is not None and not request.url.host:
                raise SourceError(f"{shown}: no host in the URL")
            for _ in range(self.max_redirects + 1):
                if request is None:
                    break
                if request.url.scheme not in self.schemes:
                    raise SourceError(f"{shown}: redirected to a {request.url.scheme!r} URL, not allowed")
                response = self._client.send(request, stream=True)
                try:
                    if not response.is_redirect:
                        return self._body(response, shown)
                    request = response.next_request
                finally:
                    response.close()
            raise SourceError(f"{shown}: more than {self.max_redirects} redirects")
        except AddressRefused as exc:
            raise SourceError(f"{shown}: refused: {exc} (--allow-private-network to allow it)") from exc
        except Unresolvable as exc:
            raise Retryable(str(exc)) from exc
        except httpx.TimeoutException as exc:
            raise Retryable(self._timed_out()) from exc
        except httpx.TransportError as exc:
            raise Retryable(f"connection failed: {redact(str(exc))}") from exc
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, ValueError, UnicodeError) as exc:
            raise SourceError(f"{shown}: {type(exc).__name__}: {redact(str(exc))[:200]}") from exc
        finally:
            self._local.deadline = float("inf")

    def _timed_out(self) -> str:
        return f"timed out after {self.timeout:g} s (the deadline of one attempt)"

    def _body(self, response: httpx.Response, shown: str) -> bytes:
        if response.status_code in _RETRY_STATUS:
            raise Retryable(f"HTTP {response.status_code}")
        if response.status_code != 200:
            raise SourceError(f"{shown}: HTTP {response.status_code}")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise SourceError(f"{shown}: {declared} bytes is over the {self.max_bytes}-byte limit")
        decoder = _decoder(response.headers.get("content-encoding", ""), shown)
        chunks, size, received = [], 0, 0
        for raw in response.iter_raw():  # decoded here, with a bound, not by httpx
            received += len(raw)
            if self._remaining() <= 0:  # decompressing is CPU work no socket deadline sees
                raise Retryable(self._timed_out())
            data = raw
            while data:
                piece = data if decoder is None else _inflate(decoder, data, self.max_bytes + 1 - size, shown)
                size += len(piece)
                if size > self.max_bytes or received > self.max_bytes:
                    raise SourceError(f"{shown}: over the {self.max_bytes}-byte limit")
                chunks.append(piece)
                data = b"" if decoder is None else decoder.unconsumed_tail
        return b"".join(chunks)

    def close(self) -> None:
        self._client.close()
