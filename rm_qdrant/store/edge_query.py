"""qdrant-edge's side of the embedded store: its vector config, filters and queries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe
from qdrant_client import models

from rm_qdrant.core.merge import UNSEEN, PointId, higher_is_closer
from rm_qdrant.errors import ConfigError
from rm_qdrant.store.base import (
    CollectionSpec,
    Filter,
    MergedQuery,
    ScoredRecord,
    VectorFacts,
    Where,
    check_vectors,
    pick_vector,
)
from rm_qdrant.store.filters import as_where, match_values
from rm_qdrant.store.ids import normalize_id
from rm_qdrant.store.params import check_consistency, check_timeout, merge_params, old_side_params
from rm_qdrant.store.points import merged_from
from rm_qdrant.store.qfilter import bool_refusal, has_id, to_edge
from rm_qdrant.store.vectors import SparseVector

DISTANCES = {
    "cosine": qe.Distance.Cosine,
    "dot": qe.Distance.Dot,
    "euclid": qe.Distance.Euclid,
    "manhattan": qe.Distance.Manhattan,
}


def condition(key: str, value: Any) -> qe.FieldCondition:
    many, one = match_values(value)
    if any(isinstance(v, bool) for v in (many if many is not None else [one])):
        raise bool_refusal(key)
    return qe.FieldCondition(key=key, match=qe.MatchAny(many) if many is not None else qe.MatchValue(one))


def edge_filter(filter: Filter | None, ids: Sequence[PointId] | None = None) -> qe.Filter | None:
    where = as_where(filter)
    if where is None and ids is None:
        return None
    try:
        return _edge_filter(where or Where(), ids)
    except (ValueError, TypeError) as exc:  # qdrant-edge's own refusal (a bad key path, say)
        raise ConfigError(f"a filter the embedded store cannot read: {exc}") from None


def _edge_filter(where: Where, ids: Sequence[PointId] | None) -> qe.Filter:
    must: list[Any] = [condition(k, v) for k, v in where.must.items()]
    if ids is not None:
        must.append(has_id(ids))
    must += [qe.IsEmptyCondition(k) for k in where.empty]
    must += [qe.HasVectorCondition(v) for v in where.has_vector]
    must += [to_edge(c) for c in where.clauses]
    if where.slice is not None:
        must.append(qe.SliceCondition(index=where.slice[0], total=where.slice[1]))
    must_not: list[Any] = [condition(k, v) for k, v in where.must_not.items()]
    must_not += [qe.IsEmptyCondition(k) for k in where.not_empty]
    must_not += [qe.HasVectorCondition(v) for v in where.lacks_vector]
    return qe.Filter(must=must or None, must_not=must_not or None)


def sparse(vector: SparseVector) -> qe.SparseVector:
    return qe.SparseVector(list(vector.indices), list(vector.values))


def edge_config(spec: CollectionSpec) -> qe.EdgeConfig:
    """The shard config of a new collection: its vector, and the others of ``spec.extra``."""
    params = qe.EdgeVectorParams(size=spec.dim, distance=DISTANCES[spec.distance])
    if not spec.extra:
        return qe.EdgeConfig(vectors={spec.vector: params} if spec.vector else params)
    dense = {spec.vector: params}
    for other in (o for o in spec.extra if not o.sparse):
        multi = qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim) if other.multivector else None
        dense[other.name] = qe.EdgeVectorParams(
            size=other.dim, distance=DISTANCES[other.distance], multivector_config=multi
        )
    sparse_params = {
        o.name: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf if o.idf else None)
        for o in spec.extra
        if o.sparse
    }
    return qe.EdgeConfig(vectors=dense, sparse_vectors=sparse_params or None)


#: The fields of qdrant-client's ``SearchParams`` that qdrant-edge's own ``SearchParams`` takes.
_EDGE_FIELDS = ("hnsw_ef", "exact", "quantization", "indexed_only", "acorn")
_EDGE_SET = frozenset(_EDGE_FIELDS)
#: qdrant-edge's SearchParams without quantization, by (hnsw_ef, exact, indexed_only, acorn):
#: made once (a search's parameters took as long to convert as its merge).
_PLAIN: dict[tuple[Any, ...], qe.SearchParams] = {}


def edge_params(
    *,
    search_params: models.SearchParams | None = None,
    exact: bool = False,
    hnsw_ef: int | None = None,
    timeout: int | None = None,
    consistency: models.ReadConsistency | None = None,
    old_side: bool = False,
) -> qe.SearchParams:
    """qdrant-client's search parameters (``exact``, ``hnsw_ef`` filling in what ``search_params`` leaves
    unset) as qdrant-edge's; ``old_side``: a merged query's old prefetch's (ACORN, see
    :func:`~rm_qdrant.store.params.old_side_params`). ``timeout`` and ``consistency`` are checked
    and have no effect: the shard is in this process (no network) and is its own only replica.

    Raises:
        ConfigError: a bad value, or a parameter qdrant-edge cannot express (named).
    """
    check_timeout(timeout)
    check_consistency(consistency)
    params = merge_params(search_params, exact or None, hnsw_ef)
    if old_side:
        params = old_side_params(params)
    for name in params.model_fields_set - _EDGE_SET:  # a field never set is None
        if getattr(params, name) is not None:
            raise ConfigError(f"search_params.{name} is not supported by the embedded store (qdrant-edge)")
    q, acorn = params.quantization, params.acorn
    key = (
        params.hnsw_ef,
        bool(params.exact),
        bool(params.indexed_only),
        None if acorn is None else (bool(acorn.enable), acorn.max_selectivity),
    )
    if q is None and key in _PLAIN:
        return _PLAIN[key]
    quantization = (
        None if q is None else qe.QuantizationSearchParams(bool(q.ignore), q.rescore, q.oversampling)
    )
    made = qe.SearchParams(
        hnsw_ef=params.hnsw_ef,
        exact=bool(params.exact),
        indexed_only=bool(params.indexed_only),
        quantization=quantization,
        acorn=None if acorn is None else qe.AcornSearchParams(bool(acorn.enable), acorn.max_selectivity),
    )
    if q is None and len(_PLAIN) < 256:
        _PLAIN[key] = made
    return made


def search_requests(
    rows: list[list[float]], vector: str, limit: int, where: qe.Filter | None, params: qe.SearchParams
) -> list[qe.QueryRequest]:
    """One nearest-neighbour request per query row, on ``vector``."""
    return [
        qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(row, using=vector or None),
            with_payload=True,
            filter=where,
            params=params,
        )
        for row in rows
    ]


def edge_search(
    shard: qe.EdgeShard,
    specs: Specs,
    name: str,
    queries: Any,
    *,
    limit: int,
    vector: str = "",
    filter: Filter | None = None,
    **params: Any,  # exact, hnsw_ef, search_params, timeout, consistency: edge_params's
) -> list[list[ScoredRecord]]:
    """:meth:`EdgeStore.search` on an open shard (``specs``: its vectors)."""
    rows = query_rows(specs, name, vector, queries).tolist()
    requests = search_requests(rows, vector, limit, edge_filter(filter), edge_params(**params))
    # A point's payload comes back as a new dict on each read: it is not copied again.
    return [
        [ScoredRecord(normalize_id(p.id), p.score, p.payload or {}) for p in hits]
        for hits in run(shard, requests)
    ]


def query_rows(specs: Specs, name: str, vector: str, queries: Any) -> np.ndarray:
    """``queries`` as a float32 matrix for ``vector`` (:func:`check_vectors`, without building the
    collection's spec where the vector is a plain dense one)."""
    facts = specs[0].get(vector)
    if facts is None or facts[2]:  # no such vector, or a multivector: pick_vector says what is wrong
        return check_vectors(pick_vector(name, specs[0], vector, specs[1]), queries)
    array = np.asarray(queries, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != facts[0] or not np.isfinite(array).all():
        return check_vectors(pick_vector(name, specs[0], vector, specs[1]), array)  # its error
    return array


def edge_merged_search(
    shard: qe.EdgeShard, specs: tuple[CollectionSpec, CollectionSpec], old: Any, new: Any, query: MergedQuery
) -> list[list[ScoredRecord]]:
    """:meth:`EdgeStore.merged_search` on an open shard (``specs``: the old and new vector's)."""
    old_rows = check_vectors(specs[0], old)
    new_rows = check_vectors(specs[1], new, rows=len(old_rows))
    requests = merged_requests(query, old_rows.tolist(), new_rows.tolist())
    return [[merged_from(p, query) for p in hits] for hits in run(shard, requests)]


def run(shard: qe.EdgeShard, requests: list[qe.QueryRequest]) -> list[list[Any]]:
    if len(requests) == 1:
        return [shard.query(requests[0])]
    return list(shard.query_batch(qe.QueryBatchRequest(requests))) if requests else []


def merged_requests(
    query: MergedQuery, old: list[list[float]], new: list[list[float]]
) -> list[qe.QueryRequest]:
    """One request per row: a prefetch per vector, the union ranked by ``max`` of the signed scores."""
    params, old_params = (
        edge_params(
            search_params=query.search_params,
            exact=query.exact,
            hnsw_ef=query.hnsw_ef,
            timeout=query.timeout,
            consistency=query.consistency,
            old_side=old_side,
        )
        for old_side in (False, True)
    )
    where = as_where(query.filter) or Where()
    old_filter = edge_filter(where & Where(lacks_vector=(query.new_vector,)))
    new_filter = edge_filter(where)
    sign = higher_is_closer(query.distance)
    scores = [qe.Expression.Variable(f"$score[{k}]") for k in (0, 1)]
    if sign < 0:
        scores = [qe.Expression.Neg(s) for s in scores]
    formula = qe.Formula(qe.Expression.Max(scores), defaults={f"$score[{k}]": -sign * UNSEEN for k in (0, 1)})
    requests = [
        qe.QueryRequest(
            limit=query.limit,
            prefetches=[
                qe.Prefetch(
                    limit=query.limit,
                    query=qe.Query.Nearest(o, using=query.old_vector or None),
                    filter=old_filter,
                    params=old_params,
                ),
                qe.Prefetch(
                    limit=query.limit,
                    query=qe.Query.Nearest(n, using=query.new_vector),
                    filter=new_filter,
                    params=params,
                ),
            ],
            query=formula,
            with_payload=True,
            with_vector=[query.new_vector],
        )
        for o, n in zip(old, new, strict=True)
    ]
    return requests


Specs = tuple[dict[str, VectorFacts], dict[str, bool]]  # dense vectors by name, sparse: name -> IDF?


def read_specs(folder: Path, name: str) -> Specs:
    """A collection's vectors, from the shard's own config (or an older rm-qdrant spec)."""
    try:
        raw = json.loads((folder / "shard" / "edge_config.json").read_text())
        dense = {
            str(k): (int(v["size"]), str(v["distance"]).lower(), bool(v.get("multivector_config")))
            for k, v in raw["vectors"].items()
        }
        sparse = raw.get("sparse_vectors") or {}
        return dense, {str(k): str((v or {}).get("modifier", "")).lower() == "idf" for k, v in sparse.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    try:
        raw = json.loads((folder / "spec.json").read_text())
        if "vectors" in raw:
            return {k: (int(v[0]), str(v[1]), False) for k, v in raw["vectors"].items()}, {}
        return {"": (int(raw["dim"]), str(raw["distance"]), False)}, {}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ConfigError(f"cannot read the vector config of collection {name!r}: {exc}") from exc
