"""What :func:`~rm_qdrant.api.planning.plan` reports (``rmq plan --json``), and the lines that say
what its figures assume."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rm_qdrant.core.capacity import Capacity, Setup, Shapes, Stage, Storage
from rm_qdrant.evaluation.stagetimes import SampleTimes
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.store import Store


@dataclass(frozen=True)
class PlanReport:
    """What :func:`plan` found (``rmq plan --json`` is :meth:`as_dict`).

    Attributes:
        pair: the pair's name.
        layout: ``paired``, ``paired --keep-old`` or ``single-collection``.
        server: the store is a server (its writes were not measured: see ``notes``).
        points: the points the plan covers (those left, or up to ``until``).
        left: points still to migrate (failed ones left out).
        failed: points whose last attempt failed, which a run skips unless ``--retry-failed``.
        in_new: points already migrated.
        until: the fraction the plan stops at (None: the whole gallery).
        sample: what timing the sample found (None: nothing left to time).
        setup: the run planned (None: nothing left).
        capacity: each stage's capacity and the bottleneck (None: nothing left).
        gpu_rate_from: ``measured`` (this machine's CUDA provider) or ``given`` (None: no GPU).
        storage: what the points add and free.
        shapes: what one point weighs.
        forecast: ``rmq probe``'s forecast, kept nowhere (None: see ``forecast_note``).
        forecast_note: why there is no forecast.
        notes: what the figures assume.
    """

    pair: str
    layout: str
    server: bool
    points: int
    left: int
    failed: int
    in_new: int
    until: float | None
    sample: SampleTimes | None
    setup: Setup | None
    capacity: Capacity | None
    gpu_rate_from: str | None
    storage: Storage
    shapes: Shapes
    forecast: dict[str, Any] | None
    forecast_note: str | None
    notes: tuple[str, ...]

    @property
    def seconds(self) -> float | None:
        """Seconds the planned points take at the bottleneck's pace (None: nothing left)."""
        return None if self.capacity is None else self.capacity.seconds(self.points)

    def as_dict(self) -> dict[str, Any]:
        run = self.capacity
        return {
            "pair": self.pair,
            "layout": self.layout,
            "server": self.server,
            "points": self.points,
            "left": self.left,
            "failed_skipped": self.failed,
            "in_new": self.in_new,
            "until": self.until,
            "sample": None if self.sample is None else _sample_dict(self.sample),
            "setup": None if self.setup is None else self._setup_dict(self.setup),
            "stages": [] if run is None else [_stage_dict(s) for s in run.stages],
            "bottleneck": None if run is None else run.bottleneck.name,
            "points_per_s": None if run is None else _finite(run.rate),
            "seconds": self.seconds,
            "storage": _storage_dict(self.storage, self.shapes),
            "forecast": self.forecast,
            "forecast_note": self.forecast_note,
            "notes": list(self.notes),
        }

    def _setup_dict(self, setup: Setup) -> dict[str, Any]:
        return {
            "engine": "ray" if setup.ray else "local",
            "cores": setup.cores,
            "workers": setup.workers,
            "fetch_threads": setup.fetch_threads,
            "encoders": setup.encoders,
            "decoders": setup.decoders if setup.ray else None,
            "gpus": setup.gpus,
            "gpu_rate": setup.gpu_rate,
            "gpu_rate_from": self.gpu_rate_from,
            "embedded_store": setup.embedded,
            "light_images": setup.light_images,
            "encoder_provider": None if self.sample is None else self.sample.provider,
        }


def nothing_left(pair: PairRecord, failed: int) -> str:
    failures = (
        f"; {failed} failed point(s) wait: 'rmq failures --name {pair.name}' lists them, "
        "'rmq migrate --retry-failed' tries them again"
        if failed
        else ""
    )
    ends = f"'rmq finalize --name {pair.name}' ends it"
    return f"pair {pair.name!r} has no point left to migrate{failures}; {ends}"


def plan_notes(
    store: Store, pair: PairRecord, setup: Setup, timed: SampleTimes, *, batch: int, rate_from: str | None
) -> tuple[str, ...]:
    """What the figures assume, in one line each."""
    waits = store.capabilities.concurrent_search and not pair.single  # Paired.settle's REMOVAL_GRACE
    notes = [
        f"write: a local estimate, the migration's own claim and settle of one batch of {timed.written:,} "
        "points (the sample's, repeated under new ids) in a scratch embedded store; a server's own write "
        "time was not measured"
        + (f" (the 1 s a paired run waits each --batch of {batch:,} is added)" if waits else ""),
        "not counted: start-up (ranking a new order, Ray's start), index builds, other work on the machine",
    ]
    if setup.gpus:
        how = (
            "measured here (ONNX Runtime's CUDA provider)"
            if rate_from == "measured"
            else "given, not measured"
        )
        notes.append(f"encode on {setup.gpus} GPU(s) at {setup.gpu_rate or 0:,.0f} points/s each: {how}")
    return tuple(notes)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _sample_dict(sample: SampleTimes) -> dict[str, Any]:
    unreadable = len(sample.failed)
    return {
        "drawn": sample.sampled,
        "timed": sample.timed,
        "unreadable": unreadable,
        "unreadable_share": unreadable / sample.sampled if sample.sampled else 0.0,
        "first_reason": sample.failed[0][1] if sample.failed else None,
        "local_files": sample.local,
    }


def _stage_dict(stage: Stage) -> dict[str, Any]:
    return {
        "name": stage.name,
        "ms_per_point": None if stage.seconds is None else stage.seconds * 1000,
        "points_per_s": _finite(stage.rate),
        "limit": stage.limit,
    }


def _storage_dict(grown: Storage, shapes: Shapes) -> dict[str, Any]:
    return {
        "points": grown.points,
        "new_vectors_bytes": grown.vectors,
        "hnsw_links_bytes": grown.links,
        "payload_copies_bytes": grown.payloads,
        "carried_vectors_bytes": grown.carried,
        "adds_bytes": grown.adds,
        "peak_bytes": grown.peak,
        "frees_during_bytes": grown.frees_during,
        "frees_at_finalize_bytes": grown.frees_at_finalize,
        "keep_old_holds_bytes": grown.keep_old_would_hold,
        "old_dim": shapes.old_dim,
        "new_dim": shapes.new_dim,
        "payload_copy_mean_bytes": shapes.payload,
        "hnsw_m": shapes.m,
    }
