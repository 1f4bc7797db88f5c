"""The online backfill: move gallery points from the old collection to the new one.

Each batch goes through three stages that overlap (a bounded pipeline): while
the encoder embeds batch k on the calling thread, a thread pool fetches and
decodes the images of batch k+1, and a writer thread settles batch k-1. A batch
is settled in this order, which keeps DESIGN.md's invariants:

1. insert-only upsert into new (waited), with the other named vectors the point has in
   old: a fresher write by a user always wins;
2. read back from new (ids present, vectors of the right size) and from old;
3. retire the confirmed points from old (delete, or mark in keep-old mode);
   delete a migrated copy whose point a user deleted meanwhile;
4. record fetch/decode failures on the old points, which stay searchable.

On the embedded store, which builds its indexes only when asked, the collections written are
optimised every ``optimize_every`` seconds (after a batch, on the writer thread) and once more
at the end of :func:`run_migration` (see upkeep.py).

All state lives in Qdrant: the ranks of the backfill order and the failures are
payload fields of the old points, the order's name is in the pair record, and
what is done is simply what is no longer (or no longer unmarked) in old. A run
killed at any moment is resumed by running it again.

In one collection the new vectors are written to the points that still lack one and still
carry the token the batch put on them before reading their payloads: a user's rewrite of a
point (old vector only, a new image, say) replaces the token too, so no vector of the previous
image lands, and the next run embeds the point from its new image.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rm_qdrant.backfill.bypass import Swept, sweep
from rm_qdrant.backfill.dual import DualIndex
from rm_qdrant.backfill.layouts import REMOVAL_GRACE, Layout, layout_of
from rm_qdrant.backfill.loading import NETWORK_WORKERS, FetchPace, load_batch
from rm_qdrant.backfill.outcome import (
    MAX_WORKERS,
    BatchResult,
    ClaimedBatch,
    Encoded,
    Gallery,
    MigrateOptions,
    MigrationReport,
    Prepared,
    uncopyable,
    unusable_rows,
)
from rm_qdrant.backfill.pair import PairRecord
from rm_qdrant.backfill.ranking import order_ready, plan, prepare_order
from rm_qdrant.backfill.upkeep import IndexUpkeep
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ERROR, chunks, over_failure_limit
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.sources import ImageSource
from rm_qdrant.store import Where

if TYPE_CHECKING:
    from rm_qdrant.backfill.ray_engine import RayOptions

log = logging.getLogger(__name__)
__all__ = ["REMOVAL_GRACE", "MigrateOptions", "Migrator", "run_migration"]


def encode_loaded(
    encoder: OnnxEncoder, output: str, distance: str, ids: list[PointId], pixels: np.ndarray
) -> Encoded:
    """Embed a batch's decoded images; rows the encoder left unusable fail with the reason."""
    if not ids:
        return Encoded([], np.zeros((0, encoder.info.outputs[output]), dtype=np.float32), [])
    vectors = encoder.run_pixels(pixels, [output])[output]
    log.debug("encoded %s", ids)
    bad = unusable_rows(vectors, distance)
    if not bad.any():
        return Encoded(ids, vectors, [])
    reason = "the encoder returned NaN, infinity or a zero vector for this image"
    failed = [(i, reason) for i, b in zip(ids, bad.tolist(), strict=True) if b]
    return Encoded([i for i, b in zip(ids, bad.tolist(), strict=True) if not b], vectors[~bad], failed)


