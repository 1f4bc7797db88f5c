"""DualIndex: serve a gallery split between an old and a new collection as one index."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from qdrant_client import models

from rm_qdrant.core.merge import Hit, PointId, distance_line
from rm_qdrant.core.planning import user_bodies
from rm_qdrant.core.rerank import PAIR_DEFAULT, Rerank
from rm_qdrant.errors import ConfigError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.images import ImageLike, as_batch
from rm_qdrant.pair.layouts import Layout, Write, layout_of
from rm_qdrant.pair.record import PairRecord, load_pair, open_encoder
from rm_qdrant.serving.demand import DemandLog
from rm_qdrant.serving.observing import SearchObserver, Watch, observed
from rm_qdrant.serving.pair_points import PairPoints, id_list
from rm_qdrant.serving.pair_search import PairSearch
from rm_qdrant.serving.promote import Promoter
from rm_qdrant.serving.rerank import Reranker
from rm_qdrant.serving.reranking import PairRerank
from rm_qdrant.serving.search_options import (
    PayloadSelection,
    SearchOptions,
    with_vectors_of,
)
from rm_qdrant.serving.status import PairStatus, pair_status
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Filter, Store
from rm_qdrant.store.base import as_floats
from rm_qdrant.store.bounds import check_hits, check_payloads
from rm_qdrant.store.filters import as_where
from rm_qdrant.store.ids import normalize_ids
from rm_qdrant.store.vectors import OtherVector, VectorRows, check_others

log = logging.getLogger(__name__)


class DualIndex(PairSearch, PairRerank, PairPoints):
    """The serving object: one search over the old and the new collection of a pair.

    Open it with :meth:`open`. Queries are encoded once per collection side: in
    ``rm`` mode one pass of the pair's graph gives both the ``new`` vector (for
    the new collection) and the ``rev`` vector (for the old one); in ``naive``
    mode the new and the old model each encode the query.

    Example:
        >>> from rm_qdrant import DualIndex, open_store
        >>> index = DualIndex.open(open_store("./rmq-data"), "photos")  # doctest: +SKIP
        >>> for hit in index.search("query.jpg", limit=5):  # doctest: +SKIP
        ...     print(hit.id, round(hit.distance, 3), hit.source, hit.payload.get("uri"))
    """

    def __init__(
        self,
        store: Store,
        pair: PairRecord,
        encoder: OnnxEncoder | None = None,
        old_encoder: OnnxEncoder | None = None,
        *,
        exact: bool = False,
        hnsw_ef: int | None = None,
        metrics: SearchObserver | None = None,
        source: SourceConfig | None = None,
        demand: bool = False,
    ) -> None:
        if pair.state == "dropping":  # its new collection or vector may be half gone
            raise ConfigError(
                f"pair {pair.name!r} is being dropped: 'rmq drop-pair {pair.name}' finishes it; "
                f"search {pair.old_collection!r} directly"
            )
        if pair.mode == "naive" and pair.serves_new and encoder is not None and old_encoder is None:
            raise ConfigError(f"pair {pair.name!r} is in naive mode and needs its old encoder")
        self.store = store
        self._reranker: Reranker | None = None  # made at the first re-ranked search
        self.pair = pair  # and self.layout
        # The pair's decode mode: an encoder given that decodes otherwise is left as it is (a copy,
        # sharing its session, decodes the pair's way)
        self.encoder = None if encoder is None else encoder.decoding_as(pair.decode)
        self.old_encoder = None if old_encoder is None else old_encoder.decoding_as(pair.decode)
        self.exact, self.hnsw_ef = exact, hnsw_ef
        self._watch = None if metrics is None else Watch(metrics)  # see observing.py
        self._new_dim = store.collection(pair.new_collection, pair.new_using).dim
        self._old_dim = self.layout.old_dim(store)
        self._carried: dict[str, OtherVector] | None = None  # the other vectors, read at the first write
        self.source = source  # how a re-rank reads items (None: the pair's recorded settings)
        self._promoter: Promoter | None = None  # made at the first promoting search
        self._closed = False
        #: Counts the points searches return from old, for ``rmq migrate --order demand``.
        self.demand = DemandLog(store, pair) if demand and pair.state == "backfilling" else None
        # One collection: both searches run as one query (two, in order, where that fails).
        self._two_queries = not self.layout.one_query
        self._pool = (
            ThreadPoolExecutor(max_workers=2)
            if store.capabilities.concurrent_search and self._two_queries
            else None
        )

    @property
    def pair(self) -> PairRecord:
        """The pair record as this index last read it."""
        return self._pair

    @pair.setter
    def pair(self, record: PairRecord) -> None:
        self._pair, self._to_distance = record, distance_line(record.distance)
        self.layout: Layout = layout_of(record)  # what the index asks, always of this record
        if self._reranker is not None:
            self._reranker.pair = record

    @classmethod
    def open(
        cls,
        store: Store,
        name: str,
        *,
        encoder: OnnxEncoder | str | None = None,
        old_encoder: OnnxEncoder | str | None = None,
        exact: bool = False,
        hnsw_ef: int | None = None,
        metrics: SearchObserver | None = None,
        source: SourceConfig | None = None,
        demand: bool = False,
    ) -> DualIndex:
        """Open a pair by name, loading its encoders from the paths it recorded unless given.

        ``exact`` scans every point instead of using the HNSW index; ``hnsw_ef``
        sets the index's search breadth (Qdrant's default when None). ``metrics``: a
        :class:`~rm_qdrant.SearchMetrics` that each search is observed by (seconds in all and
        by side, the merged hits by the side they came from); None: no observation, no cost.

        Raises:
            CollectionNotFound: no such pair, or one of its collections is gone.
            ConfigError: an encoder is not the model the pair was created with.
            EncoderError: an encoder file cannot be loaded.
        """
        pair = load_pair(store, name)
        new_side = open_encoder(encoder, pair.encoder, name, "encoder", decode=pair.decode)
        old_side = None
        # While a rollback is possible, the old model also embeds a user's writes.
        keeps_old = layout_of(pair).keeps_writes_in_old
        queries_old = pair.mode == "naive" or pair.state == "rolled_back" or keeps_old
        if pair.old_encoder is not None and (queries_old or old_encoder is not None):
            old_side = open_encoder(old_encoder, pair.old_encoder, name, "old encoder", decode=pair.decode)
        return cls(
            store,
            pair,
            new_side,
            old_side,
            exact=exact,
            hnsw_ef=hnsw_ef,
            metrics=metrics,
            source=source,
            demand=demand,
        )

    # -- queries ---------------------------------------------------------------

    def query_vectors(self, images: ImageLike | Sequence[ImageLike]) -> tuple[np.ndarray, np.ndarray]:
        """Encode query images as ``(new_vectors, old_vectors)``, one row per image."""
        batch, _ = as_batch(images)
        encoder = self._encoder()
        gallery = encoder.info.gallery_output()
        if self.pair.state == "rolled_back":  # the old model serves alone again
            return np.zeros((len(batch), self._new_dim), np.float32), self._old_queries(batch, query=True)
        if self.pair.mode == "rm":
            out = encoder.encode(batch, [gallery, "rev"], query=True)
            return out[gallery], out["rev"]
        return encoder.encode(batch, [gallery], query=True)[gallery], self._old_queries(batch, query=True)

    def _old_queries(self, batch: list[ImageLike], *, query: bool = False) -> np.ndarray:
        old_model = self.old_encoder
        if old_model is None:  # __init__ refuses a naive pair with an encoder but no old one
            raise ConfigError(
                f"pair {self.pair.name!r} needs its old model to encode queries for the old collection "
                "(rmq rollback --old-encoder records it)"
            )
        output = old_model.info.gallery_output()
        return old_model.encode(batch, [output], query=query)[output]

    def _encoder(self) -> OnnxEncoder:
        if self.encoder is None:
            raise ConfigError("this DualIndex has no encoder: pass vectors (search_vectors, upsert_vectors)")
        return self.encoder

    @observed(batch=False)
    def search(
        self, image: ImageLike, limit: int = 10, filter: Filter | None = None, **options: Any
    ) -> list[Hit]:
        """The ``limit`` closest gallery points to one query image, closest first.

        ``options`` are :meth:`search_vectors_batch`'s (``score_threshold``, ``offset``, ...).
        """
        return self.search_batch([image], limit=limit, filter=filter, **options)[0]

    @observed(batch=True)
    def search_batch(
        self, images: Sequence[ImageLike], limit: int = 10, filter: Filter | None = None, **options: Any
    ) -> list[list[Hit]]:
        """:meth:`search` for several images, encoded in one batch."""
        new, old = self.query_vectors(images)
        return self.search_vectors_batch(new, old, limit=limit, filter=filter, **options)

    @observed(batch=False)
    def search_vectors(
        self, new_vector: np.ndarray | None, old_vector: np.ndarray | None, *, limit: int = 10, **options: Any
    ) -> list[Hit]:
        """Search with ready-made vectors: ``new_vector`` for new, ``old_vector`` for old (None
        where the pair does not search that side: old once finalized, new once rolled back)."""
        new = None if new_vector is None else as_floats(new_vector, "new_vector").reshape(1, -1)
        old = None if old_vector is None else as_floats(old_vector, "old_vector").reshape(1, -1)
        return self.search_vectors_batch(new, old, limit=limit, **options)[0]

    @observed(batch=True)
    def search_vectors_batch(
        self,
        new_vectors: np.ndarray | None,
        old_vectors: np.ndarray | None,
        *,
        limit: int = 10,
        filter: Filter | None = None,
        score_threshold: float | None = None,
        offset: int = 0,
        with_payload: PayloadSelection = True,
        with_vectors: bool = False,
        exact: bool | None = None,
        hnsw_ef: int | None = None,
        search_params: models.SearchParams | Mapping[str, Any] | None = None,
        timeout: int | None = None,
        consistency: models.ReadConsistency | None = None,
        rerank: Rerank | int | str | None = PAIR_DEFAULT,
        promote: bool | None = None,
    ) -> list[list[Hit]]:
        """Search the serving collections for each row and merge each pair of lists by distance
        (equal distances by id: one order for the list and every page of it).

        While the pair backfills, both collections are searched; once finalized,
        only new (``old_vectors`` may be None); once rolled back, only old.

        Args:
            filter: a qdrant-client ``models.Filter``, or a dict (see :data:`rm_qdrant.store.Filter`).
            score_threshold: Qdrant's, in the pair's score: cosine and dot keep ``score >= t``,
                euclid and manhattan ``score <= t`` (compared as the merged distance).
            offset: skip the first ``offset`` merged hits. Equal distances are ordered by id
                (integers ascending, then UUIDs), so pages neither repeat nor skip a point, ties
                included (a page ending inside a tie reads the whole tie: see :meth:`_search`).
            with_payload: True, False, the payload fields to return (Qdrant's paths: ``meta.dept``,
                ``items[].sku``), or ``models.PayloadSelectorInclude`` / ``Exclude``.
            with_vectors: give each hit its vector (:attr:`Hit.vector`) as its side stores it.
            exact, hnsw_ef: this call's search parameters (None: the index's own).
            search_params: qdrant-client's ``models.SearchParams`` for both sides (``quantization``,
                ``indexed_only``...); ``exact`` / ``hnsw_ef`` above may not contradict it.
            timeout, consistency: a server's request timeout (s) and read consistency; the embedded
                store (in this process: no network, one replica) checks and ignores them.
            rerank: K, or a :class:`~rm_qdrant.Rerank` (K, deadline, fetch budget, promote): the new
                model embeds the old hits among the merged list's first K from their source and
                the K are ordered by the new model's distances (:mod:`rm_qdrant.core.rerank`;
                each hit says what it got on :attr:`Hit.rerank`). Default: the pair's (``rmq init
                --rerank``); None: no re-rank. Needs the new query vectors and the encoder; a
                rolled-back or finalized pair has no old hits to re-score.
            promote: write the vectors a re-rank embedded to new through the migration's
                claim/settle protocol, in the background (None: the re-rank's own setting).

        Example:
            >>> from qdrant_client import models
            >>> cheap = models.Filter(must=[models.FieldCondition(key="price", range=models.Range(lt=10))])
            >>> index.search_vectors_batch(new, old, filter=cheap, offset=10)  # doctest: +SKIP
        """
        extra = {"search_params": search_params, "timeout": timeout, "consistency": consistency}
        opts = SearchOptions(score_threshold, offset, with_payload, with_vectors, exact, hnsw_ef, **extra)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigError(f"limit must be an integer >= 0, got {limit!r}")
        check_hits(limit, offset)
        plan = self._rerank_plan(rerank, promote)
        want = limit + offset if plan is None else max(limit + offset, plan.k)
        merged = self._search(new_vectors, old_vectors, want, as_where(filter), opts)
        if plan is not None and self.pair.serves_old and self.pair.serves_new and merged:
            merged = self._reranked(merged, self._check(new_vectors, self._new_dim, "new"), plan)
        rows = [opts.finish(hits, limit, self.pair.distance) for hits in merged]
        if self.demand is not None:
            self.demand.record(h.id for hits in rows for h in hits if h.source == "old")
        return with_vectors_of(self.store, self.pair, rows) if with_vectors else rows

    # -- writes ----------------------------------------------------------------

    def add(self, id: PointId, image: ImageLike, payload: Mapping[str, Any] | None = None) -> None:
        """Add one image to the gallery (it goes to the new collection)."""
        self.upsert([id], [image], [payload or {}])

    def upsert(
        self,
        ids: Sequence[PointId],
        images: Sequence[ImageLike],
        payloads: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        other_vectors: VectorRows | None = None,
    ) -> None:
        """Add or replace images: embed with the new model, write to new, then drop from old.

        See :meth:`upsert_vectors` for ``payloads`` and ``other_vectors``.
        """
        if len(ids) != len(images):
            raise ConfigError(f"{len(ids)} ids for {len(images)} images")
        encoder = self._encoder()
        gallery = encoder.info.gallery_output()
        vectors = encoder.encode(list(images), [gallery])[gallery]
        old_vectors = None
        if self.layout.keeps_writes_in_old and self.old_encoder is not None and self._old_dim is not None:
            old_vectors = self._old_queries(list(images))  # the old model's vectors, for a rollback
        self.upsert_vectors(ids, vectors, payloads, old_vectors=old_vectors, other_vectors=other_vectors)

    def upsert_vectors(
        self,
        ids: Sequence[PointId],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        old_vectors: np.ndarray | None = None,
        other_vectors: VectorRows | None = None,
    ) -> None:
        """Write new-model vectors to the new collection, then remove those ids from old.

        The write to new is complete before the removal starts, so a crash in
        between leaves the point in both collections (search returns it once),
        never in neither. While a rollback is possible (a ``--keep-old`` pair, or one
        collection, backfilling) ``old_vectors``, the old model's vectors of the same
        images, are written to old instead of the removal: hidden there until a
        rollback serves them. Without them such a point lives in new only.

        What rm-qdrant does not manage stays: a point that exists keeps its other named
        vectors (dense or sparse) unless ``other_vectors`` gives them, and its payload when
        ``payloads`` (or a point's entry in it) is None; a payload given replaces it. What is
        kept is the point's as it serves (as :meth:`retrieve` gives it), also while a migration
        batch moves it: new's copy is the migration's until the batch retires old's, and a
        ``set_payload`` reaches old first (see ``rm_qdrant.pair.layouts.paired_writes``).

        Everything is checked before anything is written. A write cut short (the process
        killed) leaves each point served once, as it was or as written; running it again
        finishes it, and so does the next ``rmq migrate`` for what it left in old.
        ``other_vectors`` is one mapping per point, as qdrant-client's ``PointStruct.vector``
        (``{"text": [...], "bm25": models.SparseVector(...)}``; None or a missing name: not
        given), or one mapping of name -> one value per point (a matrix for a dense vector).

        Raises:
            ConfigError: the pair was rolled back; counts that differ; NaN or infinity in
                ``vectors`` or ``old_vectors``; an other vector the collection does not have,
                or one of the models' own.
            DimensionMismatch: a vector of the wrong size.
        """
        pair = self.pair
        if pair.state == "rolled_back":
            raise ConfigError(f"pair {pair.name!r} was rolled back: the old model serves, index into old")
        ids = id_list(ids)
        rows = len(ids)
        new = self._rows(vectors, self._new_dim, rows, "new")
        old = None
        if old_vectors is not None and self.layout.keeps_writes_in_old and self._old_dim is not None:
            old = self._rows(old_vectors, self._old_dim, rows, "old")
        others = None
        if other_vectors is not None:
            managed = self.layout.managed
            others = check_others(pair.new_collection, self._others(), other_vectors, rows, managed=managed)
        # every payload checked before anything is written (vectors: _rows); one spelling of each
        # id (a UUID given upper case, or as uuid.UUID, is what the store gives back lower case):
        # a payload kept is looked up by it
        bodies = check_payloads(user_bodies(payloads, rows))
        write = Write(normalize_ids(ids), new, bodies, old, others, self._old_dim is not None)
        self.layout.write(self.store, write, self._others())

    def _rows(self, vectors: np.ndarray, dim: int, rows: int, side: str) -> np.ndarray:
        """A write's ``side`` vectors, checked before anything is written (the store checks them
        too, but only at their own write: a write to the other collection may be done by then)."""
        with np.errstate(over="ignore"):  # a float64 beyond float32's range: infinity, refused below
            array = self._check(vectors, dim, side)
        if len(array) != rows:
            raise ConfigError(f"{len(array)} {side} vectors for {rows} ids")
        if not np.isfinite(array).all():
            raise ConfigError(f"{side} vectors contain NaN or infinity (or numbers beyond float32's range)")
        return array

    def _others(self) -> dict[str, OtherVector]:
        if self._carried is None:
            self._carried = self.layout.carried(self.store)
        return self._carried

    def delete(self, ids: Sequence[PointId]) -> None:
        """Remove points from the gallery: from both collections."""
        self.layout.delete(self.store, normalize_ids(id_list(ids)), self._old_dim is not None)

    def refresh(self) -> None:
        """Re-read the pair record (a long-lived server calls this to see a cutover, a rollback, or a
        new decode mode: ``rmq switch-encoder --decode``)."""
        before = self.pair
        self.pair = pair = load_pair(self.store, self.pair.name)
        if (pair.decode, pair.source) != (before.decode, before.source):
            # the re-rank's encoder decodes, its cache holds vectors and its reads follow the old
            # settings: the next re-rank makes another (a search under way ends its reads late)
            if self._reranker is not None:
                self._reranker.close()
            self._reranker = None
        self._carried = None
        if self.encoder is not None:
            self.encoder = self.encoder.decoding_as(pair.decode)
        if self.old_encoder is not None:
            self.old_encoder = self.old_encoder.decoding_as(pair.decode)
        ref = pair.old_encoder
        if self.old_encoder is None and ref is not None and pair.state == "rolled_back":
            self.old_encoder = open_encoder(None, ref, pair.name, "old encoder", decode=pair.decode)

    # -- state -----------------------------------------------------------------

    def status(self) -> PairStatus:
        """Both collections' sizes and the pair's models."""
        return pair_status(self.store, self.pair)

    def progress(self) -> float:
        """Fraction of the gallery already in the new collection."""
        return self.status().fraction

    def close(self) -> None:
        """Stop the search threads and the re-rank's reads; wait for the promotions under way
        (the store stays open: it belongs to the caller)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self._reranker is not None:
            self._reranker.close()
        if self._promoter is not None:
            self._promoter.close()
        if self.demand is not None:
            self.demand.close()

    def __enter__(self) -> DualIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
