"""qdrant-client's side of :class:`~rm_qdrant.store.client.ClientStore`: its errors, vector
configs, filters and queries (built from rm-qdrant's :class:`Where` and :class:`MergedQuery`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
from qdrant_client import models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from rm_qdrant.core.merge import UNSEEN, PointId, higher_is_closer
from rm_qdrant.core.redact import redact
from rm_qdrant.errors import CollectionNotFound, StoreError, Unsupported
from rm_qdrant.store.base import CollectionSpec, Filter, MergedQuery, VectorFacts, Where
from rm_qdrant.store.filters import as_where, equality
from rm_qdrant.store.ids import normalize_id
from rm_qdrant.store.params import check_consistency, check_timeout, merge_params
from rm_qdrant.store.vectors import SparseVector

DISTANCES = {
    "cosine": models.Distance.COSINE,
    "dot": models.Distance.DOT,
    "euclid": models.Distance.EUCLID,
    "manhattan": models.Distance.MANHATTAN,
}


_NAMES = {v: k for k, v in DISTANCES.items()}


@contextlib.contextmanager
def translated(where: str, what: str, collection: str | None = None) -> Iterator[None]:
    """qdrant-client's errors (HTTP status codes, connection failures, the local mode's
    ``ValueError``) as :mod:`rm_qdrant.errors` exceptions, with ``what`` failed ``where``."""
    try:
        yield
    except UnexpectedResponse as exc:
        if exc.status_code == 404 and collection is not None:
            raise CollectionNotFound(f"collection {collection!r} not found in {where}") from exc
        if exc.status_code in (401, 403):
            raise StoreError(f"{where} rejected the API key ({exc.status_code})") from exc
        detail = redact(exc.content.decode(errors="replace"))[:300]
        raise StoreError(f"{what} failed on {where}: HTTP {exc.status_code} {detail}") from exc
    except (ResponseHandlingException, httpx.HTTPError, ConnectionError) as exc:
        raise StoreError(f"cannot reach {where}: {redact(str(exc))}") from exc
    except ValueError as exc:  # the in-memory mode reports faults as ValueError
        if "not found" in str(exc) and collection is not None:
            raise CollectionNotFound(f"collection {collection!r} not found in {where}") from exc
        raise StoreError(f"{what} failed on {where}: {redact(str(exc))}") from exc


def vector_facts(info: models.CollectionInfo) -> tuple[dict[str, VectorFacts], dict[str, bool]]:
    """A collection's dense vectors (name -> size, distance, multivector?) and sparse ones
    (name -> IDF modifier?), from qdrant-client's collection info."""
    params = info.config.params.vectors or {}
    named = params if isinstance(params, dict) else {"": params}
    dense = {
        str(k): (int(v.size), _NAMES[v.distance], v.multivector_config is not None)
        for k, v in named.items()
        if v is not None
    }
    idf = {
        str(k): v is not None and v.modifier == models.Modifier.IDF
        for k, v in (info.config.params.sparse_vectors or {}).items()
    }
    return dense, idf


def query_options(
    search_params: models.SearchParams | None,
    exact: bool,
    hnsw_ef: int | None,
    timeout: int | None,
    consistency: models.ReadConsistency | None,
    remote: bool,
) -> tuple[models.SearchParams | None, dict[str, Any]]:
    """A search's ``params`` (``exact``, ``hnsw_ef`` filling in what ``search_params`` leaves
    unset) and the ``timeout`` and ``consistency`` keywords of ``query_batch_points``.

    The local mode gets no params (it always searches exactly, and warns about them) but the
    same keywords, which it accepts and ignores.
    """
    params = merge_params(search_params, exact or None, hnsw_ef)
    options = {"timeout": check_timeout(timeout), "consistency": check_consistency(consistency)}
    return (params if remote else None), options


def merged_options(query: MergedQuery, remote: bool) -> tuple[models.SearchParams | None, dict[str, Any]]:
    """:func:`query_options` of a merged query."""
    return query_options(
        query.search_params, query.exact, query.hnsw_ef, query.timeout, query.consistency, remote
    )


@contextlib.contextmanager
def unsupported_merge(where: str) -> Iterator[None]:
    """A server's refusal of the merged query's formula or prefetches as :class:`Unsupported`."""
    try:
        yield
    except StoreError as exc:
        if "HTTP 4" in str(exc) and any(w in str(exc).lower() for w in ("formula", "max", "prefetch")):
            raise Unsupported(f"Qdrant at {where} cannot merge in one query: {exc}") from exc
        raise


