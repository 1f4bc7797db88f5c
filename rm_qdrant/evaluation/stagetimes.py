"""Timing a sample of a pair's gallery through a migration's stages, for ``rmq plan``; nothing is
written to the pair's store.

Each sampled point's image is fetched through the pair's source rules and decoded as the pair
decodes, one point at a time, the two steps timed apart. The images read are then encoded as the
migration encodes them (its session over the sample, the median of three runs after a warm-up,
with the CPU time its threads spend), and once more by a one-thread CPU session (what a Ray CPU
encoder actor runs). Last, the sample's old points go into a scratch embedded store in a
temporary folder, with collections shaped as the pair's (vector names, sizes, distances, payload
indexes), repeated under new ids to one batch of :data:`WRITE_BATCH` points at most (or ``rmq
migrate --batch``), and the migration's own layout claims and settles them there (insert into
new, read back, retire from old): that is the write time. A server's own write time is not
measured.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rm_qdrant.core.capacity import FLOAT_BYTES, StageTimes
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import new_payload
from rm_qdrant.core.redact import redact
from rm_qdrant.errors import ConfigError, ImageError, SourceError
from rm_qdrant.evaluation.sandbox import scratch_store
from rm_qdrant.migration.loading import LoadedBatch
from rm_qdrant.migration.migrator import encode_loaded
from rm_qdrant.migration.ranking import RANKING_INDEXES
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import load_encoder
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.outcome import ClaimedBatch, Encoded, uncopyable
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import ImageSource, SourceConfig, shown
from rm_qdrant.store import Record, Store
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)
#: Points the write is timed on at most, as one batch: a batch's fixed costs (a call, a filter, an
#: index lookup) weigh on a few points; a migration's batches hold thousands (rmq migrate --batch).
WRITE_BATCH = 1024
#: Timed runs of the encoder over the sample, whose median is taken (one run on a busy machine
#: can catch a moment of other work).
_ENCODE_RUNS = 3
#: File suffixes whose first image is read once before the timing, at most.
_WARM_KINDS = 8


@dataclass(frozen=True)
class SampleTimes:
    """What timing a sample found.

    Attributes:
        sampled: points drawn.
        timed: points read and encoded, which the times are the means of.
        failed: ``(id, reason)`` of the others, which a migration would record as failed.
        times: mean seconds a point, each stage (see :class:`~rm_qdrant.core.capacity.StageTimes`).
        provider: the ONNX Runtime provider the migration's session runs on.
        local: every sampled image is a local file.
        payload: mean bytes (compact JSON) of the payload a migrated copy carries in new.
        old_payload: mean bytes of the sampled points' payloads in old.
        carried: mean bytes of the other vectors a copy carries to new.
        written: points the write was timed on, as one batch (the sample's, repeated).
    """

    sampled: int
    timed: int
    failed: tuple[tuple[PointId, str], ...]
    times: StageTimes
    provider: str
    local: bool
    payload: float
    old_payload: float
    carried: float
    written: int


@dataclass(frozen=True)
class _Loaded:
    """The sample's images read: their points, pixels, and the seconds fetching and decoding took."""

    records: list[Record]
    pixels: np.ndarray
    failed: list[tuple[PointId, str]]
    fetch: float
    decode: float
    local: bool


def time_sample(
    store: Store,
    pair: PairRecord,
    encoder: OnnxEncoder,
    ids: Sequence[PointId],
    *,
    source: SourceConfig,
    write_batch: int = WRITE_BATCH,
    on_image: Callable[[], None] | None = None,
) -> SampleTimes:
    """Time the points ``ids`` of ``pair``'s old collection through fetch, decode, encode and write
    (the write as one batch of ``write_batch`` points: the sample's, repeated under new ids).

    Raises:
        SourceError: not one sampled image could be read (the first reason is named).
        ConfigError: the encoder's file changed since it was loaded.
    """
    layout = layout_of(pair)
    carried = layout.migration_carries(store)
    records = store.retrieve(
        pair.old_collection, list(ids), with_vectors=True, vector=pair.vector, others=carried
    )
    records = [r for r in records if r.vector is not None]
    refused = uncopyable({r.id: r.payload for r in records}) if layout.copies_payload else {}
    loaded = _load(encoder, pair, [r for r in records if r.id not in refused], source, on_image)
    failed = list(refused.items()) + loaded.failed
    if not loaded.records:
        first = failed[0][1] if failed else "no sampled point holds an old vector"
        raise SourceError(
            f"none of the {len(ids)} sampled images of pair {pair.name!r} could be read, so nothing was "
            f"timed: {first} (a migration would record each as failed)"
        )
    output = encoder.info.gallery_output()
    kept = [r.id for r in loaded.records]
    encoded, encode, encode_cpu = _timed_encode(encoder, output, pair.distance, kept, loaded.pixels)
    encode_core = _core_seconds(encoder, output, loaded.pixels)
    failed += encoded.failed
    good = [r for r in loaded.records if r.id in set(encoded.ids)]
    written = max(write_batch, len(good)) if good else 0
    write = _time_writes(store, pair, good, encoded.vectors, carried, size=written) if good else 0.0
    n = len(loaded.records)
    return SampleTimes(
        sampled=len(ids),
        timed=n,
        failed=tuple(failed),
        times=StageTimes(loaded.fetch / n, loaded.decode / n, encode, encode_core, write, encode_cpu),
        provider=encoder.provider,
        local=loaded.local,
        payload=_mean(len(_json(new_payload(r.payload))) for r in good) if layout.copies_payload else 0.0,
        old_payload=_mean(len(_json(r.payload)) for r in loaded.records),
        carried=_mean(sum(_vector_bytes(v) for v in r.others.values()) for r in good),
        written=written,
    )


def _load(
    encoder: OnnxEncoder,
    pair: PairRecord,
    records: list[Record],
    config: SourceConfig,
    on_image: Callable[[], None] | None,
) -> _Loaded:
    """Fetch and decode each point's image on this thread, timing the two apart (wall seconds to
    fetch, CPU seconds to decode); failures are kept with their reason, out of the times."""
    pixels = np.empty((len(records), *encoder.item_shape), encoder.item_dtype)
    read: list[Record] = []
    failed: list[tuple[PointId, str]] = []
    fetch = decode = 0.0
    local = True
    with ImageSource(config) as source:
        _warm_up(encoder, pair, records, source)
        for record in records:
            uri: Any = None
            try:
                uri = pair.uri_rule.uri(record.id, record.payload)
                local = local and source.is_local(uri)
                started = time.perf_counter()
                data = source.fetch(uri)
                fetched, began = time.perf_counter(), time.thread_time()
                image = encoder.decode(data, max_pixels=config.max_pixels)
                decode += time.thread_time() - began
                fetch += fetched - started
                pixels[len(read)] = image
                read.append(record)
            except Exception as exc:  # noqa: BLE001 - the migration records any image's fault on its point
                failed.append((record.id, _reason(exc, uri)))
            if on_image is not None:
                on_image()
    return _Loaded(read, pixels[: len(read)], failed, fetch, decode, local)


def _warm_up(encoder: OnnxEncoder, pair: PairRecord, records: list[Record], source: ImageSource) -> None:
    """Read one image of each file suffix once, untimed: a process's first fetch and decode of a
    format load its codec and open a connection, which a migration pays once, not a point."""
    firsts: dict[str, Any] = {}
    for record in records:
        try:
            uri = pair.uri_rule.uri(record.id, record.payload)
        except SourceError:
            continue  # the timed pass records it
        firsts.setdefault(str(uri).rpartition(".")[2].lower()[:8], uri)
        if len(firsts) >= _WARM_KINDS:
            break
    for uri in firsts.values():
        try:
            encoder.decode(source.fetch(uri), max_pixels=source.config.max_pixels)
        except Exception:  # noqa: BLE001 - the timed pass finds and records the point's fault
            continue


def _reason(exc: Exception, uri: Any) -> str:
    """Why a point's image could not be read, as the migration words it (loading.py)."""
    if isinstance(exc, SourceError):
        return str(exc)
    if isinstance(exc, ImageError):
        return f"{shown(uri)}: {exc}"
    log.warning("unexpected failure reading a sampled image", exc_info=True)
    return f"unexpected {type(exc).__name__}: {redact(str(exc))[:300]}"


def _timed_encode(
    encoder: OnnxEncoder, output: str, distance: str, ids: list[PointId], pixels: np.ndarray
) -> tuple[Encoded, float, float]:
    """The sample encoded as the migration encodes a batch, the wall seconds a point it took (the
    median of :data:`_ENCODE_RUNS` runs, after a warm-up call: a session's first run allocates),
    and the CPU seconds a point its threads spent (the process's, over the runs)."""
    encoder.run_pixels(pixels[:1], [output])
    seconds = []
    cpu = time.process_time()
    for _ in range(_ENCODE_RUNS):
        started = time.perf_counter()
        encoded = encode_loaded(encoder, output, distance, ids, pixels)
        seconds.append(time.perf_counter() - started)
    cpu = (time.process_time() - cpu) / _ENCODE_RUNS
    return encoded, statistics.median(seconds) / len(ids), cpu / len(ids)


def _core_seconds(encoder: OnnxEncoder, output: str, pixels: np.ndarray) -> float:
    """Seconds a point of a one-thread CPU session of the same graph (a Ray CPU encoder actor's):
    the core-seconds a CPU encode costs."""
    one = load_encoder(
        encoder.path,
        batch_size=encoder.batch_size,
        threads=1,
        providers=["CPUExecutionProvider"],
        decode=encoder.decoding,
    )
    if one.fingerprint != encoder.fingerprint:
        raise ConfigError(f"the encoder {encoder.path} changed on disk while it was timed: run again")
    one.run_pixels(pixels[:1], [output])
    seconds = []
    for _ in range(_ENCODE_RUNS):
        started = time.perf_counter()
        one.run_pixels(pixels, [output])
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) / len(pixels)


