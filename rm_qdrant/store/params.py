"""A search's request parameters in qdrant-client's vocabulary: ``models.SearchParams``
(merged with the ``exact`` / ``hnsw_ef`` shorthands), the request ``timeout`` and the read
``consistency``, checked once per call so a bad value is one :class:`ConfigError`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from qdrant_client import models

from rm_qdrant.errors import ConfigError
from rm_qdrant.store.bounds import MAX_HITS
from rm_qdrant.store.qfilter import json_path

_CONSISTENCIES = ", ".join(repr(t.value) for t in models.ReadConsistencyType)


def merge_params(
    given: models.SearchParams | Mapping[str, Any] | None,
    exact: bool | None = None,
    hnsw_ef: int | None = None,
) -> models.SearchParams:
    """``given`` (a ``models.SearchParams`` or a dict of its fields) with ``exact`` and ``hnsw_ef``
    filled in where it leaves them unset (None: not asked).

    Raises:
        ConfigError: ``given`` is not search parameters; a value is out of range; ``exact`` or
            ``hnsw_ef`` contradicts what ``given`` says; ``idf`` (sparse vectors only) is set.
    """
    params = _as_params(given)
    if params is None:
        # exact=None stays unset, so with_defaults can give the index's own exact
        return models.SearchParams(hnsw_ef=hnsw_ef, **({} if exact is None else {"exact": exact}))
    named = params.model_fields_set
    if exact is not None and "exact" in named and params.exact != exact:
        raise ConfigError(f"exact={exact} contradicts search_params.exact={params.exact}: give one of them")
    if hnsw_ef is not None and params.hnsw_ef is not None and params.hnsw_ef != hnsw_ef:
        raise ConfigError(
            f"hnsw_ef={hnsw_ef} contradicts search_params.hnsw_ef={params.hnsw_ef}: give one of them"
        )
    update: dict[str, Any] = {}
    if exact is not None and "exact" not in named:
        update["exact"] = exact
    if hnsw_ef is not None and params.hnsw_ef is None:
        update["hnsw_ef"] = hnsw_ef
    return params.model_copy(update=update) if update else params


#: ACORN on the single-collection layout's old prefetch: its filter (the points that lack the new
#: vector) matches fewer points as the backfill goes on, and a filtered walk of the HNSW graph
#: then misses neighbours (recall@10 0.93 against 0.99 with ACORN at 75 % migrated, 25,000
#: points, ef 16). Qdrant uses it only under its own cut-off (max_selectivity 0.4: the filter
#: matches under 40 % of the points) and only where it walks the graph rather than scans.
OLD_SIDE_ACORN = models.AcornSearchParams(enable=True)


def old_side_params(params: models.SearchParams) -> models.SearchParams:
    """The old prefetch's parameters: ``params`` with :data:`OLD_SIDE_ACORN`, unless they set
    ``acorn`` themselves (``{"acorn": {"enable": False}}`` turns it off) or search exactly."""
    if params.exact or "acorn" in params.model_fields_set:
        return params
    return params.model_copy(update={"acorn": OLD_SIDE_ACORN})


def with_defaults(params: models.SearchParams, exact: bool, hnsw_ef: int | None) -> models.SearchParams:
    """``params`` with an index's own ``exact`` / ``hnsw_ef`` where it does not set them."""
    update: dict[str, Any] = {}
    if exact and "exact" not in params.model_fields_set:
        update["exact"] = True
    if hnsw_ef is not None and params.hnsw_ef is None:
        update["hnsw_ef"] = hnsw_ef
    return params.model_copy(update=update) if update else params


def _as_params(given: Any) -> models.SearchParams | None:
    if given is None:
        return None
    if isinstance(given, Mapping):
        try:
            given = models.SearchParams.model_validate(dict(given))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(f"bad search_params: {json_path(first['loc'])}: {first['msg']}") from None
    if not isinstance(given, models.SearchParams):
        raise ConfigError(f"search_params is a qdrant_client.models.SearchParams, got {type(given).__name__}")
    if given.hnsw_ef is not None and not 0 < given.hnsw_ef <= MAX_HITS:
        raise ConfigError(
            f"search_params.hnsw_ef must be an integer from 1 to {MAX_HITS}, got {given.hnsw_ef!r}"
        )
    quantization = given.quantization
    if (
        quantization is not None
        and quantization.oversampling is not None
        and not quantization.oversampling >= 1
    ):
        raise ConfigError(
            f"search_params.quantization.oversampling must be >= 1, got {quantization.oversampling!r}"
        )
    if given.idf is not None:
        raise ConfigError("search_params.idf applies to sparse vectors; rm-qdrant searches dense ones")
    return given


def check_timeout(timeout: Any) -> int | None:
    """A request timeout in whole seconds (qdrant-client's), or None."""
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0):
        raise ConfigError(f"timeout is a positive number of seconds (an integer), got {timeout!r}")
    return timeout


def check_consistency(consistency: Any) -> models.ReadConsistency | None:
    """A read consistency: a number of replicas, or one of ``models.ReadConsistencyType``."""
    if consistency is None or isinstance(consistency, models.ReadConsistencyType):
        return consistency
    if isinstance(consistency, int) and not isinstance(consistency, bool) and consistency > 0:
        return consistency
    if isinstance(consistency, str) and consistency in {t.value for t in models.ReadConsistencyType}:
        return models.ReadConsistencyType(consistency)
    raise ConfigError(
        f"consistency is a number of replicas (>= 1) or one of {_CONSISTENCIES} "
        f"(models.ReadConsistencyType), got {consistency!r}"
    )
