"""Embedded on-disk store on qdrant-edge: Qdrant's own engine, in this process.

qdrant-edge holds one shard per folder and has no collections, so a store is a
folder with one shard per collection::

    ROOT/.rmq-lock                       held (flock) while a process has it open
    ROOT/collections/NAME/shard/         the qdrant-edge shard (WAL, segments, edge_config.json)
    ROOT/collections/NAME/spec.json      written last when rm-qdrant creates the collection
    ROOT/collections/NAME/.creating      there only while rm-qdrant creates it

A collection's vectors (names, sizes, distances) are read from the shard's own
``edge_config.json``, so a shard made by a team's code with qdrant-edge, placed (or
symlinked) at ``collections/NAME/shard``, is adopted as it is. A crash while
rm-qdrant creates a collection leaves a ``.creating`` marker, and nothing that looks
like a collection. Every update goes through the shard's write-ahead log before the
call returns.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe

from rm_qdrant.core.merge import PointId
from rm_qdrant.errors import CollectionNotFound, ConfigError, StoreError
from rm_qdrant.store.base import (
    INDEX_KINDS,
    Capabilities,
    CollectionSpec,
    MergedQuery,
    Record,
    ScoredRecord,
    Where,
    check_collection_name,
    check_spec,
    check_vectors,
    pick_vector,
)
from rm_qdrant.store.bounds import check_payloads, check_stored
from rm_qdrant.store.edge_folder import (
    acquire_lock,
    is_collection,
    read_aliases,
    remove_leftovers,
    write_aliases,
)
from rm_qdrant.store.edge_query import (
    DISTANCES,
    Specs,
    edge_config,
    edge_filter,
    edge_merged_search,
    edge_search,
    read_specs,
    sparse,
)
from rm_qdrant.store.ids import normalize_id, normalize_ids
from rm_qdrant.store.points import (
    is_missing_point,
    point_vectors,
    records_from,
    wanted,
    write_skipping_missing,
)
from rm_qdrant.store.tuning import check_kb, edge_thresholds, write_edge_config
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)


_INDEX_KINDS = {kind: getattr(qe.PayloadSchemaType, kind.capitalize()) for kind in INDEX_KINDS}
_KIND_NAMES = {str(v): k for k, v in _INDEX_KINDS.items()}


class EdgeStore:
    """A folder of qdrant-edge shards, one per collection, locked to one process.

    Args:
        path: The store's folder.
        create: create the store if the folder holds none (else: StoreError).

    Raises:
        StoreLocked: another process has the folder open.
        StoreError: no store there and ``create`` is False, or the folder cannot be made.
    """

    #: ACORN on the merged search's old prefetch; no background optimizer; a folder a collection
    capabilities = Capabilities(filtered_recall=True, optimizes=True, shard_folders=True)

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        self._collections_dir = self.path / "collections"
        if not create and not self._collections_dir.is_dir():
            raise StoreError(f"no embedded store at {self.path} (check --qdrant; 'rmq index' creates one)")
        try:
            self._collections_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create embedded store at {self.path}: {exc}") from exc
        self._lock_file = acquire_lock(self.path)
        self._shards: dict[str, tuple[Specs, qe.EdgeShard]] = {}
        self._mutex = threading.Lock()
        remove_leftovers(self._collections_dir)

    def _dir(self, name: str) -> Path:
        return self._collections_dir / check_collection_name(name)

    def has_collection(self, name: str) -> bool:
        return is_collection(self._dir(name))

    def linked_shard(self, name: str) -> Path | None:
        """Where collection ``name``'s shard is, when it is a team's shard adopted through a
        symbolic link (``collections/NAME/shard`` or ``collections/NAME``); None otherwise."""
        folder = self._dir(name)
        if not is_collection(folder) or not (folder.is_symlink() or (folder / "shard").is_symlink()):
            return None
        return (folder / "shard").resolve()

    def shard_path(self, name: str) -> Path:
        """The folder of collection ``name``'s shard, in this store."""
        return self._dir(name) / "shard"

    def collection(self, name: str, vector: str | None = None) -> CollectionSpec:
        dense, sparse = self._open(name)[0]
        return pick_vector(name, dense, vector, sparse)

    def list_collections(self) -> list[str]:
        return sorted(p.name for p in self._collections_dir.iterdir() if is_collection(p))

    def create_collection(
        self, name: str, *, dim: int, distance: str, vector: str = "", others: Sequence[OtherVector] = ()
    ) -> None:
        spec = check_spec(name, dim, distance, vector, others)
        folder = self._dir(name)
        with self._mutex:
            if is_collection(folder):
                raise StoreError(f"collection {name!r} already exists")
            shutil.rmtree(folder, ignore_errors=True)  # leftovers of a crashed create
            folder.mkdir(parents=True)
            (folder / ".creating").touch()
            config = edge_config(spec)
            try:
                shard = qe.EdgeShard.create(str(folder / "shard"), config)
            except Exception as exc:  # qdrant-edge raises plain Exception
                raise StoreError(f"cannot create collection {name!r}: {exc}") from exc
            tmp = folder / "spec.json.tmp"
            tmp.write_text(json.dumps({"vectors": {vector: [spec.dim, spec.distance]}}))
            os.replace(tmp, folder / "spec.json")
            (folder / ".creating").unlink()
            self._shards[name] = (read_specs(folder, name), shard)

    def delete_collection(self, name: str) -> None:
        """Delete a collection. An adopted shard (or collection folder) that is a symlink loses the
        link, not its data."""
        with self._mutex:
            opened = self._shards.pop(name, None)
            if opened is not None:
                opened[1].close()
            folder = self._dir(name)
            if not is_collection(folder):
                raise CollectionNotFound(f"collection {name!r} not found in {self.path}")
            if folder.is_symlink():  # a team's collection folder adopted through a link: the link goes
                folder.unlink()  # at once, and nothing is written in the team's folder
                return
            (folder / ".creating").touch()  # from here on it no longer counts as a collection
            (folder / "spec.json").unlink(missing_ok=True)
            shutil.rmtree(folder)

    def add_vector(self, name: str, vector: str, *, dim: int, distance: str) -> None:
        spec = check_spec(name, dim, distance, vector)
        self._update(name, qe.UpdateOperation.create_dense_vector(vector, spec.dim, DISTANCES[spec.distance]))
        self._reread(name)

    def drop_vector(self, name: str, vector: str) -> None:
        self._update(name, qe.UpdateOperation.delete_vector_name(vector))
        self._reread(name)

    def _reread(self, name: str) -> None:
        # The shard rewrites its edge_config.json when its vectors change.
        with self._mutex:
            shard = self._shards[name][1]
            self._shards[name] = (read_specs(self._dir(name), name), shard)

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
        rows = [qe.PointVectors(i, v) for i, v in zip(normalize_ids(ids), named, strict=True)]
        condition = edge_filter(where)
        shard = self._open(name)[1]

        def write(part: list[qe.PointVectors]) -> None:
            try:
                shard.update(qe.UpdateOperation.update_vectors(part, condition=condition))
            except Exception as exc:  # qdrant-edge raises plain Exception
                raise StoreError(f"write to collection {name!r} failed: {exc}") from exc

        write_skipping_missing(write, rows, is_missing_point)

    def _open(self, name: str) -> tuple[Specs, qe.EdgeShard]:
        with self._mutex:
            opened = self._shards.get(name)
            if opened is not None:
                return opened
            folder = self._dir(name)
            if not is_collection(folder):
                raise CollectionNotFound(f"collection {name!r} not found in embedded store {self.path}")
            try:
                shard = qe.EdgeShard.load(str(folder / "shard"))
            except Exception as exc:
                raise StoreError(f"cannot open collection {name!r}: {exc}") from exc
            specs = read_specs(folder, name)
            self._shards[name] = (specs, shard)
            return specs, shard

    def _update(self, name: str, operation: qe.UpdateOperation) -> None:
        shard = self._open(name)[1]
        try:
            shard.update(operation)
        except Exception as exc:
            raise StoreError(f"write to collection {name!r} failed: {exc}") from exc

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
        bodies = check_payloads(payloads, store=True) if payloads is not None else [{}] * len(ids)
        named = point_vectors(vector, matrix.tolist(), others, sparse, named=bool(vector or spec.extra))
        try:
            points = [
                qe.Point(i, v, dict(p)) for i, v, p in zip(normalize_ids(ids), named, bodies, strict=True)
            ]
        except (ValueError, TypeError) as exc:  # a payload value JSON has no room for (NaN, a set)
            raise _unstorable(exc) from None
        mode = qe.UpdateMode.InsertOnly if insert_only else None
        if points:
            self._update(name, qe.UpdateOperation.upsert_points(points, update_mode=mode))

    def delete(
        self, name: str, ids: Sequence[PointId], *, where: Where | None = None, vectors: Sequence[str] = ()
    ) -> None:
        if not ids:
            return
        if vectors:
            operation = qe.UpdateOperation.delete_vectors_by_filter(edge_filter(where, ids), list(vectors))
            self._update(name, operation)
        elif where is None:
            self._update(name, qe.UpdateOperation.delete_points(normalize_ids(ids)))
        else:
            self._update(name, qe.UpdateOperation.delete_points_by_filter(edge_filter(where, ids)))

    def mark(
        self, name: str, ids: Sequence[PointId], payload: Mapping[str, Any], *, where: Where | None = None
    ) -> None:
        if ids:
            by_id, checked = edge_filter(where, ids), check_stored(payload)
            try:
                operation = qe.UpdateOperation.set_payload_by_filter(by_id, dict(checked))
            except (ValueError, TypeError) as exc:
                raise _unstorable(exc) from None
            self._update(name, operation)

    def clear_fields(self, name: str, fields: Sequence[str]) -> None:
        if fields:
            none_of_them = qe.Filter(must=[qe.IsEmptyCondition(f) for f in fields])
            having = qe.Filter(must_not=[none_of_them])  # only the points that carry one of them
            self._update(name, qe.UpdateOperation.delete_payload_by_filter(having, list(fields)))

    def set_payload(self, name: str, items: Sequence[tuple[PointId, Mapping[str, Any]]]) -> int:
        shard = self._open(name)[1]
        checked = [(normalize_id(i), check_stored(p)) for i, p in items]  # all, before any write
        done = 0
        for point_id, payload in checked:
            try:
                shard.update(qe.UpdateOperation.set_payload([point_id], dict(payload)))
                done += 1
            except Exception as exc:
                if not is_missing_point(exc):
                    raise StoreError(f"write to collection {name!r} failed: {exc}") from exc
        return done

    def create_index(self, name: str, field_name: str, kind: str) -> None:
        shard = self._open(name)[1]
        if field_name not in shard.info().payload_schema:
            self._update(name, qe.UpdateOperation.create_field_index(field_name, _INDEX_KINDS[kind]))

    def payload_indexes(self, name: str) -> dict[str, str]:
        schema = self._open(name)[1].info().payload_schema
        found = {field: _KIND_NAMES.get(str(info.data_type)) for field, info in schema.items()}
        return {field: kind for field, kind in found.items() if kind is not None}

    def copy_indexes(self, source: str, target: str, fields: Sequence[str]) -> None:
        schema = self._open(source)[1].info().payload_schema
        have = self._open(target)[1].info().payload_schema
        for field in fields:
            info = schema.get(field)
            if info is not None and field not in have:
                kind = info.params if info.params is not None else info.data_type
                self._update(target, qe.UpdateOperation.create_field_index(field, kind))

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
        shard = self._open(name)[1]
        asked = wanted(with_vectors, vector, others)
        points = shard.retrieve(normalize_ids(ids), with_payload, asked)
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
        shard = self._open(name)[1]
        start = None if offset is None else normalize_id(offset)
        request = qe.ScrollRequest(
            offset=start,
            limit=limit,
            with_payload=with_payload,
            with_vector=wanted(with_vectors, vector, others),
            filter=edge_filter(where),
            order_by=qe.OrderBy(order_by) if order_by else None,
        )
        points, next_offset = shard.scroll(request)
        following = None if next_offset is None else normalize_id(next_offset)
        return records_from(points, with_vectors, vector, others), following

    def count(self, name: str, where: Where | None = None) -> int:
        request = qe.CountRequest(filter=edge_filter(where), exact=True)
        return int(self._open(name)[1].count(request))

    def set_alias(self, alias: str, collection: str) -> None:
        # qdrant-edge has no aliases: the store keeps them in one small file, replaced atomically.
        aliases = read_aliases(self.path)
        self._open(collection)  # CollectionNotFound before touching the alias
        aliases[check_collection_name(alias)] = collection
        write_aliases(self.path, aliases)

    def alias(self, alias: str) -> str | None:
        return read_aliases(self.path).get(alias)

    def search(
        self, name: str, queries: np.ndarray, *, limit: int, vector: str = "", **options: Any
    ) -> list[list[ScoredRecord]]:
        """Store.search (``options``: filter, exact, hnsw_ef, search_params, timeout, consistency)."""
        specs, shard = self._open(name)
        return edge_search(shard, specs, name, queries, limit=limit, vector=vector, **options)

    def merged_search(
        self, name: str, old_queries: np.ndarray, new_queries: np.ndarray, query: MergedQuery
    ) -> list[list[ScoredRecord]]:
        specs = (self.collection(name, query.old_vector), self.collection(name, query.new_vector))
        return edge_merged_search(self._open(name)[1], specs, old_queries, new_queries, query)

    def tune_index(self, name: str, vectors: Sequence[str], *, full_scan_kb: int) -> None:
        """Set ``vectors``' HNSW ``full_scan_threshold`` (KB; see store/tuning.py): the shard is
        closed, its config rewritten, and reopened (a team's shard is adopted this way too)."""
        self._open(name)  # CollectionNotFound first
        with self._mutex:
            self._shards.pop(name)[1].close()
            write_edge_config(self._dir(name) / "shard", vectors, check_kb(full_scan_kb))
        self._open(name)

    def index_thresholds(self, name: str) -> dict[str, int]:
        """Each dense vector's effective HNSW ``full_scan_threshold`` (KB), from the shard's config."""
        self._open(name)  # CollectionNotFound first
        return edge_thresholds(json.loads((self._dir(name) / "shard" / "edge_config.json").read_text()))

    def optimize(self, name: str) -> None:
        """Build the HNSW index of a collection now (qdrant-edge has no background optimizer)."""
        self._open(name)[1].optimize()

    def close(self) -> None:
        with self._mutex:
            for _, shard in self._shards.values():
                shard.close()
            self._shards.clear()
            if not self._lock_file.closed:
                self._lock_file.close()  # closing the handle releases the flock

    def __enter__(self) -> EdgeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unstorable(exc: Exception) -> ConfigError:
    return ConfigError(f"a payload the embedded store cannot hold ({exc}): JSON values only, no NaN or sets")