def _time_writes(
    store: Store,
    pair: PairRecord,
    records: list[Record],
    vectors: np.ndarray,
    carried: tuple[str, ...],
    *,
    size: int,
) -> float:
    """Seconds a point of the migration's own claim and settle of one batch of ``size`` points
    (``records`` with their new ``vectors``, repeated under new ids), in a scratch embedded store
    shaped as the pair's collections."""
    layout = layout_of(pair)
    others = _carried_specs(store, pair, carried)
    records, vectors = _repeated(records, vectors, size)
    ids = [r.id for r in records]
    with scratch_store() as scratch:
        _shape_like(store, scratch, pair, others)
        old = np.stack([np.asarray(r.vector, dtype=np.float32) for r in records])
        rows = [r.others for r in records] if carried else None
        scratch.upsert(
            pair.old_collection, ids, old, [r.payload for r in records], vector=pair.vector, others=rows
        )
        dim = scratch.collection(pair.new_collection, pair.new_using).dim
        started = time.perf_counter()
        claimed = layout.claim(scratch, ids, carried)
        payloads = {r.id: r.payload for r in claimed.present}
        todo = [(i, payloads[i]) for i in ids if i in payloads]
        batch = ClaimedBatch(
            [i for i, _ in todo],
            payloads,
            [],
            todo,
            0,
            claimed.token,
            {r.id: r.others for r in claimed.present} if carried else {},
        )
        prepared = batch.prepared(LoadedBatch(list(range(len(todo))), np.empty((0,), np.uint8), []))
        layout.settle(scratch, prepared, Encoded([i for i, _ in todo], vectors, []), dim)
        return (time.perf_counter() - started) / len(ids)


