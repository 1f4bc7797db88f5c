"""The one interface to Qdrant that everything above the store is written against.

Two implementations: :class:`~rm_qdrant.store.edge.EdgeStore` (Qdrant's engine
in-process, one shard per collection folder) and
:class:`~rm_qdrant.store.client.ClientStore` (qdrant-client: a remote server, or
its in-memory local mode for tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rm_qdrant.core.merge import PointId, check_distance
from rm_qdrant.errors import ConfigError, DimensionMismatch
from rm_qdrant.store.filters import Filter, Where
from rm_qdrant.store.vectors import OtherVector

if TYPE_CHECKING:
    from qdrant_client import models


#: Payload index kinds a store can create (and mirror from a team's collection).
INDEX_KINDS = ("integer", "float", "keyword", "bool", "datetime", "uuid", "text", "geo")


@dataclass(frozen=True)
class CollectionSpec:
    """One dense vector of a collection: its size and distance.

    Attributes:
        name: the collection.
        dim: the vector's size.
        distance: its distance (``cosine``, ``dot``, ``euclid``, ``manhattan``).
        vector: the vector's name; ``""`` is the unnamed vector of a single-vector collection.
        vectors: every dense vector name the collection has.
        sparse: every sparse vector name it has.
        multivector: whether this vector is a multivector.
        extra: every vector besides this one, with its config.
    """

    name: str
    dim: int
    distance: str
    vector: str = ""
    vectors: tuple[str, ...] = ("",)
    sparse: tuple[str, ...] = ()
    multivector: bool = False
    extra: tuple[OtherVector, ...] = ()

    def others(self) -> list[str]:
        """The collection's vectors besides this one (dense and sparse), which a pair would not carry."""
        return [f"{n!r}" for n in self.vectors if n != self.vector] + [f"{n!r} (sparse)" for n in self.sparse]


#: What a store knows of one dense vector: (size, distance, multivector?).
VectorFacts = tuple[int, str, bool]


def pick_vector(
    name: str,
    specs: Mapping[str, VectorFacts],
    vector: str | None,
    sparse: Mapping[str, bool] | Sequence[str] = (),
) -> CollectionSpec:
    """The spec of ``vector`` among a collection's vectors (None: its only one); ``sparse``: the
    sparse vectors' names (a mapping: name -> whether it has the IDF modifier).

    Raises:
        ConfigError: the collection has no such vector, or several and none was named.
    """
    names = tuple(sorted(specs))
    if not names:
        raise ConfigError(f"collection {name!r} has no dense vector (only sparse ones): nothing to search by")
    if vector is None:
        if len(names) != 1:
            shown = ", ".join(repr(n) for n in names)
            raise ConfigError(
                f"collection {name!r} has the named vectors {shown}: say which one (--old-vector NAME)"
            )
        vector = names[0]
    if vector not in specs:
        have = ", ".join(repr(n) for n in names if n) or "one unnamed vector"
        asked = f"vector named {vector!r}" if vector else "unnamed vector"
        raise ConfigError(f"collection {name!r} has no {asked} (it has {have})")
    dim, distance, multi = specs[vector]
    idf = sparse if isinstance(sparse, Mapping) else dict.fromkeys(sparse, False)
    extra = tuple(OtherVector(n, *specs[n][:2], multivector=specs[n][2]) for n in names if n != vector)
    extra += tuple(OtherVector(n, sparse=True, idf=bool(idf[n])) for n in sorted(idf))
    return CollectionSpec(name, dim, distance, vector, names, tuple(sorted(idf)), multi, extra)


