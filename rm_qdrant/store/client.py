"""Store over qdrant-client: a remote Qdrant server, or qdrant-client's local mode
(in memory, or a folder written by ``QdrantClient(path=...)``).

Low-level errors (HTTP status codes, connection failures, qdrant-client's own
``ValueError`` in local mode) become :mod:`rm_qdrant.errors` exceptions here, at
the boundary.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.redact import redact
from rm_qdrant.errors import CollectionNotFound, StoreError, StoreLocked
from rm_qdrant.store.base import (
    INDEX_KINDS,
    Capabilities,
    CollectionSpec,
    MergedQuery,
    Record,
    ScoredRecord,
    VectorFacts,
    Where,
    check_spec,
    check_vectors,
    pick_vector,
)
from rm_qdrant.store.bounds import check_payloads, check_stored
from rm_qdrant.store.client_query import (
    DISTANCES,
    client_filter,
    client_search,
    merged_options,
    merged_requests,
    sparse,
    takes_acorn,
    translated,
    unsupported_merge,
    vector_facts,
    vectors_config,
)
from rm_qdrant.store.ids import normalize_id
from rm_qdrant.store.params import old_side_params
from rm_qdrant.store.points import (
    is_missing_point,
    merged_from,
    point_vectors,
    records_from,
    scored_from,
    wanted,
    write_skipping_missing,
)
from rm_qdrant.store.tuning import check_kb, client_thresholds, client_vectors_diff
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)


_INDEX_KINDS = {kind: getattr(models.PayloadSchemaType, kind.upper()) for kind in INDEX_KINDS}
_KIND_NAMES = {v: k for k, v in _INDEX_KINDS.items()}


class ClientStore:
    """A store on qdrant-client.

    Args:
        location: ``":memory:"`` for qdrant-client's in-process mode, or a URL
            such as ``http://localhost:6333`` (``https://`` for TLS).
        path: instead of ``location``: a folder of qdrant-client's local mode
            (what ``QdrantClient(path=...)`` writes), opened through the same calls
            a server gets.
        api_key: The server's API key, if it has one.
        timeout: Seconds to wait for the server on each request.

    Raises:
        StoreError: the server is unreachable or rejected the API key, or the folder is
            in use by another process.
    """

    def __init__(
        self,
        location: str | None = None,
        *,
        path: str | None = None,
        api_key: str | None = None,
        timeout: int = 30,
    ) -> None:
        self.location = location or str(path)
        self._shown = redact(self.location)  # a URL may carry user:password or ?api_key=
        self._remote = location is not None and location != ":memory:"
        self._specs: dict[str, tuple[dict[str, VectorFacts], dict[str, bool]]] = {}  # a round trip saved
        self._acorn: bool | None = None  # the server takes ACORN (None: not known yet)
        # qdrant-client's local mode is not thread-safe; a server is.
        self._lock: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if self._remote else threading.RLock()
        )
        try:
            if path is not None:
                self._client = QdrantClient(path=str(path))
            elif location == ":memory:":
                self._client = QdrantClient(location=":memory:")
            else:
                self._client = QdrantClient(
                    url=location, api_key=api_key, timeout=timeout, check_compatibility=False
                )
        except (ValueError, RuntimeError) as exc:  # RuntimeError: the folder is open elsewhere
            error = StoreLocked if isinstance(exc, RuntimeError) else StoreError
            raise error(f"cannot open Qdrant at {self._shown!r}: {redact(str(exc))}") from exc
        with self._errors("connect"):
            self._client.get_collections()

    @contextlib.contextmanager
    def _errors(self, what: str, collection: str | None = None) -> Iterator[None]:
        with translated(f"Qdrant at {self._shown}", what, collection), self._lock:
            yield

    def has_collection(self, name: str) -> bool:
        # A collection, not an alias: Qdrant's collection_exists also answers True for an alias.
        return name in self.list_collections()

    def collection(self, name: str, vector: str | None = None) -> CollectionSpec:
        dense, sparse_idf = self._facts(name)
        return pick_vector(name, dense, vector, sparse_idf)

    def _facts(self, name: str) -> tuple[dict[str, VectorFacts], dict[str, bool]]:
        if name not in self._specs:
            with self._errors("collection lookup", name):
                info = self._client.get_collection(name)
            self._specs[name] = vector_facts(info)
        return self._specs[name]

    def list_collections(self) -> list[str]:
        with self._errors("listing collections"):
            return sorted(c.name for c in self._client.get_collections().collections)

    def create_collection(
        self, name: str, *, dim: int, distance: str, vector: str = "", others: Sequence[OtherVector] = ()
    ) -> None:
        spec = check_spec(name, dim, distance, vector, others)
        if self.has_collection(name):
            raise StoreError(f"collection {name!r} already exists")
        dense, sparse_params = vectors_config(spec)
        self._specs.pop(name, None)
        with self._errors(f"creating collection {name!r}"):
            self._client.create_collection(name, vectors_config=dense, sparse_vectors_config=sparse_params)

    def delete_collection(self, name: str) -> None:
        if not self.has_collection(name):
            raise CollectionNotFound(f"collection {name!r} not found in Qdrant at {self._shown}")
        self._specs.pop(name, None)
        with self._errors(f"deleting collection {name!r}", name):
            self._client.delete_collection(name)

    def add_vector(self, name: str, vector: str, *, dim: int, distance: str) -> None:
        spec = check_spec(name, dim, distance, vector)
        config = models.DenseVectorConfig(size=spec.dim, distance=DISTANCES[spec.distance])
        self._specs.pop(name, None)
        with self._errors(f"adding vector {vector!r} to {name!r}", name):
            self._client.create_vector_name(
                name, vector, models.DenseVectorNameConfig(dense=config), wait=True
            )

    def drop_vector(self, name: str, vector: str) -> None:
        self._specs.pop(name, None)
        with self._errors(f"removing vector {vector!r} from {name!r}", name):
            self._client.delete_vector_name(name, vector, wait=True)

    def set_vectors(
        self,
        name: str,
        ids: Sequence[PointId],
        vectors: np.ndarray,
        *,
        vector: str,
        where: Where | None = None,
        others: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        matrix = check_vectors(self.collection(name, vector), vectors, rows=len(ids))
        named = point_vectors(vector, matrix.tolist(), others, sparse)
        rows = [models.PointVectors(id=normalize_id(i), vector=v) for i, v in zip(ids, named, strict=True)]
        condition = client_filter(where)

        def write(part: list[models.PointVectors]) -> None:
            with self._errors(f"vector update in {name!r}", name):
                self._client.update_vectors(name, part, wait=True, update_filter=condition)

        write_skipping_missing(write, rows, _missing)

    def upsert(
        self,
        name: str,
        ids: Sequence[PointId],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
        *,
        insert_only: bool = False,
        vector: str = "",
        others: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        spec = self.collection(name, vector)
        matrix = check_vectors(spec, vectors, rows=len(ids))
        mode = models.UpdateMode.INSERT_ONLY if insert_only else None
        # the unnamed vector beside named ones goes by name
        named = point_vectors(vector, matrix.tolist(), others, sparse, named=bool(vector or spec.extra))
        bodies = check_payloads(payloads, store=True) if payloads is not None else [{}] * len(ids)
        points = [
            models.PointStruct(id=normalize_id(i), vector=v, payload=dict(p))
            for i, v, p in zip(ids, named, bodies, strict=True)
        ]
        if points:
            with self._errors(f"upsert into {name!r}", name):
                self._client.upsert(name, points=points, wait=True, update_mode=mode)

    def delete(
        self, name: str, ids: Sequence[PointId], *, where: Where | None = None, vectors: Sequence[str] = ()
    ) -> None:
        if not ids:
            return
        selector: Any = (
            models.PointIdsList(points=[normalize_id(i) for i in ids])
            if where is None and not vectors
            else models.FilterSelector(filter=client_filter(where, ids))
        )
        with self._errors(f"delete from {name!r}", name):
            if vectors:
                self._client.delete_vectors(name, list(vectors), selector, wait=True)
            else:
                self._client.delete(name, points_selector=selector, wait=True)

    def mark(
        self, name: str, ids: Sequence[PointId], payload: Mapping[str, Any], *, where: Where | None = None
    ) -> None:
        if ids:
            selector, checked = models.FilterSelector(filter=client_filter(where, ids)), check_stored(payload)
            with self._errors(f"payload update in {name!r}", name):
                self._client.set_payload(name, dict(checked), points=selector, wait=True)

    def clear_fields(self, name: str, fields: Sequence[str]) -> None:
        if fields:
            empty = [models.IsEmptyCondition(is_empty=models.PayloadField(key=f)) for f in fields]
            having = models.Filter(must_not=[models.Filter(must=empty)])
            with self._errors(f"payload update in {name!r}", name):
                self._client.delete_payload(
                    name, list(fields), points=models.FilterSelector(filter=having), wait=True
                )

    def set_payload(self, name: str, items: Sequence[tuple[PointId, Mapping[str, Any]]]) -> int:
        items = [(normalize_id(i), check_stored(p)) for i, p in items]  # all, before any write
        if self._remote and items:
            ops = [
                models.SetPayloadOperation(
                    set_payload=models.SetPayload(payload=dict(p), points=[normalize_id(i)])
                )
                for i, p in items
            ]
            try:
                with self._errors(f"payload update in {name!r}", name):
                    self._client.batch_update_points(name, ops, wait=True)
                return len(items)
            except StoreError as exc:
                if not is_missing_point(exc):
                    raise
        # One point at a time: in local mode, or to skip ids deleted meanwhile.
        done = 0
        for point_id, payload in items:
            try:
                with self._errors(f"payload update in {name!r}", name):
                    self._client.set_payload(name, dict(payload), points=[normalize_id(point_id)], wait=True)
                done += 1
            except KeyError:  # the local mode's word for a missing point
                continue
            except StoreError as exc:
                if not is_missing_point(exc):
                    raise
        return done

    def create_index(self, name: str, field_name: str, kind: str) -> None:
        if not self._remote:
            return  # the local mode scans payloads and has no indexes (it warns if asked)
        with self._errors(f"indexing {field_name!r} in {name!r}", name):
            info = self._client.get_collection(name)
            if field_name not in (info.payload_schema or {}):
                self._client.create_payload_index(name, field_name, _INDEX_KINDS[kind], wait=True)

    def payload_indexes(self, name: str) -> dict[str, str]:
        with self._errors(f"reading the payload indexes of {name!r}", name):
            schema = self._client.get_collection(name).payload_schema or {}
        found = {field: _KIND_NAMES.get(info.data_type) for field, info in schema.items()}
        return {field: kind for field, kind in found.items() if kind is not None}

    def copy_indexes(self, source: str, target: str, fields: Sequence[str]) -> None:
        if not self._remote:
            return  # the local mode has no indexes
        with self._errors(f"copying the payload indexes of {source!r} to {target!r}", target):
            schema = self._client.get_collection(source).payload_schema or {}
            have = self._client.get_collection(target).payload_schema or {}
            for field in fields:
                info = schema.get(field)
                if info is not None and field not in have:
                    kind = info.params if info.params is not None else info.data_type
                    self._client.create_payload_index(target, field, kind, wait=True)

    def retrieve(
        self,
        name: str,
        ids: Sequence[PointId],
        *,
        with_vectors: bool = False,
        vector: str = "",
        with_payload: bool = True,
        others: Sequence[str] = (),
    ) -> list[Record]:
        asked = wanted(with_vectors, vector, others)
        with self._errors(f"retrieve from {name!r}", name):
            points = self._client.retrieve(
                name, [normalize_id(i) for i in ids], with_payload=with_payload, with_vectors=asked
            )
        return records_from(points, with_vectors, vector, others)

    def scroll(
        self,
        name: str,
        *,
        limit: int,
        offset: PointId | None = None,
        with_vectors: bool = False,
        where: Where | None = None,
        order_by: str | None = None,
        vector: str = "",
        with_payload: bool = True,
        others: Sequence[str] = (),
    ) -> tuple[list[Record], PointId | None]:
        with self._errors(f"scroll over {name!r}", name):
            points, following = self._client.scroll(
                name,
                scroll_filter=client_filter(where),
                limit=limit,
                offset=offset,
                order_by=order_by,
                with_payload=with_payload,
                with_vectors=wanted(with_vectors, vector, others),
            )
        nxt = None if following is None else normalize_id(following)
        return records_from(points, with_vectors, vector, others), nxt

    def count(self, name: str, where: Where | None = None) -> int:
        with self._errors(f"count of {name!r}", name):
            return int(self._client.count(name, count_filter=client_filter(where), exact=True).count)

    def set_alias(self, alias: str, collection: str) -> None:
        self._facts(collection)  # CollectionNotFound before touching the alias
        ops: list[Any] = []
        if self.alias(alias) is not None:
            ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias)))
        create = models.CreateAlias(collection_name=collection, alias_name=alias)
        ops.append(models.CreateAliasOperation(create_alias=create))
        with self._errors(f"pointing alias {alias!r} at {collection!r}"):
            self._client.update_collection_aliases(change_aliases_operations=ops)

    def alias(self, alias: str) -> str | None:
        with self._errors("alias lookup"):
            found = [a for a in self._client.get_aliases().aliases if a.alias_name == alias]
        return found[0].collection_name if found else None

    def search(
        self, name: str, queries: np.ndarray, *, limit: int, vector: str = "", **options: Any
    ) -> list[list[ScoredRecord]]:
        """Store.search (``options``: filter, exact, hnsw_ef, search_params, timeout, consistency)."""
        matrix = check_vectors(self.collection(name, vector), queries)
        requests, kwargs = client_search(matrix.tolist(), limit, vector, self._remote, **options)
        with self._errors(f"search in {name!r}", name):
            responses = self._client.query_batch_points(name, requests, **kwargs)
        return [[scored_from(p) for p in r.points] for r in responses]

    def tune_index(self, name: str, vectors: Sequence[str], *, full_scan_kb: int) -> None:
        """Set ``vectors``' HNSW ``full_scan_threshold`` (KB; see store/tuning.py)."""
        diff = client_vectors_diff(vectors, check_kb(full_scan_kb))
        with self._errors(f"setting the index of {name!r}", name):
            self._client.update_collection(name, vectors_config=diff)

    def index_thresholds(self, name: str) -> dict[str, int]:
        """Each dense vector's effective HNSW ``full_scan_threshold`` (KB) on a server; none in
        local mode, which always scans."""
        if not self._remote:
            return {}
        with self._errors(f"reading the index settings of {name!r}", name):
            return client_thresholds(self._client.get_collection(name))

    @property
    def capabilities(self) -> Capabilities:
        """A server takes both searches at once; local mode searches exactly, and a server from
        Qdrant 1.16 on takes ACORN (its version is read once it is first asked)."""
        return Capabilities(
            concurrent_search=self._remote, filtered_recall=not self._remote or self._takes_acorn
        )

    @property
    def _takes_acorn(self) -> bool:
        """Whether the server takes ACORN (an older one may refuse the field). A version read is
        kept; a failed read is asked again next time (a server restarting must not turn ACORN
        off for the store's life)."""
        if self._acorn is None:
            try:
                with self._errors("reading the server's version"):
                    self._acorn = takes_acorn(self._client.info().version)
            except StoreError as exc:
                log.debug("no ACORN on this search: %s", exc)
                return False
        return self._acorn

    def merged_search(
        self, name: str, old_queries: np.ndarray, new_queries: np.ndarray, query: MergedQuery
    ) -> list[list[ScoredRecord]]:
        old = check_vectors(self.collection(name, query.old_vector), old_queries)
        new = check_vectors(self.collection(name, query.new_vector), new_queries, rows=len(old))
        params, options = merged_options(query, self._remote)
        old_params = old_side_params(params) if params is not None and self._takes_acorn else None
        requests = merged_requests(query, old.tolist(), new.tolist(), params, old_params)
        with unsupported_merge(self._shown), self._errors(f"merged search in {name!r}", name):
            responses = self._client.query_batch_points(name, requests, **options)
        return [[merged_from(p, query) for p in r.points] for r in responses]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ClientStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _missing(exc: BaseException) -> bool:
    """Whether an error says a point is gone (KeyError: the local mode's word for it)."""
    return isinstance(exc, KeyError) or is_missing_point(exc)
