"""Sizing a backfill before it starts: :func:`plan` (``rmq plan``). It writes nothing.

A sample of the points still to migrate is timed through the migration's stages on this machine
(:mod:`rm_qdrant.evaluation.stagetimes`), the sizing model (:mod:`rm_qdrant.core.capacity`) turns
those times and the run's shape (workers, fetch threads, Ray encoders, GPUs) into each stage's
capacity, the bottleneck and the time for the rest, and the pair's collections give the storage
the rest adds. ``rmq probe``'s forecast of the served quality comes with it, kept nowhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

import numpy as np

from rm_qdrant.api.common import Counted, OnStep, check_callback, pair_source, path_text
from rm_qdrant.api.plan_report import PlanReport, nothing_left, plan_notes
from rm_qdrant.api.probing import probe
from rm_qdrant.core.capacity import DEFAULT_M, Setup, Shapes, capacity, storage
from rm_qdrant.core.planning import ERROR, points_to_move
from rm_qdrant.errors import ConfigError, EncoderError, ImageError, SourceError
from rm_qdrant.evaluation.probe import check_probe
from rm_qdrant.evaluation.stagetimes import WRITE_BATCH, SampleTimes, time_sample
from rm_qdrant.migration.loading import LIGHT_IMAGE, LOCAL_WORKERS, NETWORK_WORKERS, preflight
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.layouts import REMOVAL_GRACE, count_new, layout_of
from rm_qdrant.pair.outcome import MAX_WORKERS
from rm_qdrant.pair.record import PairRecord, load_pair, open_encoder
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store, Where
from rm_qdrant.store.points import every_id

CUDA = "CUDAExecutionProvider"


def plan(
    store: Store,
    name: str,
    *,
    sample: int = 64,
    workers: int = 1,
    fetch_workers: int | None = None,
    encoders: int | None = None,
    decoders: int | None = None,
    gpus: int | None = None,
    gpu_rate: float | None = None,
    cores: int | None = None,
    batch: int = 10_000,
    until: float | None = None,
    hnsw_m: int = DEFAULT_M,
    seed: int = 0,
    source: SourceConfig | None = None,
    encoder: str | os.PathLike[str] | None = None,
    forecast: bool = True,
    probe_sample: int = 500,
    on_step: OnStep | None = None,
) -> PlanReport:
    """Time a sample of the gallery on this machine and plan the rest: ``rmq plan``. Writes nothing.

    Args:
        store: the store holding the pair.
        name: the pair's name.
        sample: points still to migrate to time (fetch, decode, encode, write).
        workers: migration workers (``rmq migrate --workers``).
        fetch_workers: fetch threads a worker (or a Ray decode task) runs (default: as
            ``rmq migrate`` picks them, by where the sample's images are and how light).
        encoders: Ray encoder actors (``rmq migrate --engine ray --encoders``); None: the local engine.
        decoders: Ray decode tasks at once (default 2 with ``encoders``; given alone: Ray, 1 encoder).
        gpus: GPUs encoding (default: 1 where ONNX Runtime runs the encoder on CUDA here, else 0).
        gpu_rate: points a second one GPU embeds; needed with ``gpus`` unless CUDA runs here,
            where it is measured.
        cores: CPU cores decoding (and a CPU encode) share (default: this process's).
        batch: ``rmq migrate --batch``: against a server a paired run waits 1 s a batch per worker.
        until: plan the points up to this fraction of the gallery in new (None: all of them).
        hnsw_m: the collections' HNSW ``m``, for the index's storage.
        seed: seed of the samples.
        source: how images are fetched (default: the settings the pair recorded).
        encoder: the pair's encoder file, where it moved since ``init``.
        forecast: add ``rmq probe``'s forecast (on ``probe_sample`` points, kept nowhere).
        probe_sample: points the forecast re-embeds.
        on_step: told of each image read (:class:`Step`).

    Raises:
        CollectionNotFound: no pair of that name.
        ConfigError: the pair is not backfilling, its old collection is gone, or a bad option.
        SourceError: not one sampled image could be read.
        EncoderError: the encoder cannot be read.

    Example:
        >>> report = rm_qdrant.plan(store, "photos", workers=4)  # doctest: +SKIP
        >>> report.capacity.bottleneck.name, round(report.seconds)  # doctest: +SKIP
        ('encode', 5400)
    """
    _check_options(locals())  # the arguments: nothing else is bound yet
    pair = load_pair(store, name)
    check_probe(store, pair, doing="plan", needs="no old points to plan for")
    model = open_encoder(path_text(encoder), pair.encoder, name, "encoder", decode=pair.decode)
    ray = encoders is not None or decoders is not None
    gpus, rate_from = _gpus(gpus, gpu_rate, model.provider, encoders if ray else None, ray=ray)
    base = _counted(store, pair, until, hnsw_m)
    if base.left == 0:
        return base
    images = pair_source(pair, source)
    timed = _timed(store, pair, model, sample, seed=seed, batch=batch, source=images, on_step=on_step)
    setup = Setup(
        cores=cores or _cores(),
        workers=workers,
        fetch_threads=fetch_workers or _default_threads(timed, ray=ray),
        encoders=(encoders or 1) if ray else None,
        decoders=decoders or 2,
        gpus=gpus,
        gpu_rate=gpu_rate if gpu_rate is not None or not gpus else 1.0 / timed.times.encode,
        embedded=not store.capabilities.concurrent_search,
        light_images=timed.local and timed.times.fetch + timed.times.decode < LIGHT_IMAGE,
    )
    times = timed.times
    if store.capabilities.concurrent_search and not pair.single:  # Paired.settle's REMOVAL_GRACE
        times = replace(times, write=times.write + REMOVAL_GRACE / batch)
    shapes = _shapes(store, pair, hnsw_m, timed)
    outlook, note = _forecast(store, name, forecast, probe_sample, seed, images, path_text(encoder), on_step)
    return replace(
        base,
        sample=timed,
        setup=setup,
        capacity=capacity(times, setup),
        gpu_rate_from=rate_from,
        storage=storage(base.points, shapes),
        shapes=shapes,
        forecast=outlook,
        forecast_note=note,
        notes=plan_notes(store, pair, setup, timed, batch=batch, rate_from=rate_from),
    )


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _counted(store: Store, pair: PairRecord, until: float | None, m: int) -> PlanReport:
    """The plan's counts, before anything is timed: what is left, failed and in new."""
    active = layout_of(pair).old_where()
    left = store.count(pair.old_collection, active & Where(empty=(ERROR,)))
    failed = store.count(pair.old_collection, active) - left
    in_new = count_new(store, pair)
    points = min(left, points_to_move(old_active=left + failed, new=in_new, until=until, limit=None))
    shapes = _shapes(store, pair, m, None)
    return PlanReport(
        pair=pair.name,
        layout=_layout_name(pair),
        server=store.capabilities.concurrent_search,
        points=points,
        left=left,
        failed=failed,
        in_new=in_new,
        until=until,
        sample=None,
        setup=None,
        capacity=None,
        gpu_rate_from=None,
        storage=storage(points, shapes),
        shapes=shapes,
        forecast=None,
        forecast_note=f"pair {pair.name!r} has no point left to migrate: nothing to forecast",
        notes=(nothing_left(pair, failed),) if not left else (),
    )


#: The options :func:`plan` checks: name, lowest, highest (None: no bound), whether it may be None.
_BOUNDS = (
    ("sample", 1, None, False),
    ("workers", 1, MAX_WORKERS, False),
    ("fetch_workers", 1, MAX_WORKERS, True),
    ("encoders", 1, MAX_WORKERS, True),
    ("decoders", 1, MAX_WORKERS, True),
    ("gpus", 0, 4096, True),
    ("cores", 1, 1_000_000, True),
    ("batch", 1, None, False),
    ("hnsw_m", 2, 10_000, False),
    ("seed", 0, 2**32 - 1, False),
    ("probe_sample", 2, None, False),
)


def _check_options(given: dict[str, Any]) -> None:
    for key, low, high, optional in _BOUNDS:
        value = given[key]
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
            span = f"from {low} to {high}" if high else f">= {low}"
            raise ConfigError(f"{key} is a whole number {span}, got {value!r}")
    rate, until = given["gpu_rate"], given["until"]
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf
    ):
        raise ConfigError(
            f"gpu_rate (--gpu-rate) is points a second one GPU embeds, a number > 0, got {rate!r}"
        )
    if until is not None and (
        isinstance(until, bool) or not isinstance(until, int | float) or not 0 <= until <= 1
    ):
        raise ConfigError(f"until is a fraction from 0 to 1, got {until!r}")
    if not isinstance(given["forecast"], bool):
        raise ConfigError(f"forecast is True or False, got {given['forecast']!r}")
    check_callback(given["on_step"], "on_step", "one Step")


def _gpus(
    gpus: int | None, rate: float | None, provider: str, encoders: int | None, *, ray: bool
) -> tuple[int, str | None]:
    """The GPUs encoding, and where their rate comes from (``given`` or ``measured``)."""
    cuda = provider == CUDA
    count = gpus if gpus is not None else (1 if cuda else 0)
    if rate is not None and not count:
        raise ConfigError("--gpu-rate is the rate of one GPU: give --gpus N with it")
    if not count:
        return 0, None
    if rate is None and not cuda:
        raise ConfigError(
            f"--gpus {count} needs --gpu-rate R (points a second one GPU embeds, as your team measured "
            "it): ONNX Runtime has no CUDA provider here to measure one"
        )
    if not ray and count > 1:
        raise ConfigError(
            f"--gpus {count}: the local engine encodes on one GPU (one session a process); plan more "
            "GPUs with --encoders N (the Ray engine), or plan one --shard process and multiply"
        )
    if encoders is not None and count > encoders:
        raise ConfigError(
            f"--gpus {count} with --encoders {encoders}: each encoder actor's session runs on one GPU; "
            "give at least as many encoders as GPUs"
        )
    return count, "given" if rate is not None else "measured"


def _timed(
    store: Store,
    pair: PairRecord,
    model: OnnxEncoder,
    size: int,
    *,
    seed: int,
    batch: int,
    source: SourceConfig,
    on_step: OnStep | None,
) -> SampleTimes:
    """A random sample of the points still to migrate, timed through the migration's stages, after
    a pre-flight (as ``rmq probe`` and ``rmq migrate`` make): settings that read no image of a kind
    stop in one line before anything is timed."""
    preflight(store, pair, model, source)
    where = layout_of(pair).old_where() & Where(empty=(ERROR,))
    ids = every_id(store, pair.old_collection, where)
    rng = np.random.default_rng(seed)
    chosen = [ids[i] for i in sorted(rng.choice(len(ids), size=min(size, len(ids)), replace=False))]
    with Counted(on_step, "timing the sample", "images") as step:
        step.start(len(chosen))
        return time_sample(
            store,
            pair,
            model,
            chosen,
            source=source,
            write_batch=min(batch, WRITE_BATCH),
            on_image=step.advance,
        )


def _default_threads(timed: SampleTimes, *, ray: bool) -> int:
    """The fetch threads ``rmq migrate`` gives a batch of these images (loading.py's rule)."""
    if not timed.local:
        return NETWORK_WORKERS
    light = timed.times.fetch + timed.times.decode < LIGHT_IMAGE
    return 1 if light and not ray else LOCAL_WORKERS


def _shapes(store: Store, pair: PairRecord, m: int, timed: SampleTimes | None) -> Shapes:
    return Shapes(
        old_dim=store.collection(pair.old_collection, pair.vector).dim,
        new_dim=store.collection(pair.new_collection, pair.new_using).dim,
        payload=0.0 if timed is None else timed.payload,
        old_payload=0.0 if timed is None else timed.old_payload,
        carried=0.0 if timed is None else timed.carried,
        keep_old=pair.keep_old,
        single=pair.single,
        m=m,
    )


def _layout_name(pair: PairRecord) -> str:
    return pair.layout + (" --keep-old" if pair.keep_old and not pair.single else "")


def _forecast(
    store: Store,
    name: str,
    wanted: bool,
    size: int,
    seed: int,
    source: SourceConfig,
    encoder: str | None,
    on_step: OnStep | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """``rmq probe``'s forecast, kept nowhere, or None and why it could not run."""
    if not wanted:
        return None, "left out (--no-forecast)"
    try:
        report = probe(
            store, name, sample=size, seed=seed, source=source, encoder=encoder, on_step=on_step, cache=False
        )
    except (ConfigError, EncoderError, SourceError, ImageError) as exc:
        return None, f"rmq probe could not run: {exc}"
    curves = [
        {"mode": f.mode, "area": f.area, "start": f.recall[0], "end": f.recall[-1], "dips_at": f.dips()}
        for f in report.forecasts
    ]
    return {
        "sample": report.sample,
        "unreadable": report.unreadable,
        "order": report.order,
        "k": report.k,
        "curves": curves,
        "serve": report.advice.serve,
        "recommendation": report.recommendation,
    }, None
