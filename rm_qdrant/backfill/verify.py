"""Do a model and its preprocessing reproduce the vectors a collection already stores?

``rmq model check`` asks it before anything moves (a stamped graph against the team's
production vectors); ``rmq switch-encoder`` asks it before a running pair changes
model (the vectors already in new must stay valid).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rm_qdrant.backfill.loading import load_batch
from rm_qdrant.backfill.ranking import read_all
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, DimensionMismatch
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.sources import ImageSource, SourceConfig
from rm_qdrant.store import Store, Where
from rm_qdrant.store.base import resolve


@dataclass(frozen=True)
class Agreement:
    """Cosine between stored vectors and the model's vectors for the same images.

    Attributes:
        checked: points compared.
        unreadable: sampled points whose image could not be fetched or decoded (first reason kept).
        min, median: of the cosines.
        worst: the lowest few, as (id, cosine).
    """

    checked: int
    unreadable: int
    min: float
    median: float
    worst: list[tuple[PointId, float]]
    first_error: str = ""


def agreement(
    store: Store,
    collection: str,
    encoder: OnnxEncoder,
    *,
    output: str | None = None,
    vector: str | None = None,
    rule: UriRule | None = None,
    sample: int = 200,
    seed: int = 0,
    source: SourceConfig | None = None,
    where: Where | None = None,
) -> Agreement:
    """Re-encode the images of up to ``sample`` random points and compare with their stored vectors.

    Raises:
        DimensionMismatch: the model's output does not have the collection's size.
        ConfigError: no point could be compared (none stored, or no image readable).
    """
    output = output or encoder.info.gallery_output()
    collection = resolve(store, collection)
    spec = store.collection(collection, vector)
    if spec.multivector:
        raise ConfigError(
            f"vector {spec.vector!r} of {collection!r} is a multivector: not one vector per image"
        )
    if encoder.info.outputs[output] != spec.dim:
        raise DimensionMismatch(
            f"{encoder.path} output {output!r} makes {encoder.info.outputs[output]}-d vectors, "
            f"collection {collection!r} holds {spec.dim}-d ones"
        )
    ids, _, _ = read_all(store, collection, where or Where(), False, with_payloads=False)
    if not ids:
        raise ConfigError(f"collection {collection!r} holds no points to compare with")
    rng = np.random.default_rng(seed)
    chosen = [ids[i] for i in sorted(rng.choice(len(ids), size=min(sample, len(ids)), replace=False))]
    records = store.retrieve(collection, chosen, with_vectors=True, vector=spec.vector)
    usable = [r for r in records if r.vector is not None]
    with ImageSource(source or SourceConfig()) as images, ThreadPoolExecutor(8) as pool:
        points = [(r.id, r.payload) for r in usable]
        loaded = load_batch(encoder, images, rule or UriRule(), points, pool, workers=8)
    good = [usable[row] for row in loaded.rows]
    if not good:
        first = loaded.failed[0][1] if loaded.failed else "-"
        raise ConfigError(f"none of the {len(records)} sampled images could be read (first: {first})")
    fresh = encoder.run_pixels(loaded.pixels, [output])[output]
    stored = np.stack([r.vector for r in good])
    cosines = _cosine(stored, fresh)
    worst = sorted(zip([r.id for r in good], cosines.tolist(), strict=True), key=lambda t: t[1])[:5]
    return Agreement(
        checked=len(good),
        unreadable=len(records) - len(good),
        min=float(cosines.min()),
        median=float(np.median(cosines)),
        worst=worst,
        first_error=loaded.failed[0][1] if loaded.failed else "",
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.einsum("ij,ij->i", a, b) / np.maximum(norms, 1e-12)
