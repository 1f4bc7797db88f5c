"""What a migration worker waits for before it claims a batch: ``rmq pause`` (the pair's control
flag, read from the store before each batch) and ``--rate`` (a token bucket the run's workers
share)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rm_qdrant.core.throttle import TokenBucket, check_rate
from rm_qdrant.pair.control import is_paused, still_backfilling
from rm_qdrant.store import Store

#: Seconds between two reads of the flag while a pair is paused.
PAUSE_POLL = 1.0


class Gate:
    """Holds a worker while its pair is paused, and keeps the run under its rate.

    Args:
        on_pause: told ``True`` when this run starts waiting for ``rmq resume``, ``False`` when
            it goes on (once per pause, whichever worker saw it).
        pausable: False: the flag is not read (``finalize``'s own pass: a pause holds the
            backfill, not the cutover).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        rate: float | None = None,
        batch: int = 0,
        on_pause: Callable[[bool], None] | None = None,
        poll: float = PAUSE_POLL,
        pausable: bool = True,
    ) -> None:
        self.store, self.name, self.poll, self.pausable = store, name, poll, pausable
        rate = check_rate(rate)
        self.bucket = (
            None if rate is None else TokenBucket(rate, clock=time.monotonic, sleep=time.sleep, burst=batch)
        )
        self.on_pause = on_pause
        self._waiting = 0
        self._lock = threading.Lock()

    def enter(self, points: int, halt: threading.Event) -> bool:
        """Wait until a batch of ``points`` may be claimed (False: ``halt`` was set meanwhile).

        The flag is read again once the rate lets the batch go: a pause set while it waited for
        its points holds it too."""
        if not self._unpaused(halt):
            return False
        if self.bucket is not None and not self.bucket.take(points, stop=halt.is_set):
            return False
        return self.bucket is None or self._unpaused(halt)

    def _unpaused(self, halt: threading.Event) -> bool:
        """True once the pair is not paused (at once, mostly); False: ``halt`` was set."""
        return not (self.pausable and is_paused(self.store, self.name)) or self._wait(halt)

    def _wait(self, halt: threading.Event) -> bool:
        """Poll the flag until it is lowered (True) or ``halt`` is set (False).

        Raises:
            MigrationError: the pair was dropped, rolled back or cut over meanwhile.
        """
        self._tell(+1, resumed=False)
        resumed = False
        try:
            while not halt.wait(self.poll):
                still_backfilling(self.store, self.name)
                if not is_paused(self.store, self.name):
                    resumed = True
                    break
            return resumed
        finally:
            self._tell(-1, resumed=resumed)

    def _tell(self, step: int, *, resumed: bool) -> None:
        with self._lock:
            self._waiting += step
            first, last = step > 0 and self._waiting == 1, step < 0 and self._waiting == 0
        if self.on_pause is not None and (first or (last and resumed)):
            self.on_pause(first)