class Migrator:
    """Runs one migration over a DualIndex's pair with its encoder.

    Example:
        >>> index = DualIndex.open(store, "photos")  # doctest: +SKIP
        >>> report = Migrator(index, MigrateOptions(batch=1000, until=0.5)).run()  # doctest: +SKIP
    """

    def __init__(
        self,
        index: Gallery,
        options: MigrateOptions,
        *,
        finishing: bool = False,
        upkeep: IndexUpkeep | None = None,
    ) -> None:
        """``finishing``: the cutover of a single-collection pair embeds the points written
        without the new vector since it counted them (see cutover.py), in state ``finalizing``.
        ``upkeep``: told of each settled batch, to keep the indexes built (see upkeep.py)."""
        name, state = index.pair.name, index.pair.state
        if state == "finalizing" and not (finishing and layout_of(index.pair).finishing_migration()):
            raise MigrationError(
                f"a cutover of pair {name!r} is under way: 'rmq finalize --name {name}' completes it"
            )
        if state == "dropping":
            raise MigrationError(f"pair {name!r} is being dropped: 'rmq drop-pair {name}' finishes it")
        if state not in ("backfilling", "finalizing"):
            raise MigrationError(f"pair {name!r} is {state}: nothing to migrate")
        if index.encoder is None:
            raise MigrationError("a migration needs the pair's encoder")
        if not 0.0 <= options.max_failure_share <= 1.0:
            raise MigrationError(f"max failure share must be in [0, 1], got {options.max_failure_share}")
        self.index = index
        self.store = index.store
        self.options = options
        self.upkeep = upkeep
        self.encoder = index.encoder
        self.output = index.encoder.info.gallery_output()
        self.dim = index.store.collection(index.pair.new_collection, index.pair.new_using).dim
        # Two collections: the other vectors a point takes to new (one collection: they stay put).
        self.carried = self.layout.migration_carries(index.store)
        self.pace = FetchPace()  # how light the images are: how many threads local files get

    @property
    def pair(self) -> PairRecord:
        return self.index.pair

    @property
    def layout(self) -> Layout:
        return layout_of(self.index.pair)

    def ensure_order(self) -> None:
        """Rank the old points if the order is new, changed, half-written, or some points lack a rank."""
        if order_ready(self.store, self.pair, self.options.order):
            return
        wanted = self.options.order or self.pair.order or "random"
        if self.options.shard is not None:
            raise MigrationError(
                f"the {wanted} order is not prepared for every point; run 'rmq migrate --prepare' "
                "(without --shard) before starting sharded workers"
            )
        self.index.pair = prepare_order(self.store, self.pair, wanted, seed=self.options.seed)

    def run(
        self,
        *,
        ids: list[PointId] | None = None,
        stop: threading.Event | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
    ) -> MigrationReport:
        """Migrate until the plan is done, ``stop`` is set, or too much of a batch fails.

        Args:
            ids: the plan, if already made (:func:`plan`); made here otherwise.
            stop: set it (from a signal handler, say) to stop after the current batch.
            on_batch: called with each settled batch.

        Raises:
            MigrationError: more than ``max_failure_share`` of a batch failed (that
                batch is settled first: its good points are moved, its failures recorded).
        """
        started = time.perf_counter()
        if ids is None:
            self.ensure_order()
            ids = plan(self.store, self.pair, self.options)
        report = MigrationReport(planned=len(ids))
        batches = list(chunks(ids, self.options.batch))
        halt = stop or threading.Event()  # set: fetches not yet begun give up at once
        with (
            self._stages(halt) as begin,
            ThreadPoolExecutor(1, "rmq-prepare") as prepare,
            ThreadPoolExecutor(1, "rmq-write") as write,
        ):
            queue = iter(batches)

            def next_batch() -> Future[Any] | None:
                batch = next(queue, None)
                return None if batch is None else prepare.submit(begin, batch)

            upcoming, pending_write = next_batch(), None
            try:
                while upcoming is not None:
                    begun = None if halt.is_set() else upcoming.result()
                    if begun is None or halt.is_set():  # its fetches may have given up: drop it
                        report.stopped_early = True
                        upcoming.cancel()
                        break
                    upcoming = next_batch()  # fetched and decoded while this one is encoded
                    finished = self._finish(begun)
                    if finished is None:  # stopped before it was encoded: dropped, as above
                        report.stopped_early = True
                        break
                    prepared, encoded = finished
                    if pending_write is not None:
                        self._collect(pending_write.result(), report, on_batch)
                    pending_write = write.submit(self._settle, prepared, encoded)
                if pending_write is not None:
                    self._collect(pending_write.result(), report, on_batch)
            except BaseException:
                halt.set()  # the fetch threads wind down fast instead of finishing the batch
                raise
        report.seconds = time.perf_counter() - started
        return report

    @contextlib.contextmanager
    def _stages(self, halt: threading.Event) -> Iterator[Callable[[Sequence[PointId]], Any]]:
        """What starts a batch on the prepare thread: claim it, fetch and decode its images."""
        with (
            ImageSource(self.options.source, stop=halt) as source,
            ThreadPoolExecutor(self.options.fetch_workers or NETWORK_WORKERS, "rmq-fetch") as fetch,
        ):
            yield lambda batch: self._prepare(batch, source, fetch)

    def _finish(self, prepared: Any) -> tuple[Prepared, Encoded] | None:
        """A started batch, encoded (on the calling thread, while the next batch is fetched);
        None: dropped unwritten, for a stop (the Ray engine's, see ray_engine.py)."""
        return prepared, self._encode(prepared)

    def _collect(
        self,
        result: BatchResult,
        report: MigrationReport,
        on_batch: Callable[[BatchResult], None] | None,
    ) -> None:
        report.add(result)
        if on_batch is not None:
            on_batch(result)
        attempted = result.moved + result.repaired + len(result.failed)
        # Points failing again (--retry-failed) say nothing new about the source: only fresh
        # failures count towards stopping, so a retry can get past the old ones.
        fresh = len(result.failed) - result.failed_again
        if over_failure_limit(fresh, attempted - result.failed_again, self.options.max_failure_share):
            reason = result.failed[0][1]
            raise MigrationError(
                f"{len(result.failed)} of {attempted} points in a batch failed (first: {reason}); "
                "stopping: fix the source, then rerun with --retry-failed (or raise --max-failures)"
            )

    def _prepare(self, batch: Sequence[PointId], source: ImageSource, fetch: ThreadPoolExecutor) -> Prepared:
        claim = self._claim(batch)
        loaded = load_batch(
            self.encoder,
            source,
            self.pair.uri_rule,
            claim.todo,
            fetch,
            workers=self.options.fetch_workers,
            pace=self.pace,
        )
        return claim.prepared(loaded)

    def _claim(self, batch: Sequence[PointId]) -> ClaimedBatch:
        """Read a batch (one collection: token it) before its images are fetched."""
        claimed = self.layout.claim(self.store, list(batch), self.carried)
        present, done = claimed.present, claimed.done
        payloads = {r.id: r.payload for r in present}
        ids = [i for i in batch if i in payloads]  # a user may have deleted some meanwhile
        refused = {}
        if self.layout.copies_payload:  # one payload new cannot take fails its point, not the run
            refused = uncopyable({i: payloads[i] for i in ids if i not in done})
        return ClaimedBatch(
            ids,
            payloads,
            [i for i in ids if i in done],
            [(i, payloads[i]) for i in ids if i not in done and i not in refused],
            len(batch) - len(ids),
            claimed.token,
            {r.id: r.others for r in present} if self.carried else {},
            list(refused.items()),
        )

    def _encode(self, prepared: Prepared) -> Encoded:
        return encode_loaded(self.encoder, self.output, self.pair.distance, prepared.loaded, prepared.pixels)

    def _settle(self, prepared: Prepared, encoded: Encoded) -> BatchResult:
        result = self.layout.settle(self.store, prepared, encoded, self.dim)
        if self.upkeep is not None:
            self.upkeep.written()  # on the writer thread: no write of this run races the build
        return result


