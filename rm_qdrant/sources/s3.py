"""Fetching a gallery image from object storage: ``s3://bucket/key`` and ``gs://bucket/key``.

Both go through boto3 (an optional extra: ``pip install 'rm-qdrant[s3]'``), imported
only when the first such URI is fetched.

``s3://``: Amazon S3 or any S3-compatible store. Credentials, region and endpoint come
from boto3's standard chain, read when the first ``s3://`` URI is fetched: the
``AWS_*`` environment variables, ``~/.aws/config`` and ``~/.aws/credentials`` (the
profile ``AWS_PROFILE`` names), then a container or instance role. A store other than
AWS (MinIO, Ceph, R2...) is chosen with botocore's own ``AWS_ENDPOINT_URL_S3`` (or
``AWS_ENDPOINT_URL``), or ``endpoint_url`` in the profile.

``gs://``: Google Cloud Storage through its S3-compatible XML API at
https://storage.googleapis.com, signed with a GCS **HMAC key** given as
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (or in the ``~/.aws`` profile), the
same chain as ``s3://``. Google's own credentials (Application Default Credentials,
``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth``) are *not* used. ``AWS_ENDPOINT_URL*``
does not move ``gs://``; ``RMQ_GS_ENDPOINT`` does (a GCS emulator, a test server).
Since one credential chain serves both schemes, a run that reads ``s3://`` and
``gs://`` images together needs an S3 store that accepts the GCS key, or two runs.

The URI chooses only a bucket and a key, never a host, so the private-network guard
of ``http(s)`` fetches does not apply: the endpoint is the operator's choice. The key
is everything after the bucket's ``/``, taken literally (no unquoting; ``?`` and ``#``
are part of it), as the AWS CLI does.

Every fetch behaves as an HTTP one: ``timeout`` bounds connecting and each read, and
one deadline bounds the whole body; timeouts, failed connections, throttling and 5xx
answers are retried ``retries`` times with doubling backoff (botocore's own retries
are off, so the count in a message is the truth); other errors are not retried; a
set ``stop`` ends the retries; the body is read with a bound. Every failure is a
:class:`~rm_qdrant.errors.SourceError` naming the redacted URI and the reason.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rm_qdrant.core.redact import redact
from rm_qdrant.errors import SourceError
from rm_qdrant.sources.retry import Retryable, with_retries

log = logging.getLogger(__name__)

__all__ = ["GS_ENDPOINT", "GS_ENDPOINT_VAR", "ObjectRef", "S3Fetcher", "gs_endpoint", "parse_object_uri"]

GS_ENDPOINT = "https://storage.googleapis.com"
GS_ENDPOINT_VAR = "RMQ_GS_ENDPOINT"
_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")  # botocore's rule, without access-point ARNs
_CHUNK = 1 << 16
_POOL = 32  # connections kept per client; more fetch threads than this only reconnect more
_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "BadGateway",
        "GatewayTimeout",
    }
)
_REASONS = {
    "NoSuchKey": "the object does not exist",
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "access denied to these credentials",
    "AllAccessDisabled": "access to the bucket is disabled",
    "InvalidAccessKeyId": "the access key is not known to the server",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "ExpiredToken": "the session token has expired",
    "InvalidToken": "the session token is not valid",
    "PermanentRedirect": "the bucket is in another region (set AWS_DEFAULT_REGION)",
    "AuthorizationHeaderMalformed": "the bucket is in another region (set AWS_DEFAULT_REGION)",
    "InvalidObjectState": "the object is archived (restore it first)",
}
_NO_CREDENTIALS = {
    "s3": "no AWS credentials found (environment, ~/.aws, or an instance role)",
    "gs": "no credentials found: gs:// needs a GCS HMAC key as AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY (Google application-default credentials are not used)",
}


@dataclass(frozen=True)
class ObjectRef:
    """Where an object lives: ``scheme`` is ``s3`` or ``gs``."""

    scheme: str
    bucket: str
    key: str


def parse_object_uri(uri: str, *, shown: str) -> ObjectRef:
    """The scheme, bucket and key of ``s3://bucket/key`` or ``gs://bucket/key``.

    >>> parse_object_uri("s3://photos/cats/1.jpg", shown="")
    ObjectRef(scheme='s3', bucket='photos', key='cats/1.jpg')

    Raises:
        SourceError: another scheme, no bucket, no key, or a bucket name S3 refuses.
    """
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.lower()
    bucket, _, key = rest.partition("/")
    if not sep or scheme not in ("s3", "gs") or not bucket or not key:
        raise SourceError(f"{shown}: malformed URI (expected s3://bucket/key or gs://bucket/key)")
    if not _BUCKET.fullmatch(bucket):
        raise SourceError(f"{shown}: malformed URI: not a valid bucket name")
    return ObjectRef(scheme, bucket, key)


def gs_endpoint() -> str:
    """The endpoint ``gs://`` URIs are fetched from: ``$RMQ_GS_ENDPOINT``, else Google's XML API."""
    return os.environ.get(GS_ENDPOINT_VAR) or GS_ENDPOINT


