"""The sizing model of ``rmq plan``: what each stage of a migration can move per second, which
stage bounds the run, how long the rest takes, and what the rest adds to storage.

Pure: measured seconds and counts in, figures out (no store, no clock, no file).

**Time.** A migration moves each point through four stages (migration/migrator.py): *fetch* (the
image's bytes), *decode* (its pixels, as the graph takes them), *encode* (the ONNX graph) and
*write* (the store's work for the point: the batch's claim read, the insert into new, the
read-backs, the retire from old). The stages overlap, batch after batch, so a run goes at the
pace of its slowest stage. Each stage's capacity, in points a second:

- **fetch** waits on I/O: each fetch thread has one request in flight, so it scales with the
  threads: ``streams / fetch_s``, where ``streams`` is ``workers x fetch_threads`` (the local
  engine) or ``decoders x fetch_threads`` (Ray's decode tasks);
- **decode** is CPU work on those threads: ``min(streams, cores) / decode_s``;
- **encode**: on GPUs, ``gpus x gpu_rate`` (points a second one GPU embeds); on the CPU, the
  local engine's one ONNX Runtime session (its threads over every core, shared by the workers)
  ``1 / encode_s``, or Ray's encoder actors, a one-thread session each,
  ``min(encoders, cores) / encode_core_s``;
- **cpu**: decode, a CPU encode and the embedded store's work share the cores:
  ``cores / (decode_s + encode_cpu_s + write_s)``, where ``encode_cpu_s`` is the CPU seconds
  (all its threads) the local engine's session spends a point, or ``encode_core_s`` on Ray, and
  nothing where GPUs encode; ``write_s`` only where the store runs in the process;
- **write** is serial per worker (a worker settles one batch at a time): ``workers / write_s``
  against a server; the embedded store holds Python's lock while it writes, so its workers'
  writes do not add up: ``1 / write_s``;
- **process**: what the one ``rmq`` process does holding Python's lock, which no thread count
  spreads: ``1 / lock_s``, where ``lock_s`` is ``write_s`` on the embedded store (it runs in the
  process), plus ``fetch_s + decode_s`` where the images are light (the local engine's rule,
  migration/loading.py: below 500 µs a read and decode take and give back the lock more than they
  work), nothing of them on Ray (its decode tasks are other processes); shown where the images are
  light (without them it is the write stage). Stages of that process overlap only outside the
  lock, so on the embedded store with small images this is the bound.

The rest takes ``points / min(capacities)``. Not counted: start-up (ranking a new order, Ray's
start), index builds, and a server's own write time (``write_s`` is what the caller measured).

**Storage.** Raw bytes, as float32 vectors, HNSW links and payload JSON; a store's own overheads
(ids, write-ahead log, payload indexes, segments) come on top. An HNSW graph at ``m`` keeps
``2m`` links of 4 bytes at level 0 and ``m`` at each level above, which a point reaches with
probability ``m**-level``: ``4 x (2m + m / (m - 1))`` bytes a point (132 at ``m = 16``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Bytes of one float32 value, and of one HNSW link (a point offset).
FLOAT_BYTES = LINK_BYTES = 4
#: Qdrant's default HNSW ``m`` (rm-qdrant creates collections with it).
DEFAULT_M = 16


@dataclass(frozen=True)
class StageTimes:
    """Measured seconds one point spends in each stage, on one thread.

    Attributes:
        fetch: wall seconds to fetch one image's bytes.
        decode: CPU seconds to decode and resize one image.
        encode: seconds a point of the encoder as the local engine runs it (one session, all
            its threads; on the GPU where it runs there).
        encode_core: seconds a point of a one-thread CPU session (a Ray CPU encoder actor).
        write: seconds a point of the store's work.
        encode_cpu: CPU seconds a point (all its threads) of the local engine's session; None:
            ``encode_core``'s.
    """

    fetch: float
    decode: float
    encode: float
    encode_core: float
    write: float
    encode_cpu: float | None = None


@dataclass(frozen=True)
class Setup:
    """How the rest of the gallery would migrate.

    Attributes:
        cores: CPU cores decoding (and encoding, on the CPU) share.
        workers: migration workers (``rmq migrate --workers``).
        fetch_threads: fetch threads per worker (local engine) or per decode task (Ray).
        encoders: Ray encoder actors (None: the local engine).
        decoders: Ray decode tasks at once (the Ray engine only).
        gpus: GPUs encoding (0: the CPU encodes).
        gpu_rate: points a second one GPU embeds (with ``gpus``).
        embedded: the store runs in this process (qdrant-edge), holding Python's lock while it
            writes; False: a server, which takes the workers' writes side by side.
        light_images: the images are light (see the module's docstring): their fetch and decode
            hold the process's lock as much as they work.
    """

    cores: int
    workers: int = 1
    fetch_threads: int = 1
    encoders: int | None = None
    decoders: int = 2
    gpus: int = 0
    gpu_rate: float | None = None
    embedded: bool = True
    light_images: bool = False

    @property
    def ray(self) -> bool:
        return self.encoders is not None

    @property
    def streams(self) -> int:
        """Fetches in flight at once."""
        return (self.decoders if self.ray else self.workers) * self.fetch_threads


@dataclass(frozen=True)
class Stage:
    """One stage's capacity: ``seconds`` a point on one thread (None for the shared cores),
    ``rate`` points a second, and what sets it."""

    name: str
    seconds: float | None
    rate: float
    limit: str


@dataclass(frozen=True)
class Capacity:
    """Each stage's capacity and the run's pace (the slowest stage's)."""

    stages: tuple[Stage, ...]

    @property
    def bottleneck(self) -> Stage:
        return min(self.stages, key=lambda s: s.rate)

    @property
    def rate(self) -> float:
        return self.bottleneck.rate

    def seconds(self, points: int) -> float:
        """Seconds ``points`` take at the run's pace."""
        return 0.0 if points <= 0 else points / self.rate


def _rate(parallel: float, seconds: float) -> float:
    """Points a second of ``parallel`` lanes taking ``seconds`` a point (no time: no bound)."""
    return math.inf if seconds <= 0 else parallel / seconds


def capacity(times: StageTimes, setup: Setup) -> Capacity:
    """Each stage's capacity under ``setup`` (see the module's docstring for the model).

    Raises:
        ValueError: a setup that cannot run (no core, no worker, GPUs without a rate).

    Example:
        >>> times = StageTimes(fetch=0.004, decode=0.002, encode=0.004, encode_core=0.005, write=0.001)
        >>> run = capacity(times, Setup(cores=2, workers=1, fetch_threads=2))
        >>> run.bottleneck.name, round(run.rate)
        ('encode', 250)
    """
    _check(setup)
    streams = setup.streams
    gpu = setup.gpus > 0
    cpu_seconds = times.decode + _encode_cpu(times, setup) + (times.write if setup.embedded else 0.0)
    writers = 1 if setup.embedded else setup.workers
    stages = (
        Stage("fetch", times.fetch, _rate(streams, times.fetch), f"{_streams(setup)} (I/O)"),
        Stage(
            "decode",
            times.decode,
            _rate(min(streams, setup.cores), times.decode),
            f"{min(streams, setup.cores)} decoding thread(s) of {setup.cores} core(s)",
        ),
        _encode(times, setup),
        Stage(
            "cpu",
            None,
            _rate(setup.cores, cpu_seconds),
            f"decode{'' if gpu else ', encode'}{' and the store' if setup.embedded else ''} share "
            f"{setup.cores} core(s)",
        ),
        Stage("write", times.write, _rate(writers, times.write), _writers(setup)),
    )
    return Capacity(stages + _process(times, setup))


def _check(setup: Setup) -> None:
    for name in ("cores", "workers", "fetch_threads", "decoders"):
        if getattr(setup, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(setup, name)}")
    if setup.encoders is not None and setup.encoders < 1:
        raise ValueError(f"encoders must be at least 1, got {setup.encoders}")
    if setup.gpus < 0 or (setup.gpus and not (setup.gpu_rate or 0) > 0):
        raise ValueError("GPUs need a positive rate (points a second one GPU embeds)")


def _encode_cpu(times: StageTimes, setup: Setup) -> float:
    """The CPU seconds a point's encode costs the cores (none on GPUs)."""
    if setup.gpus:
        return 0.0
    if setup.ray or times.encode_cpu is None:
        return times.encode_core
    return times.encode_cpu


def _encode(times: StageTimes, setup: Setup) -> Stage:
    if setup.gpus:
        rate = setup.gpus * (setup.gpu_rate or 0.0)
        shown = f"{setup.gpus} GPU(s) x {setup.gpu_rate or 0:,.0f} points/s"
        return Stage("encode", 1 / (setup.gpu_rate or 1.0), rate, shown)
    if setup.encoders is not None:
        actors = min(setup.encoders, setup.cores)
        return Stage(
            "encode",
            times.encode_core,
            _rate(actors, times.encode_core),
            f"{actors} one-thread CPU encoder(s)",
        )
    return Stage("encode", times.encode, _rate(1, times.encode), "one CPU session over every core")


def _process(times: StageTimes, setup: Setup) -> tuple[Stage, ...]:
    """The stage of what the ``rmq`` process does under Python's lock, where it bounds more than
    the write stage does (light images on the local engine)."""
    if not (setup.light_images and not setup.ray):
        return ()
    parts = [("the embedded store's writes", times.write)] if setup.embedded else []
    parts.append(("light images' fetch and decode", times.fetch + times.decode))
    lock = sum(seconds for _, seconds in parts)
    held = " and ".join(what for what, _ in parts)
    return (Stage("process", lock, _rate(1, lock), f"one process's Python lock: {held}"),)


def _streams(setup: Setup) -> str:
    who = f"{setup.decoders} decode task(s)" if setup.ray else f"{setup.workers} worker(s)"
    return f"{who} x {setup.fetch_threads} fetch thread(s)"


def _writers(setup: Setup) -> str:
    if setup.embedded:
        return "the embedded store writes one batch at a time"
    return f"{setup.workers} worker(s), each writing one batch at a time"


# --- storage ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """What one point weighs, in the pair's collections.

    Attributes:
        old_dim: the old model's vector size.
        new_dim: the new model's.
        payload: bytes of the payload a migrated point's copy carries in new (0: one collection,
            where no payload is copied).
        old_payload: bytes of a point's payload in old.
        carried: bytes of the other vectors a copy carries to new (0: none, or one collection).
        keep_old: migrated points stay in old until ``finalize`` (``--keep-old``).
        single: one collection, where the new vector joins each point.
        m: the collections' HNSW ``m``.
    """

    old_dim: int
    new_dim: int
    payload: float = 0.0
    old_payload: float = 0.0
    carried: float = 0.0
    keep_old: bool = False
    single: bool = False
    m: int = DEFAULT_M


def link_bytes(m: int) -> float:
    """Bytes of HNSW links a point costs at ``m`` (see the module's docstring).

    >>> round(link_bytes(16))
    132
    """
    if m < 2:
        raise ValueError(f"HNSW m must be at least 2, got {m}")
    return LINK_BYTES * (2 * m + m / (m - 1))


@dataclass(frozen=True)
class Storage:
    """What migrating ``points`` adds and frees, in bytes.

    Attributes:
        points: the points it covers.
        vectors: the new vectors.
        links: their HNSW links.
        payloads: the payload copies in new (0 in one collection).
        carried: the other vectors copied to new.
        old_point: bytes one point holds in old now (old vector, its links, and, in two
            collections, its payload and other vectors).
        frees_during: what old releases as the points leave it (two collections without
            ``--keep-old``; a server frees it as its optimizer vacuums old).
        frees_at_finalize: what ``finalize --drop-old`` releases of these points beyond that
            (``--keep-old``: the kept copies; one collection: the old vector and its links).
        keep_old_would_hold: what ``--keep-old`` keeps in old until ``finalize`` (the kept copies,
            whatever this pair's layout is).
    """

    points: int
    vectors: float
    links: float
    payloads: float
    carried: float
    old_point: float
    frees_during: float
    frees_at_finalize: float
    keep_old_would_hold: float

    @property
    def adds(self) -> float:
        """What the new half grows by."""
        return self.vectors + self.links + self.payloads + self.carried

    @property
    def peak(self) -> float:
        """The most the store holds beyond today: everything added, before old frees anything
        (a deleted point's vector stays in old until old is vacuumed or dropped)."""
        return self.adds


def storage(points: int, shapes: Shapes) -> Storage:
    """What migrating ``points`` more adds and frees (see the module's docstring).

    Example:
        >>> grown = storage(1000, Shapes(old_dim=64, new_dim=128, payload=100, old_payload=90))
        >>> grown.vectors, round(grown.links), grown.payloads, round(grown.frees_during)
        (512000, 132267, 100000, 478267)
    """
    if points < 0:
        raise ValueError(f"points must be 0 or more, got {points}")
    links = link_bytes(shapes.m)
    old_vector = shapes.old_dim * FLOAT_BYTES + links
    payloads = 0.0 if shapes.single else points * shapes.payload
    carried = 0.0 if shapes.single else points * shapes.carried
    old_point = old_vector + (0.0 if shapes.single else shapes.old_payload + shapes.carried)
    leaves = not shapes.single and not shapes.keep_old
    return Storage(
        points=points,
        vectors=points * shapes.new_dim * FLOAT_BYTES,
        links=points * links,
        payloads=payloads,
        carried=carried,
        old_point=old_point,
        frees_during=points * old_point if leaves else 0.0,
        frees_at_finalize=0.0 if leaves else points * (old_vector if shapes.single else old_point),
        keep_old_would_hold=0.0 if shapes.single else points * old_point,
    )
