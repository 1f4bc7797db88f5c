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
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import chunks, over_failure_limit
from rm_qdrant.errors import MigrationError
from rm_qdrant.migration.gate import Gate
from rm_qdrant.migration.loading import NETWORK_WORKERS, FetchPace, load_batch
from rm_qdrant.migration.ranking import order_ready, plan, prepare_order
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.claiming import claim_batch
from rm_qdrant.pair.layouts import Layout, layout_of
from rm_qdrant.pair.outcome import (
    BatchResult,
    ClaimedBatch,
    Encoded,
    Gallery,
    MigrateOptions,
    MigrationReport,
    Prepared,
    unusable_rows,
)
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.pair.upkeep import IndexUpkeep
from rm_qdrant.sources import ImageSource

log = logging.getLogger(__name__)


def encode_loaded(
    encoder: OnnxEncoder, output: str, distance: str, ids: list[PointId], pixels: np.ndarray
) -> Encoded:
    """Embed a batch's decoded images; rows the encoder left unusable fail with the reason."""
    if not ids:
        return Encoded([], np.zeros((0, encoder.info.outputs[output]), dtype=np.float32), [])
    started = time.perf_counter()
    vectors = encoder.run_pixels(pixels, [output])[output]
    log.debug("encoded %s", ids)
    bad = unusable_rows(vectors, distance)
    seconds = time.perf_counter() - started
    if not bad.any():
        return Encoded(ids, vectors, [], seconds)
    reason = "the encoder returned NaN, infinity or a zero vector for this image"
    failed = [(i, reason) for i, b in zip(ids, bad.tolist(), strict=True) if b]
    kept = [i for i, b in zip(ids, bad.tolist(), strict=True) if not b]
    return Encoded(kept, vectors[~bad], failed, seconds)


def truncated_moved(
    truncated: Sequence[PointId], written: Sequence[PointId], failed: Sequence[tuple[PointId, str]]
) -> int:
    """Of a batch's documents cut at the model's ``max_length``, those written to new and not
    failed: a document failed (or not encoded) is read again by a later run, counted then."""
    if not truncated:
        return 0
    cut, lost = set(truncated), {point_id for point_id, _ in failed}
    return sum(1 for point_id in written if point_id in cut and point_id not in lost)


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
        gate: Gate | None = None,
    ) -> None:
        """``finishing``: the cutover of a single-collection pair embeds the points written
        without the new vector since it counted them (see cutover.py), in state ``finalizing``.
        ``upkeep``: told of each settled batch, to keep the indexes built (see upkeep.py).
        ``gate``: waited on before each batch is claimed (``rmq pause``, ``--rate``; see gate.py);
        default: one of this migrator's own, with ``options.rate``."""
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
        self.gate = gate or Gate(index.store, name, rate=options.rate, batch=options.batch)

    @property
    def pair(self) -> PairRecord:
        return self.index.pair

    @property
    def layout(self) -> Layout:
        return layout_of(self.index.pair)

    def ensure_order(self) -> None:
        """Rank the old points if the order is new, changed, half-written, or some points lack a
        rank; for the ``demand`` order, at every unsharded run (see :func:`order_ready`)."""
        if order_ready(self.store, self.pair, self.options.order, sharded=self.options.shard is not None):
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
                return None if batch is None else prepare.submit(self._gated, begin, batch, halt)

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

    def _gated(
        self, begin: Callable[[Sequence[PointId]], Any], batch: Sequence[PointId], halt: threading.Event
    ) -> Any:
        """Start ``batch`` once ``rmq pause`` and ``--rate`` let it (None: stopped while waiting)."""
        return begin(batch) if self.gate.enter(len(batch), halt) else None

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
        return claim_batch(self.layout, self.store, batch, self.carried)

    def _encode(self, prepared: Prepared) -> Encoded:
        return encode_loaded(self.encoder, self.output, self.pair.distance, prepared.loaded, prepared.pixels)

    def _settle(self, prepared: Prepared, encoded: Encoded) -> BatchResult:
        started = time.perf_counter()
        result = self.layout.settle(self.store, prepared, encoded, self.dim)
        stages = {**prepared.stages, "encode": encoded.seconds, "write": time.perf_counter() - started}
        if self.upkeep is not None:
            self.upkeep.written()  # on the writer thread: no write of this run races the build
        truncated = truncated_moved(prepared.truncated, encoded.ids, result.failed)
        return replace(result, stages=stages, retries=prepared.retries, truncated=truncated)