def _repeated(records: list[Record], vectors: np.ndarray, size: int) -> tuple[list[Record], np.ndarray]:
    """``records`` and their ``vectors`` repeated to ``size`` rows, the copies under new ids of the
    same kind (integers past the largest, or UUIDs)."""
    rows = [i % len(records) for i in range(size)]
    start = max((r.id for r in records if isinstance(r.id, int)), default=0) + 1
    numbered = all(isinstance(r.id, int) for r in records) and start + size < 2**63
    copies = [
        records[row]
        if i < len(records)
        else replace(records[row], id=start + i if numbered else str(uuid.uuid4()))
        for i, row in enumerate(rows)
    ]
    return copies, vectors[rows]


def _carried_specs(store: Store, pair: PairRecord, carried: tuple[str, ...]) -> tuple[OtherVector, ...]:
    """The configs of the other vectors a migrated copy carries (two collections)."""
    if not carried:
        return ()
    extra = store.collection(pair.new_collection, pair.vector).extra
    return tuple(o for o in extra if o.name in carried)


def _shape_like(store: Store, scratch: Store, pair: PairRecord, others: tuple[OtherVector, ...]) -> None:
    """Create the pair's collections in ``scratch``, empty: the same vectors (names, sizes,
    distances) and payload indexes, and the ranking's indexes on old (as ``rmq migrate`` makes)."""
    old = store.collection(pair.old_collection, pair.vector)
    new = store.collection(pair.new_collection, pair.new_using)
    scratch.create_collection(
        pair.old_collection, dim=old.dim, distance=old.distance, vector=pair.vector, others=others
    )
    if pair.single:
        scratch.add_vector(pair.new_collection, pair.new_using, dim=new.dim, distance=new.distance)
    else:
        scratch.create_collection(
            pair.new_collection, dim=new.dim, distance=new.distance, vector=pair.vector, others=others
        )
    for name in dict.fromkeys((pair.old_collection, pair.new_collection)):
        for field, kind in store.payload_indexes(name).items():
            scratch.create_index(name, field, kind)
    for field, kind in RANKING_INDEXES.items():
        scratch.create_index(pair.old_collection, field, kind)


def _json(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)


def _vector_bytes(value: Any) -> int:
    """Bytes of one stored vector: float32 values (a sparse one: an index and a value each)."""
    indices = getattr(value, "indices", None)
    if indices is not None:
        return len(indices) * 2 * FLOAT_BYTES
    return int(np.asarray(value).size) * FLOAT_BYTES


def _mean(values: Any) -> float:
    items = list(values)
    return float(sum(items) / len(items)) if items else 0.0