class S3Fetcher:
    """GETs objects from S3 or GCS; thread-safe, one boto3 client per scheme, made on first use.

    Args:
        timeout: seconds to connect, to wait for each read, and for a whole body.
        retries: extra attempts after a timeout, a failed connection, throttling or a 5xx.
        backoff: seconds before the first retry; doubles each time.
        max_bytes: largest object accepted.
    """

    def __init__(self, *, timeout: float, retries: int, backoff: float, max_bytes: int) -> None:
        if retries < 0:
            raise SourceError(f"retries must be >= 0, got {retries}")
        self.timeout, self.retries, self.backoff, self.max_bytes = timeout, retries, backoff, max_bytes
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()  # boto3 sessions are not thread-safe; clients are
        self._narrow_reads = True

    def get(
        self,
        uri: str,
        *,
        shown: str,
        stop: threading.Event | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> bytes:
        """The object at ``uri``, retried with backoff; ``stop`` set means no further attempt.

        Raises:
            SourceError: with ``shown`` (the redacted URI) and the reason.
        """
        ref = parse_object_uri(uri, shown=shown)
        client = self._client(ref.scheme, shown)
        return with_retries(
            lambda: self._attempt(client, ref, shown),
            shown=shown,
            retries=self.retries,
            backoff=self.backoff,
            stop=stop,
            on_retry=on_retry,
        )

    def _attempt(self, client: Any, ref: ObjectRef, shown: str) -> bytes:
        from botocore import exceptions as bx

        deadline = time.monotonic() + self.timeout
        try:
            response = client.get_object(Bucket=ref.bucket, Key=ref.key)
            body = response["Body"]
            try:
                return self._body(body, response.get("ContentLength"), shown, deadline)
            finally:
                body.close()
        except bx.ClientError as exc:
            raise _client_error(exc, shown) from exc
        except bx.NoCredentialsError as exc:
            raise SourceError(f"{shown}: {_NO_CREDENTIALS[ref.scheme]}") from exc
        except (bx.ConnectTimeoutError, bx.ReadTimeoutError) as exc:
            raise Retryable(f"timed out after {self.timeout:g} s") from exc
        except (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError) as exc:
            raise Retryable(f"connection failed: {_connection_reason(exc, client)}") from exc
        except bx.BotoCoreError as exc:
            raise SourceError(f"{shown}: {type(exc).__name__}: {redact(str(exc))[:200]}") from exc

    def _body(self, body: Any, declared: object, shown: str, deadline: float) -> bytes:
        if isinstance(declared, int) and declared > self.max_bytes:
            raise SourceError(f"{shown}: {declared} bytes is over the {self.max_bytes}-byte limit")
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Retryable(f"timed out after {self.timeout:g} s (the deadline of one attempt)")
            if left < self.timeout and not (isinstance(declared, int) and size >= declared):
                self._narrow(body, left)  # a stall then ends at the deadline, not a read timeout later
            chunk = body.read(min(_CHUNK, self.max_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_bytes:
                raise SourceError(f"{shown}: over the {self.max_bytes}-byte limit")
            chunks.append(chunk)

    def _narrow(self, body: Any, seconds: float) -> None:
        """Let the next socket reads wait no longer than the fetch's deadline allows.

        urllib3 resets the timeout when the connection is reused. Not called once the
        body is complete: http.client has let go of the socket by then.
        """
        if self._narrow_reads:
            try:
                body.set_socket_timeout(max(seconds, 1e-3))
            except AttributeError:  # botocore could not reach the socket: the read timeout stays
                self._narrow_reads = False

    def _client(self, scheme: str, shown: str) -> Any:
        with self._lock:
            if scheme not in self._clients:
                self._clients[scheme] = self._new_client(scheme, shown)
            return self._clients[scheme]

    def _new_client(self, scheme: str, shown: str) -> Any:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError
        except ImportError as exc:
            raise SourceError(f"{shown}: s3:// sources need boto3: pip install 'rm-qdrant[s3]'") from exc
        options: dict[str, Any] = {}
        if scheme == "gs":  # GCS does not know S3's newer checksum headers
            options = {"request_checksum_calculation": "when_required"}
            options["response_checksum_validation"] = "when_required"
        config = Config(
            connect_timeout=self.timeout,
            read_timeout=self.timeout,
            retries={"total_max_attempts": 1, "mode": "standard"},  # ours count, botocore's don't
            max_pool_connections=_POOL,
            **options,
        )
        where = {"endpoint_url": gs_endpoint(), "region_name": "auto"} if scheme == "gs" else {}
        try:
            return boto3.session.Session().client("s3", config=config, **where)
        except (ValueError, BotoCoreError) as exc:
            raise SourceError(f"{shown}: cannot set up {scheme}:// access: {redact(str(exc))[:200]}") from exc

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def _client_error(exc: Any, shown: str) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code") or "error")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    if code in _RETRY_CODES or status >= 500 or status == 429:
        return Retryable(f"{code} (HTTP {status})")
    reason = _REASONS.get(code) or redact(str(error.get("Message") or f"HTTP {status}"))[:200]
    return SourceError(f"{shown}: {redact(code)[:80]} ({reason})")


def _connection_reason(exc: Exception, client: Any) -> str:
    """Why a connection failed, without botocore's text: it holds the URL, key (and its secrets) encoded."""
    from botocore import exceptions as bx

    endpoint = redact(str(client.meta.endpoint_url))
    if isinstance(exc, bx.EndpointConnectionError):
        inner = str(getattr(exc, "kwargs", {}).get("error", ""))
        detail = redact(inner.rsplit(": ", 1)[-1])[:120]
        return f"could not connect to {endpoint}" + (f" ({detail})" if detail else "")
    if isinstance(exc, (bx.ConnectionClosedError, bx.ResponseStreamingError, bx.IncompleteReadError)):
        return f"the connection to {endpoint} broke off"
    return f"{type(exc).__name__} with {endpoint}"
