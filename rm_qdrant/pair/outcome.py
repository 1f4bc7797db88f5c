"""What a migration is asked to do and what it did: the options of a run, a batch on its way,
each settled batch, a run's report, and the per-point failures it records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ATTEMPTS, ERROR
from rm_qdrant.errors import InvalidPayload
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.pair.upkeep import OPTIMIZE_EVERY
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store
from rm_qdrant.store.bounds import check_stored

# The most threads (--workers, --fetch-workers) or Ray actors and tasks (--encoders,
# --decoders) a run takes: each is an entry built up front (a shard, a thread, an actor), so an
# absurd count would exhaust memory before anything moved; more than this only contend anyway.
MAX_WORKERS = 256
#: The stages of a batch whose seconds :attr:`BatchResult.stages` gives (see docs/guides/operations.md).
STAGES = ("fetch", "decode", "encode", "write")


@dataclass(frozen=True)
class MigrateOptions:
    """What one ``rmq migrate`` run does.

    Attributes:
        batch: points per batch (each batch is one write to new and one to old).
        until: stop once this fraction of the gallery is in new.
        limit: move at most this many points in this run.
        order: backfill order; None keeps the pair's order (``random`` for a new pair).
        seed: seed of the ``random`` and ``centroid-unsupervised`` orders.
        shard: ``(i, n)``: move only the points of worker i of n.
        retry_failed: also try points whose last attempt failed.
        max_failure_share: stop when more than this share of a batch fails.
        fetch_workers: threads fetching and decoding images; None: by where a batch's images
            are, 2 for local files (more only contend with the encoder and the store's writes for
            the GIL), 1 once a batch showed them light (``LIGHT_IMAGE``), 8 where some come over
            the network (see migration/loading.py).
        source: how images are fetched.
        optimize_every: seconds between index builds of the collections written, while the
            run goes on, on a store that builds them only when asked (the embedded one; see
            :mod:`rm_qdrant.pair.upkeep`); None: only at the end of the run.
        rate: at most this many points a second on average, all the run's workers together
            (a token bucket; see :mod:`rm_qdrant.core.throttle`); None: as fast as it goes.
    """

    batch: int = 10_000
    until: float | None = None
    limit: int | None = None
    order: str | None = None
    seed: int = 0
    shard: tuple[int, int] | None = None
    retry_failed: bool = False
    max_failure_share: float = 0.5
    fetch_workers: int | None = None
    source: SourceConfig = field(default_factory=SourceConfig)
    optimize_every: float | None = OPTIMIZE_EVERY
    rate: float | None = None


class Gallery(Protocol):
    """What a migration works on: a :class:`DualIndex`, or anything with its store, pair and encoder."""

    store: Store
    pair: PairRecord
    encoder: OnnxEncoder | None


@dataclass(frozen=True)
class Encoded:
    """A batch as the encoder left it."""

    ids: list[PointId]  # encoded to storable vectors, in row order
    vectors: np.ndarray
    failed: list[tuple[PointId, str]]  # the encoder's output was unusable
    seconds: float = 0.0  # the encoder's time (Ray: summed over the batch's chunks)


@dataclass(frozen=True)
class Prepared:
    """A batch read and its images fetched and decoded, before it is encoded."""

    ids: list[PointId]  # still in old, in plan order
    payloads: dict[PointId, dict[str, Any]]
    already_in_new: list[PointId]
    loaded: list[PointId]  # whose images were read, in the order of ``pixels``
    pixels: np.ndarray
    failed: list[tuple[PointId, str]]
    gone: int
    token: str | None  # one collection: the batch's token (see BATCH)
    others: dict[PointId, dict[str, Any]]  # two collections: each point's other vectors, if any
    stages: dict[str, float] = field(default_factory=dict)  # fetch and decode seconds (BatchResult)
    retries: int = 0  # network fetches retried while its images were read
    truncated: list[PointId] = field(default_factory=list)  # of ``loaded``: texts cut at max_length


@dataclass(frozen=True)
class ClaimedBatch:
    """A batch read from the store, before its images are fetched: what :class:`Prepared` keeps,
    and the points whose images are to be read."""

    ids: list[PointId]
    payloads: dict[PointId, dict[str, Any]]
    already_in_new: list[PointId]
    todo: list[tuple[PointId, dict[str, Any]]]  # (id, payload), in plan order
    gone: int
    token: str | None
    others: dict[PointId, dict[str, Any]]
    # points whose payload the store cannot hold as a copy (see uncopyable), failed with the reason
    uncopyable: list[tuple[PointId, str]] = field(default_factory=list)

    def prepared(self, loaded: LoadedRows) -> Prepared:
        """The batch once its images were read (``loaded``: positions in ``todo``)."""
        return Prepared(
            self.ids,
            self.payloads,
            self.already_in_new,
            [self.todo[row][0] for row in loaded.rows],
            loaded.pixels,
            self.uncopyable + [(self.todo[row][0], reason) for row, reason in loaded.failed],
            self.gone,
            self.token,
            self.others,
            dict(loaded.seconds),
            loaded.retries,
            [self.todo[row][0] for row in loaded.truncated],
        )


class LoadedRows(Protocol):
    """Which of a batch's images were read (:class:`~rm_qdrant.migration.loading.LoadedBatch`)."""

    rows: list[int]
    pixels: np.ndarray
    truncated: list[int]
    failed: list[tuple[int, str]]
    seconds: Mapping[str, float]
    retries: int


