"""Fetching and decoding a batch of gallery images into one array, for the migration, probe and checks.

A batch is decoded straight into one preallocated ``(N, height, width, channels)``
uint8 array by a thread pool, a slice of points per task: no per-point tensor,
future or dictionary. Decoding (libjpeg-turbo or Pillow's C code) and file and
network reads release the GIL, so the threads run in parallel. One point's
failure is recorded with its reason and the batch goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ERROR
from rm_qdrant.core.redact import redact
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import SourceError, TooLarge
from rm_qdrant.models.encoder import OnnxEncoder, PixelDecoder
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.reading import read_item
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import ImageSource, SourceConfig, shown, source_kind
from rm_qdrant.store import Record, Store, Where

log = logging.getLogger(__name__)
#: Most points one task decodes: small enough for slow network fetches to spread over the pool.
_SLICE = 32
#: Threads a batch of local files gets when the caller leaves it to the source (``workers``
#: None) and its images are not known to be light (:class:`FetchPace`): a read from a disk
#: waits little, and more threads only contend for the GIL with the encoder and the store's
#: writes (measured: benchmarks/results/migration_throughput.md).
LOCAL_WORKERS = 2
#: Threads a batch gets where some image comes over the network (``workers`` None).
NETWORK_WORKERS = 8
#: Fetch-thread CPU seconds an image (read, decode, resize), as a migration's batch measures
#: it, below which local files are fetched by one thread. Each read and decode lets go of the
#: GIL and takes it back; for a light image those hand-offs with the writer and encoder
#: threads cost more than a second thread gains (and inflate the figure: in a run it is 1.1
#: to 2 times the image's cost alone). Measured on the 2-core machine with the ceiling
#: encoder, both layouts, three runs of benchmarks/fetch_threads.py (the last in
#: results/fetch_threads.md): one thread gains 26-57 % on 32x32 JPEGs, two gain 30-66 % on
#: 320x240; on 96x96 and 160x120 the two were within 17 % of each other, either way.
LIGHT_IMAGE = 500e-6


class FetchPace:
    """What the fetch threads of a migration's last batch spent, in CPU time an image: where
    the images are light, the next batch of local files gets one thread (:data:`LIGHT_IMAGE`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._images = 0
        self.per_image: float | None = None  # None: not measured yet

    def add(self, seconds: float, images: int) -> None:
        with self._lock:
            self._seconds += seconds
            self._images += images

    def batch_done(self) -> None:
        """Take the batch's figure as the pace (a batch of no image leaves it as it was)."""
        with self._lock:
            if self._images:
                self.per_image = self._seconds / self._images
            self._seconds, self._images = 0.0, 0

    def local_threads(self) -> int:
        light = self.per_image is not None and self.per_image < LIGHT_IMAGE
        return 1 if light else LOCAL_WORKERS


def _uri(rule: UriRule, point_id: PointId, payload: Mapping[str, Any]) -> tuple[Any, str]:
    """A stored point's image URI, or None and why it has none."""
    try:
        return rule.uri(point_id, payload), ""
    except SourceError as exc:
        return None, str(exc)
    except Exception as exc:  # one point's fault must not stop a batch job: record it, go on
        log.warning("unexpected failure reading the image uri of point %s", point_id, exc_info=True)
        return None, f"unexpected {type(exc).__name__}: {redact(str(exc))[:300]}"


def fetch_threads(
    source: ImageSource, uris: Sequence[Any], workers: int | None, pace: FetchPace | None = None
) -> int:
    """Threads to fetch ``uris`` with: ``workers`` if given, else by where the images are (and,
    for local files, by ``pace``: how light the run's images have been)."""
    return _threads(workers, workers is None and _all_local(source, uris), pace)


def _threads(workers: int | None, local: bool, pace: FetchPace | None) -> int:
    if workers is not None:
        return workers
    if not local:
        return NETWORK_WORKERS
    return LOCAL_WORKERS if pace is None else pace.local_threads()


def _all_local(source: ImageSource, uris: Sequence[Any]) -> bool:
    return all(source.is_local(u) for u in uris if u is not None)


@dataclass(frozen=True)
class LoadedBatch:
    """A batch's images: the decoded pixels of the points that could be read, and why the others could not.

    Attributes:
        rows: positions, in the batch given, of the points read, in order.
        pixels: their ``(len(rows), height, width, channels)`` uint8 images.
        failed: ``(position, reason)`` of the others.
        seconds: ``fetch`` and ``decode``: the wall time the batch took to load, shared between
            the two by the threads' time each took (:func:`stage_seconds`).
        retries: network fetches retried meanwhile.
        truncated: positions, in the batch given, of the points read whose text was cut at the
            model's ``max_length`` (a text encoder's; never an image).
    """

    rows: list[int]
    pixels: np.ndarray
    failed: list[tuple[int, str]]
    seconds: dict[str, float] = field(default_factory=dict)
    retries: int = 0
    truncated: list[int] = field(default_factory=list)


def stage_seconds(wall: float, fetch: float, decode: float) -> dict[str, float]:
    """``wall`` seconds of loading images shared between ``fetch`` and ``decode`` in the ratio of
    the threads' seconds in each (all ``fetch`` when no image was fetched): the two interleave,
    image by image, on several threads, so neither has a wall time of its own."""
    spent = fetch + decode
    share = fetch / spent if spent > 0 else 1.0
    return {"fetch": wall * share, "decode": wall * (1.0 - share)}


def load_batch(
    encoder: PixelDecoder,
    source: ImageSource,
    rule: UriRule,
    points: Sequence[tuple[PointId, Mapping[str, Any]]],
    pool: Executor,
    *,
    workers: int | None,
    on_image: Callable[[], None] | None = None,
    pace: FetchPace | None = None,
) -> LoadedBatch:
    """Fetch and decode the images of ``points`` (id, payload) with ``pool``, on ``workers`` of its
    threads (None: :func:`fetch_threads` picks by where the batch's images are, and by ``pace``,
    which gets this batch's fetch-thread CPU time)."""
    started, retried = time.perf_counter(), source.retries
    spans: list[list[float]] = []  # [fetch, decode] seconds of each task
    images = np.empty((len(points), *encoder.item_shape), encoder.item_dtype)
    errors: list[str | None] = [None] * len(points)
    cut = np.zeros(len(points), dtype=bool)
    uris: list[Any] = [None] * len(points)
    for row, (point_id, payload) in enumerate(points):  # pure and quick: the batch's at once
        uris[row], error = _uri(rule, point_id, payload)
        errors[row] = error or None
    local = workers is None and _all_local(source, uris)
    threads = _threads(workers, local, pace)
    paced = pace if local else None  # only what decides a thread count is measured
    size = max(1, min(_SLICE, len(points) // (4 * max(1, threads))))
    starts = iter(range(0, len(points), size))  # shared: each task takes the next slice not taken

    def load(start: int) -> None:
        began, decoded, spent = time.thread_time(), 0, [0.0, 0.0]
        spans.append(spent)
        for row in range(start, min(start + size, len(points))):
            if errors[row] is None:
                image, error, cut[row] = read_item(encoder, source, points[row][0], uris[row], spent)
                if image is None:
                    errors[row] = error or "the image could not be read"
                else:
                    images[row] = image
                    decoded += 1
            if on_image is not None:
                on_image()
        if paced is not None and decoded:  # a slice of failures alone says nothing of the images
            paced.add(time.thread_time() - began, decoded)

    def work(_: int) -> None:
        for start in starts:
            load(start)

    if paced is not None and paced.per_image is None:
        # the run's first batch of local files: one slice on this thread says how light they are
        load(next(starts, len(points)))
        paced.batch_done()
        threads = paced.local_threads()
    # ``threads`` tasks: a pool with more threads leaves the others idle (no GIL contention)
    for _ in pool.map(work, range(max(1, min(threads, len(points))))):
        pass
    if paced is not None:
        paced.batch_done()
    rows = [row for row, error in enumerate(errors) if error is None]
    failed = [(row, error) for row, error in enumerate(errors) if error is not None]
    fetch, decode = (sum(span[i] for span in spans) for i in (0, 1))
    seconds = stage_seconds(time.perf_counter() - started, fetch, decode)
    return LoadedBatch(
        rows,
        images if not failed else images[rows],
        failed,
        seconds,
        source.retries - retried,
        np.flatnonzero(cut).tolist(),
    )


def preflight(
    store: Store,
    pair: PairRecord,
    encoder: OnnxEncoder | None,
    source: SourceConfig,
    *,
    retry_failed: bool = False,
    sample: int = 5,
    stop: threading.Event | None = None,
) -> None:
    """Fetch a few images of each kind of source the run will meet (scheme and host: local
    files, ``http://cdn.example.com``, ``s3://bucket``) before a long step; refuse at once if
    none of a kind's can be fetched (``stop`` set: the fetches give up, and nothing is refused).

    A wrong source setting (a private network refused, a missing header, a wrong root, a
    wrong --uri-field) fails every point of a kind; found here it costs a few fetches and a
    read of the old points' payloads, not a ranking pass and a batch of points marked failed,
    whatever the run's order meets first. Each kind with at least ``sample`` points is tried
    (the first :data:`PREFLIGHT_KINDS` of them); a gallery with no such kind has its first
    ``sample`` points tried. What was fetched but does not decode (a broken file) says the
    settings work: that point fails on its own, as in any run.

    Raises:
        SourceError: not one of a kind's sampled images could be fetched.
    """
    if encoder is None or not pair.serves_old:
        return
    old = layout_of(pair).old_where()
    where = old if retry_failed else old & Where(empty=(ERROR,))  # the points the run will meet
    with ImageSource(source, stop=stop) as images, ThreadPoolExecutor(sample, "rmq-preflight") as pool:

        def check(kind: str, page: list[Record]) -> None:
            # side by side: a slow source costs one fetch deadline, not one per sampled point
            reasons = list(
                pool.map(
                    lambda p: _setting_error(encoder, images, pair.uri_rule, p.id, p.payload or {}), page
                )
            )
            if all(reasons) and not (stop is not None and stop.is_set()):  # a stop: the run ends at once
                raise SourceError(
                    f"none of {len(page)} sampled images could be read{kind}, so nothing was started and no "
                    f"point was marked failed: {reasons[0]} (the source options: see 'rmq status --name "
                    f"{pair.name}')"
                )

        first = _by_kind(
            store, pair, where, sample, lambda kind, page: check(f" from {_shown(kind)}", page), stop
        )
        if first:  # no kind filled a sample: a small gallery, or no point has a uri
            check("", first)


#: Source kinds a pre-flight tries at most (a gallery spread over many hosts: the run finds the rest).
PREFLIGHT_KINDS = 16
#: Kinds a pre-flight keeps samples of while it reads (bounds its memory on a gallery of many hosts).
_TRACKED_KINDS = 1024
#: Points a pre-flight reads a page (payloads only).
_PAGE = 1024


def _shown(kind: str) -> str:
    return "local files" if kind == "file" else kind


def _by_kind(
    store: Store,
    pair: PairRecord,
    where: Where,
    sample: int,
    check: Callable[[str, list[Record]], None],
    stop: threading.Event | None,
) -> list[Record]:
    """Read the payloads of the old points ``where`` selects; ``check`` each source kind's first
    ``sample`` points as soon as it has them. The first ``sample`` points if no kind was checked."""
    groups: dict[str, list[Record]] = {}
    first: list[Record] = []
    checked, offset = 0, None
    while checked < PREFLIGHT_KINDS and not (stop is not None and stop.is_set()):
        page, offset = store.scroll(pair.old_collection, limit=_PAGE, offset=offset, where=where)
        for record in page:
            if len(first) < sample:
                first.append(record)
            kind = source_kind(_uri(pair.uri_rule, record.id, record.payload or {})[0])
            if kind is None or (kind not in groups and len(groups) >= _TRACKED_KINDS):
                continue  # no uri: that point fails on its own; too many kinds: the run finds the rest
            group = groups.setdefault(kind, [])
            if len(group) < sample:
                group.append(record)
                if len(group) == sample and checked < PREFLIGHT_KINDS:
                    check(kind, group)
                    checked += 1
        if offset is None:
            break
    return [] if checked else first


def _setting_error(
    encoder: OnnxEncoder, images: ImageSource, rule: UriRule, point_id: PointId, payload: Mapping[str, Any]
) -> str:
    """Why the source settings could not read the point's image ("" if they could: a file that
    was fetched but does not decode is the file's fault, not the settings')."""
    try:
        uri = rule.uri(point_id, payload)
        encoder.decode(images.fetch(uri), max_pixels=images.config.max_pixels)
    except SourceError as exc:
        return str(exc)
    except TooLarge as exc:
        return f"{shown(uri)}: {exc}"
    except Exception:  # noqa: BLE001 - the migration records it on the point, as for any image
        return ""
    return ""
