"""Attempts with backoff, shared by the network sources (HTTP, object storage)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rm_qdrant.errors import SourceError

log = logging.getLogger(__name__)


class Retryable(Exception):
    """A failure worth another attempt (timeouts, failed connections, throttling, 5xx)."""


def with_retries(
    attempt: Callable[[], bytes],
    *,
    shown: str,
    retries: int,
    backoff: float,
    stop: threading.Event | None = None,
    on_retry: Callable[[], None] | None = None,
) -> bytes:
    """``attempt()``, again after each :class:`Retryable` failure, up to ``retries`` more times.

    The wait before a retry starts at ``backoff`` seconds and doubles; once ``stop`` is
    set no further attempt starts. ``on_retry`` is called before each retry's wait (the
    migration's metrics count them).

    Raises:
        SourceError: the last failure, with ``shown`` (the redacted URI) and the count.
    """
    delay = backoff
    for number in range(1, retries + 2):
        try:
            return attempt()
        except Retryable as exc:
            if number > retries or (stop is not None and stop.is_set()):
                raise SourceError(f"{shown}: {exc} (after {number} attempts)") from exc
            log.info("retrying %s in %.1fs: %s", shown, delay, exc)
            if on_retry is not None:
                on_retry()
        if stop is not None and stop.wait(delay):
            raise SourceError(f"{shown}: not retried, the run is stopping")
        if stop is None:
            time.sleep(delay)
        delay *= 2
    raise SourceError(f"{shown}: retries must be >= 0")