def client_search(
    rows: list[list[float]],
    limit: int,
    vector: str,
    remote: bool,
    *,
    filter: Filter | None = None,
    exact: bool = False,
    hnsw_ef: int | None = None,
    search_params: models.SearchParams | None = None,
    timeout: int | None = None,
    consistency: models.ReadConsistency | None = None,
) -> tuple[list[models.QueryRequest], dict[str, Any]]:
    """:meth:`ClientStore.search`'s requests and ``query_batch_points`` keywords."""
    params, options = query_options(search_params, exact, hnsw_ef, timeout, consistency, remote)
    return search_requests(rows, vector, limit, client_filter(filter), params), options


def search_requests(
    rows: list[list[float]],
    vector: str,
    limit: int,
    where: models.Filter | None,
    params: models.SearchParams | None,
) -> list[models.QueryRequest]:
    """One nearest-neighbour request per query row, on ``vector``."""
    return [
        models.QueryRequest(
            query=row, using=vector or None, limit=limit, filter=where, params=params, with_payload=True
        )
        for row in rows
    ]


def sparse(vector: SparseVector) -> models.SparseVector:
    return models.SparseVector(indices=list(vector.indices), values=list(vector.values))


def vectors_config(spec: CollectionSpec) -> tuple[Any, dict[str, models.SparseVectorParams] | None]:
    """A new collection's dense and sparse configs: its vector, and the others of ``spec.extra``."""
    params = models.VectorParams(size=spec.dim, distance=DISTANCES[spec.distance])
    if not spec.extra:
        return ({spec.vector: params} if spec.vector else params), None
    dense: dict[str, models.VectorParams] = {spec.vector: params}
    for other in (o for o in spec.extra if not o.sparse):
        multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
        dense[other.name] = models.VectorParams(
            size=other.dim,
            distance=DISTANCES[other.distance],
            multivector_config=multi if other.multivector else None,
        )
    sparse_params = {
        o.name: models.SparseVectorParams(modifier=models.Modifier.IDF if o.idf else None)
        for o in spec.extra
        if o.sparse
    }
    if list(dense) == [""]:
        return params, sparse_params or None
    return dense, sparse_params or None


def client_filter(filter: Filter | None, ids: Sequence[PointId] | None = None) -> models.Filter | None:
    where = as_where(filter)
    if where is None and ids is None:
        return None
    where = where or Where()
    by_id = [] if ids is None else [models.HasIdCondition(has_id=[normalize_id(i) for i in ids])]
    empty = [models.IsEmptyCondition(is_empty=models.PayloadField(key=k)) for k in where.empty]
    present = [models.IsEmptyCondition(is_empty=models.PayloadField(key=k)) for k in where.not_empty]
    must: list[Any] = [equality(k, v) for k, v in where.must.items()] + empty + by_id
    must += [models.HasVectorCondition(has_vector=v) for v in where.has_vector]
    must += list(where.clauses)
    if where.slice is not None:
        index, total = where.slice
        must.append(models.SliceCondition(slice=models.Slice(index=index, total=total)))
    must_not: list[Any] = [equality(k, v) for k, v in where.must_not.items()] + present
    must_not += [models.HasVectorCondition(has_vector=v) for v in where.lacks_vector]
    return models.Filter(must=must or None, must_not=must_not or None)


def takes_acorn(version: str) -> bool:
    """Whether a Qdrant server of ``version`` takes ACORN's search parameters (1.16 and later)."""
    parts = re.match(r"v?(\d+)\.(\d+)", version or "")
    return parts is not None and (int(parts[1]), int(parts[2])) >= (1, 16)


def merged_requests(
    query: MergedQuery,
    old: list[list[float]],
    new: list[list[float]],
    params: models.SearchParams | None,
    old_params: models.SearchParams | None = None,
) -> list[models.QueryRequest]:
    """One request per row: a prefetch per vector, the union ranked by ``max`` of the signed scores.
    The old prefetch takes ``old_params`` where given (ACORN, see store/params.py), else ``params``."""
    where = as_where(query.filter) or Where()
    old_filter = client_filter(where & Where(lacks_vector=(query.new_vector,)))
    new_filter = client_filter(where)
    sign = higher_is_closer(query.distance)
    scores: list[Any] = [f"$score[{k}]" for k in (0, 1)]
    if sign < 0:
        scores = [models.NegExpression(neg=v) for v in scores]
    formula = models.FormulaQuery(
        formula=models.MaxExpression(max=scores),
        defaults={f"$score[{k}]": -sign * UNSEEN for k in (0, 1)},
    )
    requests = [
        models.QueryRequest(
            prefetch=[
                models.Prefetch(
                    query=o,
                    using=query.old_vector or None,
                    filter=old_filter,
                    limit=query.limit,
                    params=old_params or params,
                ),
                models.Prefetch(
                    query=n, using=query.new_vector, filter=new_filter, limit=query.limit, params=params
                ),
            ],
            query=formula,
            limit=query.limit,
            with_payload=True,
            with_vector=[query.new_vector],
        )
        for o, n in zip(old, new, strict=True)
    ]
    return requests
