"""Do a model and its preprocessing reproduce the vectors a collection already stores?

``rmq model check`` asks it before anything moves (a stamped graph against the team's
production vectors); ``rmq switch-encoder`` asks it before a running pair changes
model (the vectors already in new must stay valid).

The comparison is the collection's own metric: a cosine collection compares
directions only (Qdrant stores cosine vectors normalised); a Euclid, Manhattan or
dot collection compares the vectors themselves, direction and norm, by their
relative error ``‖stored − model‖ / ‖stored‖``. A graph that L2-normalises what a
Euclid collection stores raw (norms 6 to 10) points the same way and still fails.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.inputspec import DEFAULT_DECODE
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, DimensionMismatch
from rm_qdrant.migration.loading import load_batch
from rm_qdrant.migration.ranking import read_all
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import list_pairs
from rm_qdrant.sources import ImageSource, SourceConfig
from rm_qdrant.store import CollectionSpec, Record, Store, Where
from rm_qdrant.store.base import resolve

#: The lowest cosine between a stored vector and the model's vector for the same image
#: that still counts as "the same output" (float noise across runtimes stays above it).
SAME_OUTPUT = 0.999
#: The largest relative error ``‖stored − model‖ / ‖stored‖`` that still counts as the same
#: output where norms matter: what the cosine threshold allows between unit vectors (≈ 0.045).
SAME_VECTOR = math.sqrt(2 * (1 - SAME_OUTPUT))
#: Distances whose results depend on the vectors' norms.
NORMS_MATTER = ("euclid", "manhattan", "dot")


@dataclass(frozen=True)
class Agreement:
    """Stored vectors against the model's vectors for the same images, under the collection's metric.

    Attributes:
        checked: points compared.
        unreadable: sampled points whose image could not be fetched or decoded (first reason kept).
        min, median: of the cosines.
        worst: the lowest few, as (id, cosine).
        metric: the collection's distance.
        error_max, error_median: of the relative errors ``‖stored − model‖ / ‖stored‖``.
        stored_norms, model_norms: (min, median) of the stored vectors' norms and of the model's.
        longest, window: a text model's longest compared document and window, in tokens.
    """

    checked: int
    unreadable: int
    min: float
    median: float
    worst: list[tuple[PointId, float]]
    first_error: str = ""
    metric: str = "cosine"
    error_max: float = 0.0
    error_median: float = 0.0
    stored_norms: tuple[float, float] = (0.0, 0.0)
    model_norms: tuple[float, float] = (0.0, 0.0)
    #: A text model's: tokens in the longest document compared, and the model's window. Below
    #: it, nothing compared was cut: another ``max_length`` would have matched these too.
    longest: int | None = None
    window: int | None = None

    def mismatch(self) -> str | None:
        """Why the model does not reproduce the stored vectors under the metric, or None if it does."""
        if self.metric not in NORMS_MATTER:
            if self.min >= SAME_OUTPUT:
                return None
            return f"cosine min {self.min:.4f}, median {self.median:.4f}"
        if self.error_max <= SAME_VECTOR:
            return None
        norms = f"its norms {_span(self.model_norms)}, the stored ones {_span(self.stored_norms)}"
        if self.min >= SAME_OUTPUT:  # the same directions: the scale is what changed
            how = "it L2-normalises them" if abs(self.model_norms[1] - 1) < 1e-3 else "it rescales them"
            return (
                f"{self.metric} distance: the same directions (cosine min {self.min:.4f}) but {norms}: "
                f"{how}, and {self.metric} distance depends on the vectors' scale"
            )
        return (
            f"{self.metric} distance: relative error max {self.error_max:.4f}, median "
            f"{self.error_median:.4f} (cosine min {self.min:.4f}; {norms})"
        )

    def describe(self) -> str:
        """One line of the measures, e.g. ``cosine min 1.00000, median 1.00000; norms ...``."""
        text = f"cosine min {self.min:.5f}, median {self.median:.5f}"
        if self.metric in NORMS_MATTER:
            text += f"; relative error max {self.error_max:.5f}, median {self.error_median:.5f}"
        return f"{text}; norms: stored {_span(self.stored_norms)}, model {_span(self.model_norms)}"


def _span(norms: tuple[float, float]) -> str:
    return f"min {norms[0]:.4g} median {norms[1]:.4g}"


@dataclass(frozen=True)
class Fidelity:
    """Fast decoding against exact on the same sampled images (``rmq model check --decode fast``).

    Attributes:
        exact: the exact-decoded vectors against the stored ones: whether the graph and its
            stamped preprocessing reproduce them (what decides the check).
        fast: the fast-decoded vectors against the stored ones.
        fast_vs_exact: the fast-decoded vectors against the same model's exact-decoded ones
            (the cost of fast decoding alone, whatever the stored vectors are).
    """

    exact: Agreement
    fast: Agreement
    fast_vs_exact: Agreement


def recorded_decode(store: Store, collection: str) -> tuple[str, str | None]:
    """How the pairs over ``collection`` (an old or new collection, or an alias of one) decode
    their images, and the pair that says so: ``("exact", None)`` where no pair covers it, or the
    pairs that do disagree."""
    name = resolve(store, collection)
    over = [p for p in list_pairs(store) if name in (p.old_collection, p.new_collection)]
    modes = {p.decode for p in over}
    if len(modes) != 1:
        return DEFAULT_DECODE, None
    return modes.pop(), over[0].name


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
    """Re-encode the images of up to ``sample`` random points (decoded as ``encoder`` decodes:
    :attr:`~rm_qdrant.models.encoder.PixelDecoder.decoding`) and compare with their stored vectors.

    Raises:
        DimensionMismatch: the model's output does not have the collection's size.
        ConfigError: no point could be compared (none stored, or no image readable).
    """
    output = output or encoder.info.gallery_output()
    spec, records, usable = _sampled(store, collection, encoder, output, vector, sample, seed, where)
    good, fresh, failed, longest = _encoded(encoder, output, usable, records, rule, source)
    stored = np.stack([r.vector for r in good])
    found = _compare(stored, fresh, [r.id for r in good], spec.distance, len(records), failed)
    window = getattr(encoder.info.input, "max_length", None)
    return dataclasses.replace(found, longest=longest, window=window) if window else found


def fidelity(
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
) -> Fidelity:
    """:func:`agreement` of the exact-decoded and of the fast-decoded images of the same sampled
    points, and the fast vectors against the exact ones: how much fast decoding changes this
    model's vectors of a team's own images (each image is fetched once for each mode).

    Raises:
        DimensionMismatch: the model's output does not have the collection's size.
        ConfigError: no point could be compared (none stored, or no image readable both ways).
    """
    output = output or encoder.info.gallery_output()
    spec, records, usable = _sampled(store, collection, encoder, output, vector, sample, seed, None)
    exact, fast = encoder.decoding_as("exact"), encoder.decoding_as("fast")
    good, exact_rows, failed, _ = _encoded(exact, output, usable, records, rule, source)
    both, fast_rows, _, _ = _encoded(fast, output, good, records, rule, source)
    kept = {r.id for r in both}
    exact_rows = exact_rows[[i for i, r in enumerate(good) if r.id in kept]]
    stored, ids = np.stack([r.vector for r in both]), [r.id for r in both]
    sampled = len(records)
    return Fidelity(
        exact=_compare(stored, exact_rows, ids, spec.distance, sampled, failed),
        fast=_compare(stored, fast_rows, ids, spec.distance, sampled, failed),
        fast_vs_exact=_compare(exact_rows, fast_rows, ids, spec.distance, sampled, failed),
    )


def _sampled(
    store: Store,
    collection: str,
    encoder: OnnxEncoder,
    output: str,
    vector: str | None,
    sample: int,
    seed: int,
    where: Where | None,
) -> tuple[CollectionSpec, list[Record], list[Record]]:
    """The collection's vector, the sampled points, and those of them that have the vector."""
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
    return spec, records, [r for r in records if r.vector is not None]


