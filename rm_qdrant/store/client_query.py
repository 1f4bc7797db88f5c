"""qdrant-client's filters and queries, built from rm-qdrant's :class:`Where` and :class:`MergedQuery`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qdrant_client import models

from rm_qdrant.core.merge import UNSEEN, PointId, higher_is_closer
from rm_qdrant.store.base import Filter, MergedQuery, Where, normalize_id
from rm_qdrant.store.filters import as_where, match_values


def condition(key: str, value: Any) -> models.FieldCondition:
    many, one = match_values(value)
    match: Any = models.MatchAny(any=many) if many is not None else models.MatchValue(value=one)
    return models.FieldCondition(key=key, match=match)


def client_filter(filter: Filter | None, ids: Sequence[PointId] | None = None) -> models.Filter | None:
    where = as_where(filter)
    if where is None and ids is None:
        return None
    where = where or Where()
    by_id = [] if ids is None else [models.HasIdCondition(has_id=[normalize_id(i) for i in ids])]
    empty = [models.IsEmptyCondition(is_empty=models.PayloadField(key=k)) for k in where.empty]
    present = [models.IsEmptyCondition(is_empty=models.PayloadField(key=k)) for k in where.not_empty]
    must: list[Any] = [condition(k, v) for k, v in where.must.items()] + empty + by_id
    must += [models.HasVectorCondition(has_vector=v) for v in where.has_vector]
    if where.slice is not None:
        index, total = where.slice
        must.append(models.SliceCondition(slice=models.Slice(index=index, total=total)))
    must_not: list[Any] = [condition(k, v) for k, v in where.must_not.items()] + present
    must_not += [models.HasVectorCondition(has_vector=v) for v in where.lacks_vector]
    return models.Filter(must=must or None, must_not=must_not or None)


def merged_requests(
    query: MergedQuery, old: list[list[float]], new: list[list[float]], params: models.SearchParams | None
) -> list[models.QueryRequest]:
    """One request per row: a prefetch per vector, the union ranked by ``max`` of the signed scores."""
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
                    params=params,
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