@dataclass(frozen=True)
class BatchResult:
    """One settled batch.

    Attributes:
        stages: seconds the batch spent in each of :data:`STAGES`, as the migration's metrics
            show them: ``fetch`` and ``decode`` share the wall time its images took to load (the
            fetch threads interleave the two, image by image: each stage gets the share of the
            threads' time it took), ``encode`` the encoder's time, ``write`` the settling (write
            to new, read-backs, retire from old). With ``--engine ray``, fetch, decode and encode
            are the Ray workers' seconds, summed over the batch's chunks. Empty where not measured.
        retries: network fetches retried while its images were read.
        truncated: of the points moved, those whose text was cut at the model's ``max_length``
            (a text pair's; ``rmq status`` shows the sum).
    """

    moved: int
    repaired: int
    failed: list[tuple[PointId, str]]
    gone: int
    unconfirmed: int
    failed_again: int = 0  # of ``failed``: points whose last attempt had failed too
    rewritten: int = 0  # of ``unconfirmed``: rewritten in old meanwhile by a writer that bypasses rm-qdrant
    stages: Mapping[str, float] = field(default_factory=dict)
    retries: int = 0
    truncated: int = 0

    @property
    def points(self) -> int:
        """Planned points this batch accounted for, whatever became of them."""
        return self.moved + self.repaired + len(self.failed) + self.gone + self.unconfirmed


@dataclass
class MigrationReport:
    """What a run did, summed over its batches.

    ``stale_dropped``, ``remigrated`` and ``writer_deleted`` are what a writer that bypasses
    rm-qdrant did, as the run's sweep found it (see bypass.py): new copies dropped because the
    writer rewrote the point in old after it migrated, how many of those points this run
    migrated again, and migrated points the writer deleted from old (--keep-old) that the run
    deleted from new too. ``unconfirmed``: points left in old because their copy could not be
    confirmed (rewritten meanwhile, in old by such a writer too): the next run takes them again.
    ``truncated``: documents a text pair's run moved whose text was cut at the model's
    ``max_length``, as the tokenizer cuts it.
    """

    planned: int = 0
    skipped_failed: int = 0
    moved: int = 0
    repaired: int = 0
    failed: int = 0
    gone: int = 0
    unconfirmed: int = 0
    rewritten: int = 0  # of ``unconfirmed``: see BatchResult
    seconds: float = 0.0
    optimize_seconds: float = 0.0  # of ``seconds``: building the embedded store's indexes
    stopped_early: bool = False
    failure_sample: list[tuple[PointId, str]] = field(default_factory=list)
    stale_dropped: int = 0
    remigrated: int = 0
    writer_deleted: int = 0
    truncated: int = 0

    def add(self, result: BatchResult) -> None:
        self.moved += result.moved
        self.repaired += result.repaired
        self.failed += len(result.failed)
        self.gone += result.gone
        self.unconfirmed += result.unconfirmed
        self.rewritten += result.rewritten
        self.truncated += result.truncated
        self.failure_sample = (self.failure_sample + result.failed)[:5]

    def merge(self, part: MigrationReport) -> None:
        """Add another worker's report to this one."""
        self.planned += part.planned
        self.moved += part.moved
        self.repaired += part.repaired
        self.failed += part.failed
        self.gone += part.gone
        self.unconfirmed += part.unconfirmed
        self.rewritten += part.rewritten
        self.truncated += part.truncated
        self.stopped_early |= part.stopped_early
        self.failure_sample = (self.failure_sample + part.failure_sample)[:5]


def uncopyable(payloads: Mapping[PointId, Mapping[str, Any]]) -> dict[PointId, str]:
    """Of ``payloads`` (as old holds them), those no store write takes, and why: another client
    (qdrant-client's local mode, a raw qdrant-edge write) can keep a payload outside the store's
    bounds (NaN, an integer past 64 bits, over 100 levels deep; see
    :mod:`rm_qdrant.store.bounds`), and a copy of it to new would be refused, for every batch
    it is in. Such a point fails alone, with the reason, and stays served from old.
    """
    refused = {}
    for point_id, payload in payloads.items():
        try:
            check_stored(payload)
        except InvalidPayload as exc:
            refused[point_id] = f"its payload cannot be copied: {exc}"
    return refused


def unusable_rows(vectors: np.ndarray, distance: str) -> np.ndarray:
    """Rows an encoder returned that cannot be stored: NaN or infinity, or zero under cosine."""
    bad = ~np.isfinite(vectors).all(axis=1)
    if distance == "cosine":
        bad |= ~(np.abs(vectors).sum(axis=1) > 0)
    return bad


def record_failures(store: Store, collection: str, failed: Sequence[tuple[PointId, str]]) -> None:
    """Write on each failed point its reason and how many attempts failed so far (one read, then
    one store operation per distinct reason and count)."""
    if not failed:
        return
    before = {r.id: r.payload.get(ATTEMPTS) for r in store.retrieve(collection, [i for i, _ in failed])}
    groups: dict[tuple[str, int], list[PointId]] = {}
    for point_id, reason in failed:
        tried = before.get(point_id)
        count = tried + 1 if isinstance(tried, int) and not isinstance(tried, bool) else 1
        groups.setdefault((reason, count), []).append(point_id)
    for (reason, count), ids in groups.items():
        store.mark(collection, ids, {ERROR: reason, ATTEMPTS: count})


def waiting_refusal(pair: PairRecord, remaining: int, failed: int) -> str:
    """Why a cutover is refused while ``remaining`` points (``failed`` of them failed) still serve
    from old, and the ways out: finish the migration, or retry the failed points, or list them
    and cut over without them."""
    name, old = pair.name, pair.old_collection
    if not failed:
        return (
            f"{remaining} points still serve from {old!r}: finish the migration (rmq migrate --name {name})"
        )
    return (
        f"{remaining} points still serve from {old!r} ({failed} of them failed): retry them (rmq migrate "
        f"--name {name} --retry-failed), or list them (rmq failures --name {name}) and cut over without "
        f"them (rmq finalize --name {name} --drop-failed)"
    )
