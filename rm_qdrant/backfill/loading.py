"""Fetching and decoding a batch of gallery images into one array, for the migration, probe and checks.

A batch is decoded straight into one preallocated ``(N, height, width, channels)``
uint8 array by a thread pool, a slice of points per task: no per-point tensor,
future or dictionary. Decoding (libjpeg-turbo or Pillow's C code) and file and
network reads release the GIL, so the threads run in parallel. One point's
failure is recorded with its reason and the batch goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.redact import redact
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ImageError, SourceError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.sources import ImageSource, shown

log = logging.getLogger(__name__)
#: Most points one task decodes: small enough for slow network fetches to spread over the pool.
_SLICE = 32


def load_pixels(
    encoder: OnnxEncoder, source: ImageSource, rule: UriRule, point_id: PointId, payload: Mapping[str, Any]
) -> tuple[np.ndarray | None, str]:
    """A stored point's image, decoded as ``encoder`` takes it, or None and why it could not be read."""
    try:
        uri = rule.uri(point_id, payload)
        return encoder.decode(source.fetch(uri), max_pixels=source.config.max_pixels), ""
    except SourceError as exc:
        return None, str(exc)
    except ImageError as exc:
        return None, f"{shown(uri)}: {exc}"
    except Exception as exc:  # one point's fault must not stop a batch job: record it, go on
        log.warning("unexpected failure reading the image of point %s", point_id, exc_info=True)
        return None, f"unexpected {type(exc).__name__}: {redact(str(exc))[:300]}"


@dataclass(frozen=True)
class LoadedBatch:
    """A batch's images: the decoded pixels of the points that could be read, and why the others could not.

    Attributes:
        rows: positions, in the batch given, of the points read, in order.
        pixels: their ``(len(rows), height, width, channels)`` uint8 images.
        failed: ``(position, reason)`` of the others.
    """

    rows: list[int]
    pixels: np.ndarray
    failed: list[tuple[int, str]]


def load_batch(
    encoder: OnnxEncoder,
    source: ImageSource,
    rule: UriRule,
    points: Sequence[tuple[PointId, Mapping[str, Any]]],
    pool: Executor,
    *,
    workers: int,
    on_image: Callable[[], None] | None = None,
) -> LoadedBatch:
    """Fetch and decode the images of ``points`` (id, payload) with ``pool`` (``workers`` threads)."""
    spec = encoder.info.input
    images = np.empty((len(points), spec.height, spec.width, spec.channels), np.uint8)
    errors: list[str | None] = [None] * len(points)
    size = max(1, min(_SLICE, len(points) // (4 * max(1, workers))))

    def load(start: int) -> None:
        for row in range(start, min(start + size, len(points))):
            image, error = load_pixels(encoder, source, rule, *points[row])
            if image is None:
                errors[row] = error or "the image could not be read"
            else:
                images[row] = image
            if on_image is not None:
                on_image()

    for _ in pool.map(load, range(0, len(points), size)):
        pass
    rows = [row for row, error in enumerate(errors) if error is None]
    failed = [(row, error) for row, error in enumerate(errors) if error is not None]
    return LoadedBatch(rows, images if not failed else images[rows], failed)