def check_workers(workers: int, options: MigrateOptions) -> None:
    """Refuse ``workers`` below 1 or above :data:`MAX_WORKERS`, above 1 with ``options.shard``,
    or ``options.fetch_workers`` outside 1..MAX_WORKERS (``rmq migrate --dry-run`` checks it as
    the run does).

    Raises:
        ConfigError: as :func:`run_migration` would.
    """
    for name, value in (("workers", workers), ("fetch_workers", options.fetch_workers)):
        if value is None and name == "fetch_workers":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{name} ({flag}) is a whole number from 1 to {MAX_WORKERS}, got {value!r}")
    if workers > 1 and options.shard is not None:
        raise ConfigError("use --workers N (threads) or --shard i/n (processes), not both; N >= 1")


def run_migration(
    index: DualIndex,
    options: MigrateOptions,
    *,
    workers: int = 1,
    stop: threading.Event | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    ray: RayOptions | None = None,
) -> MigrationReport:
    """What ``rmq migrate`` does: rank the gallery once, plan, then run ``workers`` shards.

    With ``workers > 1`` the shards run as threads of this process (the embedded
    store admits one process); against a server, ``options.shard`` lets separate
    processes or machines share the work instead. ``ray``: fetch, decode and encode on a Ray
    cluster (see ray_engine.py); the shards still write from this process.

    Raises:
        ConfigError: ``workers`` or ``options.fetch_workers`` is outside 1..MAX_WORKERS, or
            ``workers`` is above 1 with ``options.shard``.
        MigrationError: see :meth:`Migrator.run`.
    """
    check_workers(workers, options)
    if options.optimize_every is not None and not options.optimize_every >= 0:
        raise ConfigError(f"optimize_every must be seconds >= 0 or None, got {options.optimize_every}")
    swept = Swept([], [])
    if index.pair.state == "backfilling":  # before the ranking: a writer's rewrite has no rank
        swept = sweep(index.store, index.pair, layout_of(index.pair).old_where())
    Migrator(index, options).ensure_order()
    skipped = 0
    if not options.retry_failed:
        skipped = index.store.count(
            index.pair.old_collection, layout_of(index.pair).old_where() & Where(not_empty=(ERROR,))
        )
    shards = [options] if workers == 1 else [replace(options, shard=(i, workers)) for i in range(workers)]
    pair = index.pair
    upkeep = IndexUpkeep(
        index.store, [pair.new_collection, pair.old_collection], every=options.optimize_every
    )
    migrators = [Migrator(index, shard, upkeep=upkeep) for shard in shards]
    plans = [plan(index.store, index.pair, m.options, swept.stale) for m in migrators]
    if on_plan is not None:
        on_plan(sum(map(len, plans)))
    halt = stop or threading.Event()
    with contextlib.ExitStack() as stack:
        if ray is not None and any(plans):  # nothing to move: no cluster to start
            from rm_qdrant.backfill.ray_engine import ray_migrators

            on_ray = ray_migrators(stack, migrators, ray, halt)
            if on_ray is None:  # stopped while Ray started: nothing was claimed
                return MigrationReport(
                    planned=sum(map(len, plans)),
                    skipped_failed=skipped,
                    stopped_early=True,
                    stale_dropped=len(swept.stale),
                    writer_deleted=len(swept.deleted),
                )
            migrators = on_ray
        report = _run_shards(migrators, plans, skipped, upkeep, halt, on_batch)
    report.stale_dropped, report.writer_deleted = len(swept.stale), len(swept.deleted)
    report.remigrated = len(layout_of(index.pair).ids_in_new(index.store, swept.stale)) if swept.stale else 0
    return report


