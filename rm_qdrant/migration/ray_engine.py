"""``rmq migrate --engine ray``: the backfill's fetching, decoding and encoding on a Ray cluster.

The store is touched by the driver alone, with the local engine's code: each batch is claimed
(one collection: tokened) and settled (insert-only write, read-back, retire) by
:class:`~rm_qdrant.migration.migrator.Migrator`, one writer per slice of the gallery (``--workers``
threads of one driver, or ``--shard i/n`` drivers against a server). Only a batch's images go
out: its points are cut into chunks; a Ray task per chunk fetches and decodes them (at most
``decoders`` at once), and an actor of the encoder pool (``encoders`` actors, one ONNX Runtime
session each, on ``gpus_per_encoder`` GPUs) embeds what the task decoded, straight from Ray's
object store. The driver gets back vectors and failure reasons, never pixels.

So the store's guarantees are the local engine's: a killed driver leaves batches claimed but
unwritten, which the next run takes again; a killed Ray worker is retried by Ray (tasks, and
actors restarted); a run whose worker fails for good stops with the batch unwritten, and its
rerun continues. Failures of one image (a broken file, a NaN from the encoder) are recorded on
the point, as by the local engine.

This is Ray Core (tasks and an actor pool), which Ray Data's ``map_batches`` runs on: a batch is
claimed in the store before its images are read, which a Dataset built ahead of time cannot do
without re-creating its encoder actors (and their sessions) per batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.redact import redact
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, MigrationError, RmqError
from rm_qdrant.migration.migrator import Migrator
from rm_qdrant.migration.ray_workers import EncoderActor, assemble, decode_chunk
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.outcome import MAX_WORKERS, ClaimedBatch, Encoded, Prepared
from rm_qdrant.sources import SourceConfig
from rm_qdrant.sources.settings import header_values

log = logging.getLogger(__name__)
#: Most images one decode task, and one call of an encoder actor, take.
CHUNK = 256
#: Ray's own retries of a decode task whose process died, and restarts of an encoder actor.
RETRIES = 3
#: Seconds between looks at the stop event while waiting on Ray.
POLL = 0.2
#: Seconds Ray may take to start, or to answer at ``--ray-address``.
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide ``--engine ray`` runs.

    Attributes:
        address: the Ray cluster (``auto``, ``ray://host:10001``, ...); None: ``$RAY_ADDRESS``
            if set, else a local Ray started for the run and stopped at its end. Inside a Ray
            job already connected (``ray.init`` called), that connection is used and left open.
        encoders: encoder actors, each one ONNX Runtime session on one CPU (and its GPUs).
        gpus_per_encoder: GPUs each encoder actor takes (0: it encodes on its CPU); above 0,
            ONNX Runtime's CUDA provider (``onnxruntime-gpu``) must be installed on the workers.
        decoders: decode tasks at once (one CPU each), each fetching and decoding a chunk of a
            batch with ``fetch_workers`` threads.
    """

    address: str | None = None
    encoders: int = 1
    gpus_per_encoder: float = 0.0
    decoders: int = 2

    @property
    def slots(self) -> int:
        """CPUs the run's Ray workers take at once: an encoder actor or a decode task each."""
        return self.encoders + self.decoders

    def __post_init__(self) -> None:
        for name in ("encoders", "decoders"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
                raise ConfigError(f"{name} is a whole number from 1 to {MAX_WORKERS}, got {value!r}")
        gpus = self.gpus_per_encoder
        if isinstance(gpus, bool) or not isinstance(gpus, int | float) or not 0 <= gpus < math.inf:
            raise ConfigError(f"gpus_per_encoder is a number >= 0, got {gpus!r}")


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--engine ray needs Ray: pip install 'rm-qdrant[ray]'") from exc
    return ray


@dataclass(frozen=True)
class InFlight:
    """A claimed batch whose chunks are out on Ray: one encoder result per chunk."""

    claim: ClaimedBatch
    starts: list[int]  # each chunk's first position in ``claim.todo``
    decoding: list[Any]  # ObjectRefs of the decode tasks
    results: list[Any]  # ObjectRefs of EncoderActor.encode, one per decode task


class RayEngine:
    """The Ray side of one migration run: connects (or starts a local Ray), holds the encoder
    actors, sends out chunks and gathers their results; :meth:`close` ends what it started."""

    def __init__(
        self,
        options: RayOptions,
        encoder: OnnxEncoder,
        *,
        output: str,
        distance: str,
        source: SourceConfig,
        rule: UriRule,
        fetch_workers: int | None,
        halt: threading.Event,
    ) -> None:
        ray = self.ray = import_ray()
        self.options = options
        self.address = options.address or os.environ.get("RAY_ADDRESS") or "local"
        self._release = threading.Event()  # ends the thread that started Ray (see _connect)
        self.started = not ray.is_initialized()
        if self.started:
            sigterm = signal.getsignal(signal.SIGTERM)
            if not self._connect(halt):
                raise Stopped
            give_back_sigterm(sigterm)
        self.actors: list[Any] = []
        self._decoding: list[Any] = []
        self._lock = threading.Lock()
        self._turn = 0
        try:
            self._check_room()
            args = (encoder.info, sent(source), rule, fetch_workers, encoder.decoding)
            self._start(encoder, output, distance, args)
        except BaseException:
            self.close()  # the local Ray it started, too
            raise

    def _connect(self, halt: threading.Event) -> bool:
        """Start a local Ray, or reach the cluster; False if ``halt`` was set first.

        ``ray.init`` runs on a thread of its own: an address where no Ray answers would hold it
        for ever, and Ray installs a SIGTERM handler that aborts the process when it is called
        on the main thread (the run's own handler stops it after the batch in flight).
        """
        ray, options = self.ray, self.options
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # A local Ray counts a CPU per encoder actor and decode task: on a machine with as few
        # cores as encoders it would wait for ever, so it gets one more; decode tasks beyond
        # its CPUs wait their turn instead of starting a process each.
        local = (
            {"num_cpus": max(os.cpu_count() or 1, options.encoders + 1)} if self.address == "local" else {}
        )
        failure: list[BaseException] = []

        ready = threading.Event()

        def init() -> None:
            try:
                ray.init(
                    address=self.address,
                    **local,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            except Exception as exc:  # Ray raises ConnectionError, ValueError, RuntimeError...
                failure.append(exc)
                return
            ready.set()
            # A local Ray's processes are told to die with the thread that started them (Linux's
            # parent-death signal): this one lives until the run has shut Ray down.
            self._release.wait()

        # Ray's notices that token authentication is on (it is, and stays on) and that it set no
        # SIGTERM handler (the run has its own) are no news to print
        quiet = [logging.getLogger(n) for n in ("ray._private.authentication", "ray._private.worker")]
        levels = [q.level for q in quiet]
        for q in quiet:
            q.setLevel(logging.ERROR)
        starting = threading.Thread(target=init, name="rmq-ray-init", daemon=True)
        starting.start()
        deadline = time.monotonic() + START_TIMEOUT
        while (
            starting.is_alive() and not ready.is_set() and not halt.is_set() and time.monotonic() < deadline
        ):
            starting.join(POLL)
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
        where = "a local Ray" if self.address == "local" else f"Ray at {redact(self.address)}"
        if not ready.is_set() and starting.is_alive():
            self._release.set()  # should Ray come up after all, its thread ends and it with it
            if halt.is_set():
                return False
            raise ConfigError(f"cannot start or reach {where} within {START_TIMEOUT:.0f} s")
        if failure:
            exc = failure[0]
            raise ConfigError(
                f"cannot start or reach {where}: {type(exc).__name__}: {redact(str(exc))[:300]}"
            )
        return True

    def _start(self, encoder: OnnxEncoder, output: str, distance: str, args: tuple) -> None:
        ray, options = self.ray, self.options
        self.output, self.distance, self.args = output, distance, args
        self._decode = ray.remote(num_cpus=1, max_retries=RETRIES)(decode_chunk)
        actor = ray.remote(
            num_cpus=1,
            num_gpus=options.gpus_per_encoder,
            max_restarts=RETRIES,
            max_task_retries=RETRIES,
        )(EncoderActor)
        try:
            graph = encoder.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read encoder {encoder.path}: {exc.strerror or exc}") from exc
        self.graph = [ray.put(graph)]  # held for the actors' restarts
        self.actors = [
            actor.remote(encoder.path.name, encoder.fingerprint, encoder.batch_size, options.gpus_per_encoder)
            for _ in range(options.encoders)
        ]

    def _check_room(self) -> None:
        """Refuse a Ray without a CPU for decoding beside the encoder actors, or (a local one)
        without the GPUs they take: the run would wait for ever. Warn where a cluster has fewer
        GPUs than asked (an autoscaler may add them) or fewer CPUs than encoders and decoders
        (fewer decode tasks run at once)."""
        have = self.ray.cluster_resources()
        cpus, gpus = have.get("CPU", 0), have.get("GPU", 0)
        encoders, per = self.options.encoders, self.options.gpus_per_encoder
        if cpus < encoders + 1:
            raise ConfigError(
                f"the Ray cluster has {cpus:g} CPUs: --encoders {encoders} take one each and leave "
                "none to decode images; lower --encoders, or add CPUs to the cluster first"
            )
        if gpus < encoders * per and self.address == "local":
            raise ConfigError(
                f"this machine's Ray has {gpus:g} GPUs, and --encoders {encoders} times "
                f"--gpus-per-encoder {per:g} take {encoders * per:g}: lower them, or give "
                "--ray-address of a cluster with GPUs"
            )
        if gpus < encoders * per:
            log.warning(
                "the Ray cluster has %g GPUs of the %g the encoders take: the run waits until an "
                "autoscaler adds them",
                gpus,
                encoders * per,
            )
        if cpus < self.options.slots:
            log.info("the Ray cluster has %g CPUs: fewer decode tasks than --decoders run at once", cpus)

    def dispatch(self, claim: ClaimedBatch, halt: threading.Event) -> InFlight | None:
        """Send a claimed batch's images out (blocks while ``decoders`` decode tasks are running);
        None if ``halt`` was set meanwhile (what was sent is cancelled)."""
        todo = claim.todo
        size = max(1, min(CHUNK, -(-len(todo) // max(self.options.encoders, self.options.decoders))))
        batch = InFlight(claim, [], [], [])
        for start in range(0, len(todo), size):
            points = todo[start : start + size]
            with self._lock:
                while len(self._decoding) >= self.options.decoders and not halt.is_set():
                    _, self._decoding = self.ray.wait(self._decoding, num_returns=1, timeout=POLL)
                if halt.is_set():
                    self.cancel(batch)
                    return None
                decoded = self._decode.remote(*self.args[:3], points, *self.args[3:])
                self._decoding.append(decoded)
                actor = self.actors[self._turn % len(self.actors)]
                self._turn += 1
            batch.starts.append(start)
            batch.decoding.append(decoded)
            ids = [point_id for point_id, _ in points]
            batch.results.append(actor.encode.remote(self.graph, self.output, self.distance, ids, decoded))
        return batch

    def gather(self, batch: InFlight, dim: int, halt: threading.Event) -> tuple[Prepared, Encoded] | None:
        """Wait for a batch's chunks: the batch as settle takes it (no pixels come back); None if
        ``halt`` was set first (its work is cancelled: the batch stays claimed, unwritten)."""
        waiting = list(batch.results)
        while waiting and not halt.is_set():
            _, waiting = self.ray.wait(waiting, num_returns=len(waiting), timeout=POLL)
        if waiting:
            self.cancel(batch)
            return None
        return assemble(batch.claim, batch.starts, self._get(batch.results), dim)

    def cancel(self, batch: InFlight) -> None:
        """Stop a batch's decode tasks (their processes: a fetch may be waiting on a slow server);
        its encoder calls end with them."""
        for ref in batch.decoding:
            self.ray.cancel(ref, force=True)

    def _get(self, refs: list[Any]) -> list[Any]:
        ray = self.ray
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RmqError):
                raise cause from None
            what = f"{type(cause).__name__}: {redact(str(cause))[:300]}" if cause else type(exc).__name__
            raise MigrationError(f"a Ray worker failed ({what}); {_UNWRITTEN}") from exc
        except ray.exceptions.RayError as exc:  # a worker or actor lost after Ray's retries
            text = redact(str(exc)).splitlines()[0][:300] if str(exc) else ""
            raise MigrationError(f"Ray lost a worker ({type(exc).__name__}: {text}); {_UNWRITTEN}") from exc

    def close(self) -> None:
        """Stop what the run still has on Ray (a stop leaves decode tasks running), and the
        local Ray this run started."""
        for ref in self._decoding:
            self.ray.cancel(ref, force=True)
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        if self.started:
            self.ray.shutdown()
            self._release.set()


def give_back_sigterm(handler: Any) -> None:
    """Give SIGTERM back to ``handler``, the process's own (``rmq migrate``'s: stop after the
    batch in flight). A Ray driver puts its crash reporter under SIGTERM: it prints a stack,
    calls the handler, and aborts the process 3 s later, in the middle of whatever batch was
    still being finished. Only the main thread can set a handler; elsewhere Ray's stays."""
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


class Stopped(Exception):
    """The run was stopped while Ray started."""


def sent(config: SourceConfig) -> SourceConfig:
    """``config`` as the Ray workers get it: ``$NAME`` in a header value read here, from the
    environment of ``rmq`` (as the local engine does), not from each worker's."""
    if not any("$" in value for _, value in config.headers):
        return config
    values = header_values(config.headers)
    return replace(config, headers=tuple((name, value.replace("$", "$$")) for name, value in values.items()))


class RayMigrator(Migrator):
    """A :class:`Migrator` whose batches are fetched, decoded and encoded on Ray: the prepare
    thread claims a batch and sends it out, the run's thread gathers it, the writer settles it."""

    def __init__(self, migrator: Migrator, engine: RayEngine) -> None:
        super().__init__(migrator.index, migrator.options, upkeep=migrator.upkeep, gate=migrator.gate)
        self.engine = engine

    @contextlib.contextmanager
    def _stages(self, halt: threading.Event) -> Iterator[Callable[[Sequence[PointId]], Any]]:
        self.halt = halt
        yield lambda batch: self.engine.dispatch(self._claim(batch), halt)

    def _finish(self, begun: Any) -> tuple[Prepared, Encoded] | None:
        return self.engine.gather(begun, self.dim, self.halt)


def ray_migrators(
    stack: contextlib.ExitStack, migrators: list[Migrator], options: RayOptions, halt: threading.Event
) -> list[Migrator] | None:
    """``migrators`` (one per shard) on one Ray engine, which ``stack`` closes; None if ``halt``
    was set while Ray started."""
    first = migrators[0]
    try:
        engine = RayEngine(
            options,
            first.encoder,
            output=first.output,
            distance=first.pair.distance,
            source=first.options.source,
            rule=first.pair.uri_rule,
            fetch_workers=first.options.fetch_workers,
            halt=halt,
        )
    except Stopped:
        return None
    stack.callback(engine.close)
    return [RayMigrator(m, engine) for m in migrators]


_UNWRITTEN = (
    "the batch was not written and no point was marked failed: run the same command again to continue"
)
