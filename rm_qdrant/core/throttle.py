"""``rmq migrate --rate``: a token bucket that the workers of one run share (pure: the clock
and the sleep are given)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from rm_qdrant.errors import ConfigError


def check_rate(rate: float | None) -> float | None:
    """``rate`` if it is a number of points per second above 0 (None: no limit).

    >>> check_rate(250)
    250.0
    """
    if rate is None:
        return None
    try:
        value = float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else math.nan
    except OverflowError:  # an int past float's range
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"--rate is points per second, a number above 0, got {rate!r}")
    return value


class TokenBucket:
    """At most ``rate`` points a second on average, whichever worker takes them.

    The bucket holds one second of points, or one batch if a batch is larger, so a batch is
    never refused; a batch larger than a second's worth borrows, and the next waits the debt
    out.

    Example:
        >>> clock = iter([0.0, 0.0, 0.0]).__next__
        >>> bucket = TokenBucket(100.0, clock=clock, sleep=lambda s: None)
        >>> bucket.take(50, stop=lambda: False)
        True
    """

    def __init__(
        self,
        rate: float,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        burst: int = 0,
    ) -> None:
        self.rate = float(rate)
        self.capacity = max(self.rate, float(burst))
        self._clock, self._sleep = clock, sleep
        self._tokens = self.capacity
        self._last = clock()
        self._lock = threading.Lock()

    def take(self, points: int, *, stop: Callable[[], bool], tick: float = 0.25) -> bool:
        """Wait until ``points`` may go (False: ``stop()`` turned true while waiting)."""
        need = min(float(points), self.capacity)
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= need - 1e-9 * need:  # rounding must not leave it a hair short
                    self._tokens -= points  # may go below 0: a batch above the capacity borrows
                    return True
                wait = (need - self._tokens) / self.rate
            if stop():
                return False
            self._sleep(min(wait, tick))
