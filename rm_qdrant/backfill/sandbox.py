"""A throwaway copy of a pair in a temporary embedded store, to measure without moving the real one.

``rmq eval`` migrates the pair it measures step by step; run on the live pair, that
would leave a production gallery fully migrated. It runs on a copy instead: both
collections (vectors, payloads, rm-qdrant's ranks and marks) and the pair record go
into an embedded store in a temporary folder, removed afterwards.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from rm_qdrant.backfill.pair import PairRecord, new_model_key, new_where, record_collection_model, save_pair
from rm_qdrant.core.merge import PointId
from rm_qdrant.store import Record, Store, Where, open_store

_PAGE = 2_000


def copy_collection(
    source: Store, target: Store, name: str, *, vector: str, on_points: Callable[[int], None] | None = None
) -> None:
    """Copy every point of ``name`` (its one vector ``vector`` and payload) into ``target``."""
    spec = source.collection(name, vector)
    target.create_collection(name, dim=spec.dim, distance=spec.distance, vector=vector)
    for field, kind in source.payload_indexes(name).items():
        target.create_index(name, field, kind)
    for page, rows in _pages(source, name, vector):
        if rows:
            vectors = np.stack([r.vector for r in rows])
            target.upsert(name, [r.id for r in rows], vectors, [r.payload for r in rows], vector=vector)
        if on_points is not None:
            on_points(len(page))


def _pages(
    source: Store, name: str, vector: str, where: Where | None = None
) -> Iterator[tuple[list[Record], list[Record]]]:
    """Each page of ``name`` with ``vector``: (every record, those that have the vector)."""
    offset: PointId | None = None
    while True:
        page, offset = source.scroll(
            name, limit=_PAGE, offset=offset, with_vectors=True, vector=vector, where=where
        )
        yield page, [r for r in page if r.vector is not None]
        if offset is None:
            return


@contextlib.contextmanager
def sandbox(
    store: Store, pair: PairRecord, *, on_points: Callable[[int], None] | None = None
) -> Iterator[tuple[Store, PairRecord]]:
    """A temporary embedded store holding a copy of ``pair``; yields (store, record)."""
    with tempfile.TemporaryDirectory(prefix="rmq-eval-") as folder, open_store(folder) as copy:
        for name in dict.fromkeys((pair.old_collection, pair.new_collection)):
            copy_collection(store, copy, name, vector=pair.vector, on_points=on_points)
        if pair.single:
            _copy_new_vectors(store, copy, pair)
        record = replace(pair, alias=None)
        save_pair(copy, record)
        record_collection_model(copy, new_model_key(pair), pair.encoder)
        yield copy, record


def _copy_new_vectors(source: Store, target: Store, pair: PairRecord) -> None:
    """One collection: its new vector too (points that hold only it are not copied)."""
    name, vector = pair.new_collection, pair.new_using
    spec = source.collection(name, vector)
    target.add_vector(name, vector, dim=spec.dim, distance=spec.distance)
    for _, rows in _pages(source, name, vector, new_where(pair)):
        if rows:
            target.set_vectors(name, [r.id for r in rows], np.stack([r.vector for r in rows]), vector=vector)