def _encoded(
    encoder: OnnxEncoder,
    output: str,
    usable: list[Record],
    records: list[Record],
    rule: UriRule | None,
    source: SourceConfig | None,
) -> tuple[list[Record], np.ndarray, list[tuple[int, str]], int | None]:
    """The points of ``usable`` whose image could be read, the model's vectors of them (decoded
    as ``encoder`` decodes), why the others could not, and a text model's longest document read
    in tokens (None for images)."""
    with ImageSource(source or SourceConfig()) as images, ThreadPoolExecutor(8) as pool:
        points = [(r.id, r.payload) for r in usable]
        loaded = load_batch(encoder, images, rule or UriRule(), points, pool, workers=8)
    good = [usable[row] for row in loaded.rows]
    if not good:
        first = loaded.failed[0][1] if loaded.failed else "-"
        items = "documents" if encoder.info.modality == "text" else "images"
        raise ConfigError(f"none of the {len(records)} sampled {items} could be read (first: {first})")
    longest = int(loaded.pixels[:, 1].sum(axis=1).max()) if encoder.info.modality == "text" else None
    return good, encoder.run_pixels(loaded.pixels, [output])[output], loaded.failed, longest


def _compare(
    stored: np.ndarray,
    fresh: np.ndarray,
    ids: list[PointId],
    metric: str,
    sampled: int,
    failed: list[tuple[int, str]],
) -> Agreement:
    stored, fresh = stored.astype(np.float64), fresh.astype(np.float64)
    stored_norms, model_norms = np.linalg.norm(stored, axis=1), np.linalg.norm(fresh, axis=1)
    cosines = np.einsum("ij,ij->i", stored, fresh) / np.maximum(stored_norms * model_norms, 1e-12)
    errors = np.linalg.norm(stored - fresh, axis=1) / np.maximum(stored_norms, 1e-12)
    worst = sorted(zip(ids, cosines.tolist(), strict=True), key=lambda t: t[1])[:5]
    return Agreement(
        checked=len(ids),
        unreadable=sampled - len(ids),
        min=float(cosines.min()),
        median=float(np.median(cosines)),
        worst=worst,
        first_error=failed[0][1] if failed else "",
        metric=metric,
        error_max=float(errors.max()),
        error_median=float(np.median(errors)),
        stored_norms=(float(stored_norms.min()), float(np.median(stored_norms))),
        model_norms=(float(model_norms.min()), float(np.median(model_norms))),
    )
