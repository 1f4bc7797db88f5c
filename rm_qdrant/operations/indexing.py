"""Loading an image folder into a collection with one model: how a team's existing
deployment is reproduced for trials (``rmq index``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rm_qdrant.errors import ConfigError, DimensionMismatch, ImageError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import ModelRef, check_collection_model, record_collection_model
from rm_qdrant.store import Store

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
_ID_NAMESPACE = uuid.UUID("0c9b2d57-3f7e-4c1a-b6d2-8e4f5a6b7c8d")


@dataclass(frozen=True)
class ImageItem:
    """One gallery image: where it is, and its class label if the layout gives one."""

    uri: str
    label: str | None = None

    @property
    def point_id(self) -> str:
        """A stable id derived from the URI, so indexing the same folder twice is idempotent."""
        return str(uuid.uuid5(_ID_NAMESPACE, self.uri))


@dataclass(frozen=True)
class IndexReport:
    """What ``index_images`` did: points written, and images skipped with the reason."""

    indexed: int
    failed: list[tuple[str, str]] = field(default_factory=list)


def scan_image_folder(root: str | Path) -> list[ImageItem]:
    """List ``ROOT/<label>/<file>`` images (the ImageFolder layout), sorted by path.

    Raises:
        ConfigError: the folder does not exist or holds no images.
    """
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"image folder {base} does not exist")
    items = [
        ImageItem(str(path.resolve()), path.parent.name)
        for path in sorted(base.glob("*/*"))
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
    ]
    if not items:
        raise ConfigError(f"no images in {base}: expected {base}/<label>/<image file>")
    return items


def _batches(items: Sequence[ImageItem], size: int) -> Iterator[Sequence[ImageItem]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def index_images(
    store: Store,
    collection: str,
    encoder: OnnxEncoder,
    items: Sequence[ImageItem],
    *,
    batch_size: int = 256,
    on_batch: Callable[[int], None] | None = None,
    vector: str | None = None,
) -> IndexReport:
    """Embed images with ``encoder`` and upsert them into ``collection``.

    The collection is created (with the encoder's dimension and distance, cosine for a
    graph that states none) if it does not exist, and the encoder is recorded as the
    model of its vectors. An image that cannot be read is skipped and reported; the
    others are written.
    When the encoder has a ``scores`` output, each point's payload gets
    ``old_confidence`` (what the ``confidence`` backfill order reads). ``vector`` names the
    vector written where the collection has several (a single-collection pair's old one).
    """
    output = encoder.info.gallery_output()
    dim = encoder.info.outputs[output]
    if store.has_collection(collection):
        spec = store.collection(collection, vector)
        vector = spec.vector
        if spec.dim != dim:
            raise DimensionMismatch(
                f"collection {collection!r} holds {spec.dim}-d vectors, {encoder.path} makes {dim}-d"
            )
        check_collection_model(store, collection, encoder)
    else:
        distance = encoder.info.distance or "cosine"  # a graph of any distance: the default's
        store.create_collection(collection, dim=dim, distance=distance, vector=vector or "")
    record_collection_model(store, collection, ModelRef.of(encoder, output))
    wanted = [output] + (["scores"] if "scores" in encoder.info.outputs else [])
    indexed, failed = 0, []
    for chunk in _batches(items, batch_size):
        good, tensors = [], []
        for item in chunk:
            try:
                tensors.append(encoder.preprocess([item.uri]))
                good.append(item)
            except ImageError as exc:
                failed.append((item.uri, str(exc)))
                log.warning("skipping %s", exc)
        if good:
            out = encoder.run(np.concatenate(tensors), wanted)
            payloads = [{"uri": i.uri, "label": i.label} for i in good]
            if "scores" in out:
                for body, score in zip(payloads, out["scores"].max(axis=1).tolist(), strict=True):
                    body["old_confidence"] = score
            store.upsert(collection, [i.point_id for i in good], out[output], payloads, vector=vector or "")
            indexed += len(good)
        if on_batch is not None:
            on_batch(len(chunk))
    return IndexReport(indexed, failed)