def _run_shards(
    migrators: list[Migrator],
    plans: list[list[PointId]],
    skipped: int,
    upkeep: IndexUpkeep,
    halt: threading.Event,
    on_batch: Callable[[BatchResult], None] | None,
) -> MigrationReport:
    """Run each migrator on its plan, side by side; one's failure stops the others."""
    lock = threading.Lock()

    def report_batch(result: BatchResult) -> None:
        if on_batch is not None:
            with lock:
                on_batch(result)

    def work(migrator: Migrator, ids: list[PointId]) -> MigrationReport:
        try:
            return migrator.run(ids=ids, stop=halt, on_batch=report_batch)
        except BaseException:
            halt.set()  # one worker's failure stops the others after their batch
            raise

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(migrators), "rmq-worker") as pool:
            futures = [pool.submit(work, m, p) for m, p in zip(migrators, plans, strict=True)]
            reports = [f.result() for f in futures]
    except MigrationError:
        upkeep.finish()  # the batches settled before the stop serve from a built index too
        raise
    if not halt.is_set():  # a stop (Ctrl-C, SIGTERM) ends now: the next run, or optimize(), builds
        upkeep.finish()
    total = MigrationReport(
        seconds=time.perf_counter() - started, skipped_failed=skipped, optimize_seconds=upkeep.seconds
    )
    for part in reports:
        total.merge(part)
    return total
