"""Helpers of the promotion tests: a pair in each layout (test_rerank's), the offers a re-ranked
search makes, and what a user checks afterwards (every point served once, the migration and
the cutover complete)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rm_qdrant import DualIndex, OnnxEncoder, finalize, load_pair, migrate, status
from rm_qdrant.core.merge import PointId
from rm_qdrant.store import Store

LAYOUTS = ("paired", "keep-old", "single")
Offer = tuple[PointId, dict[str, Any], np.ndarray]


class Capture:
    """Stands in for a DualIndex's promoter: keeps what a search offers, writes nothing (the
    test then promotes it with :func:`~rm_qdrant.serving.promote.promote_batch` at the moment
    it chooses)."""

    def __init__(self) -> None:
        self.offers: list[Offer] = []

    def offer(self, offers: list[Offer]) -> None:
        self.offers.extend(offers)

    def close(self) -> None:
        pass


def offered(store: Store, query: str, k: int) -> list[Offer]:
    """What a re-ranked search with ``promote=True`` hands its promoter: the old hits among the
    first ``k`` it embedded, with the payload it read each image's URI from."""
    index = DualIndex.open(store, "p", exact=True)
    capture = Capture()
    index._promoter = capture  # type: ignore[assignment]
    hits = index.search(query, limit=k, rerank=k, promote=True)
    index.close()
    assert capture.offers and {o[0] for o in capture.offers} <= {h.id for h in hits}
    return capture.offers


def embedded(rm: OnnxEncoder, uris: list[str]) -> np.ndarray:
    """The new model's vectors of the images at ``uris`` (unit rows: compared by direction,
    as a cosine collection stores them)."""
    vectors = rm.encode(uris, ["new"])["new"]
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def unit(vector: Any) -> np.ndarray:
    row = np.asarray(vector, dtype=np.float64)
    return row / np.linalg.norm(row)


def served(store: Store, query: str, n: int) -> dict[PointId, Any]:
    """Every point a search serves, by id; a point served twice fails the test."""
    with DualIndex.open(store, "p", exact=True) as index:
        hits = index.search(query, limit=2 * n + 5)
    ids = [h.id for h in hits]
    assert len(ids) == len(set(ids)), "a point was served twice"
    return {h.id: h for h in hits}


def new_vector(store: Store, point_id: PointId) -> np.ndarray | None:
    """The new model's vector a point has in new (None: it has none there)."""
    pair = load_pair(store, "p")
    found = store.retrieve(pair.new_collection, [point_id], with_vectors=True, vector=pair.new_using)
    if not found or found[0].vector is None:
        return None
    return unit(found[0].vector)


def migrates_then_finalizes(store: Store, query: str, n: int) -> dict[PointId, Any]:
    """``rmq migrate`` to 100 %, then ``rmq finalize``; every point served once after. Returns
    the hits served from new alone."""
    migrate(store, "p", batch=7)
    report = status(store, "p")
    assert report.fraction == 1.0 and report.status.failed == 0
    finalize(store, "p")
    assert load_pair(store, "p").state == "finalized"
    hits = served(store, query, n)
    assert len(hits) == n and {h.source for h in hits.values()} == {"new"}
    return hits
