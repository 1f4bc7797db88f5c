"""Reading a pair without changing it: :func:`status` (``rmq status``) and :func:`failures` (``rmq
failures``). ``rmq search`` is :meth:`DualIndex.search <rm_qdrant.DualIndex.search>`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rm_qdrant.api.probing import status_estimate
from rm_qdrant.operations.failures import FailedPoint, iter_failures
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.serving.status import PairStatus, pair_status
from rm_qdrant.store import Store


@dataclass(frozen=True)
class StatusReport:
    """A pair's state as :func:`status` reads it (``rmq status --json`` is :meth:`as_dict`).

    Attributes:
        pair: the pair's record (models, order, image rule, recorded source settings).
        status: its collections' sizes, failures, models and alias.
        estimate: the label-free quality of what the pair serves now, from the last
            :func:`probe`'s sample (None: no probe of this pair with its model, or the backfill
            is over).
    """

    pair: PairRecord
    status: PairStatus
    estimate: dict[str, Any] | None

    @property
    def fraction(self) -> float:
        """Share of the gallery served from new."""
        return self.status.fraction

    @property
    def calibrated(self) -> bool:
        """Whether the naive merge maps old distances onto the new scale (``rmq calibrate``)."""
        return self.pair.old_distance is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self.status),
            "fraction": self.fraction,
            "remaining": self.status.remaining,
            "paused": self.status.paused_since is not None,
            "estimate": self.estimate,
            "calibrated": self.calibrated,
            "source": self.pair.source or {},
        }


def status(store: Store, name: str) -> StatusReport:
    """Both halves' sizes, the fraction migrated, the query mode, the models, and (after a
    :func:`probe`) the estimate of what the merge serves now: ``rmq status``.

    Raises:
        CollectionNotFound: no pair of that name.

    Example:
        >>> report = rm_qdrant.status(store, "photos")  # doctest: +SKIP
        >>> f"{report.fraction:.0%} migrated, {report.status.failed} failed"  # doctest: +SKIP
        '50% migrated, 0 failed'
    """
    pair = load_pair(store, name)
    state = pair_status(store, pair)
    # a forecast of the merge a backfill serves: none after a rollback (old serves all) or a cutover
    estimate = status_estimate(store, pair, fraction=state.fraction) if pair.state == "backfilling" else None
    return StatusReport(pair, state, estimate)


def failures(store: Store, name: str) -> Iterator[FailedPoint]:
    """The points of pair ``name`` whose migration failed, a page at a time: ``rmq failures``.

    They still serve from old. Fix their source and migrate again with ``retry_failed=True``, or
    cut over without them (:func:`finalize` with ``drop_failed=True``). Write the list to a file
    with :func:`rm_qdrant.operations.failures.write_failures`.

    Raises:
        CollectionNotFound: no pair of that name (at the call, not at the first point).

    Example:
        >>> for failed in rm_qdrant.failures(store, "photos"):  # doctest: +SKIP
        ...     print(failed.id, failed.reason)
    """
    return iter_failures(store, load_pair(store, name))