@dataclass(frozen=True)
class Record:
    """A stored point as read back: id, payload, (when asked for) one of its vectors, and
    (when asked for by name) others: name -> numpy array, or :class:`SparseVector`."""

    id: PointId
    payload: dict[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = None
    others: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoredRecord:
    """A search result straight from the store: id, raw Qdrant score, payload.

    ``in_new`` is set by :meth:`Store.merged_search` only: whether the hit came from the
    new vector's prefetch (the point has the new vector) rather than the old one's.
    """

    id: PointId
    score: float
    payload: dict[str, Any] = field(default_factory=dict)
    in_new: bool = False


@dataclass(frozen=True)
class MergedQuery:
    """What :meth:`Store.merged_search` runs for each row: both vectors of one collection
    searched in one request, and the union ranked by distance (see :mod:`rm_qdrant.core.merge`).

    The old prefetch sees only points that lack ``new_vector``, so each point counts once.
    ``search_params``, ``timeout`` and ``consistency`` are :meth:`Store.search`'s; both
    prefetches take ``search_params``.
    """

    old_vector: str
    new_vector: str
    distance: str
    limit: int
    filter: Filter | None = None
    exact: bool = False
    hnsw_ef: int | None = None
    search_params: models.SearchParams | None = None
    timeout: int | None = None
    consistency: models.ReadConsistency | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a store does beyond the calls every :class:`Store` answers, declared by the store
    (callers read this instead of probing its attributes).

    Attributes:
        concurrent_search: two searches gain from being sent at once (a remote server).
        filtered_recall: a merged search's old prefetch keeps its recall under a filter that
            matches few points: ACORN (store/params.py), or an exact search (qdrant-client's
            local mode).
        optimizes: the store builds its HNSW indexes only when asked (``optimize(name)``): the
            embedded store, which has no background optimizer.
        shard_folders: each collection is a folder of this machine (``shard_path(name)``,
            ``linked_shard(name)``): the embedded store.
    """

    concurrent_search: bool = False
    filtered_recall: bool = False
    optimizes: bool = False
    shard_folders: bool = False


class Store(Protocol):
    """What rm-qdrant needs from Qdrant. Every write returns once it is durable.

    Methods that read or write vectors take ``vector``: the name of the dense vector
    they concern (``""``, the default, is the unnamed vector of a single-vector collection).
    Those that take ``others`` also carry a point's further vectors, which rm-qdrant does not
    manage: one mapping per point (name -> list of floats, or
    :class:`~rm_qdrant.store.vectors.SparseVector`) to write, or the names to read into
    :attr:`Record.others`.
    """

    #: What this store does beyond these calls.
    capabilities: Capabilities

    def create_collection(
        self, name: str, *, dim: int, distance: str, vector: str = "", others: Sequence[OtherVector] = ()
    ) -> None:
        """Create a collection with ``vector`` and, with ``others``, further vectors of those configs."""
        ...

    def collection(self, name: str, vector: str | None = None) -> CollectionSpec:
        """The spec of one of the collection's vectors (None: its only vector).

        Raises CollectionNotFound if the collection does not exist, ConfigError if the
        vector does not (or is ambiguous)."""
        ...

    def has_collection(self, name: str) -> bool:
        """Whether a collection (not an alias) of that name exists."""
        ...

    def list_collections(self) -> list[str]: ...

    def delete_collection(self, name: str) -> None: ...

    def add_vector(self, name: str, vector: str, *, dim: int, distance: str) -> None:
        """Add a named dense vector to an existing collection (its points do not have it yet)."""
        ...

    def drop_vector(self, name: str, vector: str) -> None:
        """Remove a named vector from a collection and from every point."""
        ...

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
        """Set one named vector of existing points (and each row's ``others``), leaving their
        other vectors and payload as they are. Ids no longer there are skipped; with ``where``,
        so are points that do not match it at the moment of the write (checked and written in
        one operation)."""
        ...

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
        """Write whole points (``vector``, each row's ``others``, the payload): a point that
        exists is replaced, vectors not given included. ``insert_only`` leaves points that
        already exist untouched."""
        ...

    def delete(
        self, name: str, ids: Sequence[PointId], *, where: Where | None = None, vectors: Sequence[str] = ()
    ) -> None:
        """Delete the listed points; with ``where``, only those that match it, checked and
        deleted in one operation (a point rewritten meanwhile without the match survives).
        With ``vectors``, delete only those named vectors of the points (missing ids skipped)."""
        ...

    def mark(
        self, name: str, ids: Sequence[PointId], payload: Mapping[str, Any], *, where: Where | None = None
    ) -> None:
        """Merge the same payload into every listed point, in one operation; missing ids are skipped.
        With ``where``, only into those that match it, checked in the same operation."""
        ...

    def clear_fields(self, name: str, fields: Sequence[str]) -> None:
        """Remove these payload fields from every point that has one (one operation)."""
        ...

    def set_payload(self, name: str, items: Sequence[tuple[PointId, Mapping[str, Any]]]) -> int:
        """Merge each payload into its point's payload; ids no longer there are skipped.

        Returns how many points were updated.
        """
        ...

    def create_index(self, name: str, field_name: str, kind: str) -> None:
        """Index a payload field (one of :data:`INDEX_KINDS`); idempotent."""
        ...

    def payload_indexes(self, name: str) -> dict[str, str]:
        """The collection's payload indexes, field -> kind (kinds rm-qdrant can create)."""
        ...

    def copy_indexes(self, source: str, target: str, fields: Sequence[str]) -> None:
        """Index ``fields`` of ``target`` as ``source`` indexes them, settings included (a text
        index's tokenizer and case, a keyword index's tenancy...); fields ``source`` does not
        index, or ``target`` already does, are left alone."""
        ...

    def tune_index(self, name: str, vectors: Sequence[str], *, full_scan_kb: int) -> None:
        """Give ``vectors`` of collection ``name`` this HNSW ``full_scan_threshold`` (KB), where
        the store has one (qdrant-client's local mode always scans: it keeps its own)."""
        ...

    def index_thresholds(self, name: str) -> dict[str, int]:
        """Each vector's HNSW ``full_scan_threshold`` (KB); empty where the store has none."""
        ...

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
        """The points of ``ids`` that exist (their payload empty without ``with_payload``), with
        the vectors named in ``others`` that they have."""
        ...

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
        """A page of points. With ``order_by`` (an indexed numeric field) the page holds the
        ``limit`` points with the lowest values, and there is no next offset. Without
        ``with_payload`` the records' payloads are empty."""
        ...

    def count(self, name: str, where: Where | None = None) -> int: ...

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection`` (replacing where it pointed before)."""
        ...

    def alias(self, alias: str) -> str | None:
        """The collection ``alias`` points at, or None."""
        ...

    def search(
        self,
        name: str,
        queries: np.ndarray,
        *,
        limit: int,
        filter: Filter | None = None,
        exact: bool = False,
        hnsw_ef: int | None = None,
        vector: str = "",
        search_params: models.SearchParams | None = None,
        timeout: int | None = None,
        consistency: models.ReadConsistency | None = None,
    ) -> list[list[ScoredRecord]]:
        """One result list per row of ``queries`` (a 2-D float array), searched on ``vector``.

        ``exact`` scans every point; otherwise the HNSW index is used where one is
        built, with ``hnsw_ef`` candidates (Qdrant's default when None). ``search_params``
        (qdrant-client's ``models.SearchParams``: ``indexed_only``, ``quantization``...) is
        the rest; ``exact`` and ``hnsw_ef`` fill in what it leaves unset. ``timeout``
        (seconds) and ``consistency`` (replicas to read) are the request's, for a server;
        in-process stores accept and ignore them.

        Raises:
            ConfigError: a bad parameter, one the store cannot express, or ``exact`` or
                ``hnsw_ef`` contradicting ``search_params``.
        """
        ...

    def merged_search(
        self, name: str, old_queries: np.ndarray, new_queries: np.ndarray, query: MergedQuery
    ) -> list[list[ScoredRecord]]:
        """Search two vectors of one collection in one request per row: a prefetch on
        ``query.old_vector`` (points without the new vector), one on ``query.new_vector``,
        and a formula that ranks their union by distance. Scores are the raw Qdrant scores.

        Raises:
            Unsupported: the server cannot run such a query (Qdrant before 1.20).
        """
        ...

    def close(self) -> None: ...


def resolve(store: Store, name: str) -> str:
    """The collection ``name`` stands for: itself, or the collection an alias of that name points at."""
    if store.has_collection(name):
        return name
    return store.alias(name) or name


def check_collection_name(name: str) -> str:
    """Reject names that are empty or could escape a store folder."""
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise ConfigError(f"invalid collection name {name!r}: use letters, digits, '-', '_' and '.'")
    return name


def check_vectors(spec: CollectionSpec, vectors: np.ndarray, *, rows: int | None = None) -> np.ndarray:
    """Return ``vectors`` as a float32 matrix, or raise if its shape does not fit ``spec``."""
    array = as_floats(vectors, f"vectors for {spec.name!r}")
    if array.ndim != 2 or array.shape[1] != spec.dim:
        raise DimensionMismatch(
            f"collection {spec.name!r} holds {spec.dim}-d vectors, got shape {array.shape}"
        )
    if rows is not None and array.shape[0] != rows:
        raise ConfigError(f"got {array.shape[0]} vectors for {rows} ids")
    if not np.isfinite(array).all():
        raise ConfigError(f"vectors for {spec.name!r} contain NaN or infinity")
    return array


def as_floats(vectors: Any, what: str) -> np.ndarray:
    """``vectors`` as a float32 array, or a ConfigError in one line where they are not numbers
    (strings, ragged rows, objects: numpy's ValueError / TypeError)."""
    try:
        raw = vectors if isinstance(vectors, np.ndarray) else np.asarray(vectors)
        _real_numbers(raw, what)
        with np.errstate(over="ignore"):  # a value past float32's range becomes inf, refused as such
            return np.asarray(raw, dtype=np.float32)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ConfigError(f"{what}: not a matrix of numbers ({str(exc).splitlines()[0][:80]})") from None


def _real_numbers(raw: np.ndarray, what: str) -> None:
    """Refuse complex numbers (numpy dropped the imaginary part, with a warning) and None (numpy
    made it NaN, refused as "NaN or infinity", which the caller never gave)."""
    if raw.dtype.kind == "c":
        raise ConfigError(f"{what}: complex numbers; a vector holds real ones")
    if raw.dtype.kind == "O" and any(one is None for one in raw.reshape(-1)):
        raise ConfigError(f"{what}: not a matrix of numbers (it holds None)")


def check_spec(
    name: str, dim: int, distance: str, vector: str = "", others: Sequence[OtherVector] = ()
) -> CollectionSpec:
    """Validate the arguments of ``create_collection``."""
    for size in [dim, *(o.dim for o in others if not o.sparse)]:
        if size <= 0:
            raise ConfigError(f"vector size must be positive, got {size}")
    names = [vector, *(o.name for o in others)]
    if len(set(names)) != len(names) or (len(names) > 1 and "" in names[1:]):
        raise ConfigError(f"vector names must be distinct, and only the first may be unnamed: {names}")
    for other in others:
        if not other.sparse:
            check_distance(other.distance)
    dense = (vector, *(o.name for o in others if not o.sparse))
    sparse = tuple(sorted(o.name for o in others if o.sparse))
    spec = CollectionSpec(check_collection_name(name), int(dim), check_distance(distance), vector)
    return replace(spec, vectors=tuple(sorted(dense)), sparse=sparse, extra=tuple(others))
