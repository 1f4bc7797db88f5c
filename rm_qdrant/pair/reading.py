"""Reading one gallery item from its source, decoded as an encoder takes it: what the migration,
the probe, the checks and a search's re-rank read (one point's failure is a reason, not a raise)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.redact import redact
from rm_qdrant.errors import ImageError, SourceError
from rm_qdrant.models.encoder import PixelDecoder
from rm_qdrant.models.text import TextDecoder
from rm_qdrant.sources import ImageSource, shown

log = logging.getLogger(__name__)


def decode_item(encoder: PixelDecoder, data: Any, *, max_pixels: int) -> tuple[np.ndarray, bool]:
    """``data`` decoded as ``encoder`` takes it, and whether it was cut to fit (a text longer than
    the model's ``max_length``; an image never is)."""
    if isinstance(encoder, TextDecoder):
        return encoder.tokenise(data)
    return encoder.decode(data, max_pixels=max_pixels), False


def read_item(
    encoder: PixelDecoder, source: ImageSource, point_id: PointId, uri: Any, spent: list[float]
) -> tuple[np.ndarray | None, str, bool]:
    """The image at ``uri``, decoded as ``encoder`` takes it, or None and why it could not be read,
    and whether it was cut (:func:`decode_item`); adds the seconds its fetch and its decode took
    to ``spent`` ([fetch, decode])."""
    began = time.perf_counter()
    fetched = None
    try:
        data = source.fetch(uri)
        fetched = time.perf_counter()
        image, cut = decode_item(encoder, data, max_pixels=source.config.max_pixels)
        return image, "", cut
    except SourceError as exc:
        return None, str(exc), False
    except ImageError as exc:
        return None, f"{shown(uri)}: {exc}", False
    except Exception as exc:  # one point's fault must not stop a batch job: record it, go on
        log.warning("unexpected failure reading the image of point %s", point_id, exc_info=True)
        return None, f"unexpected {type(exc).__name__}: {redact(str(exc))[:300]}", False
    finally:
        ended = time.perf_counter()
        spent[0] += (ended if fetched is None else fetched) - began
        spent[1] += 0.0 if fetched is None else ended - fetched
