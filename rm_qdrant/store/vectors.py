"""The vectors a point carries besides the ones rm-qdrant manages: a team's other named
vectors, dense or sparse, in one form for both backends.

rm-qdrant never computes these: it reads them with a point and writes them back
unchanged, and checks the ones an application gives it against the collection's config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.errors import ConfigError, DimensionMismatch

_MAX_INDEX = 2**32 - 1  # Qdrant's sparse indices are u32


@dataclass(frozen=True)
class SparseVector:
    """A sparse vector: its indices (sorted, each once) and their values.

    :meth:`of` takes qdrant-client's ``models.SparseVector``, qdrant-edge's
    ``SparseVector``, this class, or a mapping with ``indices`` and ``values``.
    """

    indices: tuple[int, ...]
    values: tuple[float, ...]

    @classmethod
    def of(cls, value: Any, what: str = "sparse vector") -> SparseVector:
        """Check and sort a sparse vector in any of the accepted forms.

        Raises:
            ConfigError: it is not one, or its indices and values do not pair up.
        """
        if isinstance(value, Mapping):
            indices, values = value.get("indices"), value.get("values")
        else:
            indices, values = getattr(value, "indices", None), getattr(value, "values", None)
        if indices is None or values is None:
            raise ConfigError(f"{what} is sparse: expected indices and values (a SparseVector)")
        try:
            index = np.asarray(indices, dtype=np.float64).reshape(-1)
            weight = np.asarray(values, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: expected indices and values (a SparseVector)") from None
        if len(index) != len(weight):
            raise ConfigError(f"{what}: expected as many indices as values (a SparseVector)")
        whole = np.isfinite(index) & (index == np.round(index)) & (index >= 0) & (index <= _MAX_INDEX)
        if not whole.all() or len(np.unique(index)) != len(index):
            raise ConfigError(f"{what}: indices must be distinct integers from 0 to {_MAX_INDEX}")
        if not np.isfinite(weight).all():
            raise ConfigError(f"{what}: values contain NaN or infinity")
        order = np.argsort(index, kind="stable")
        return cls(tuple(int(i) for i in index[order]), tuple(float(v) for v in weight[order]))


@dataclass(frozen=True)
class OtherVector:
    """One of a collection's vectors, as a pair carries it: its name and config.

    Attributes:
        name: the vector's name (``""``: the unnamed vector).
        dim: a dense vector's size (0 for a sparse one).
        distance: a dense vector's distance (``""`` for a sparse one).
        sparse: whether it is a sparse vector.
        idf: a sparse vector with Qdrant's IDF modifier.
        multivector: a dense multivector (several rows per point).
    """

    name: str
    dim: int = 0
    distance: str = ""
    sparse: bool = False
    idf: bool = False
    multivector: bool = False

    def check(self, value: Any, collection: str) -> list[float] | list[list[float]] | SparseVector:
        """``value`` in the form the stores write, once it fits this vector.

        Raises:
            DimensionMismatch: a dense value of another size.
            ConfigError: a value of the wrong kind, or with NaN or infinity.
        """
        what = f"vector {self.name!r} of {collection!r}"
        if self.sparse:
            return SparseVector.of(value, what)
        if isinstance(value, SparseVector) or hasattr(value, "indices"):
            raise ConfigError(f"{what} is dense ({self.dim}-d): got a sparse vector")
        try:
            array = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: expected {self.dim} numbers") from None
        shape_ok = array.ndim == 2 and len(array) > 0 if self.multivector else array.ndim == 1
        if not shape_ok or array.shape[-1] != self.dim:
            rows = "rows of " if self.multivector else ""
            raise DimensionMismatch(f"{what} holds {rows}{self.dim} numbers, got shape {array.shape}")
        if not np.isfinite(array).all():
            raise ConfigError(f"{what} contains NaN or infinity")
        listed: list[float] | list[list[float]] = array.tolist()
        return listed


#: Other vectors as an application gives them: one mapping per point (name -> vector, as
#: qdrant-client's ``PointStruct.vector`` takes them; None or a missing name: none given), or
#: one mapping of name -> a column with one entry per point (a matrix, or a list with None
#: where a point gets none).
VectorRows = Sequence[Mapping[str, Any] | None] | Mapping[str, Any]


def check_others(
    collection: str,
    known: Mapping[str, OtherVector],
    given: VectorRows,
    rows: int,
    *,
    managed: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``given`` as one dict per point (name -> checked value), every name one of ``known``.

    ``managed`` names the vectors rm-qdrant writes itself, with the reason the message gives.

    Raises:
        ConfigError: a name the collection does not carry, or one of ``managed``, or a count
            of rows other than ``rows``.
        DimensionMismatch: a dense vector of another size.
    """
    per_point = _per_point(given, rows)
    out: list[dict[str, Any]] = []
    for row in per_point:
        checked: dict[str, Any] = {}
        for name, value in (row or {}).items():
            if value is None:
                continue
            if name not in known:
                raise ConfigError(_unknown(collection, str(name), known, managed or {}))
            checked[name] = known[name].check(value, collection)
        out.append(checked)
    return out


def _per_point(given: VectorRows, rows: int) -> list[Mapping[str, Any] | None]:
    if isinstance(given, Mapping):
        columns = {name: _column(name, column) for name, column in given.items()}
        wrong = {name: len(c) for name, c in columns.items() if len(c) != rows}
        if wrong:
            name, count = next(iter(wrong.items()))
            raise ConfigError(f"other vectors: {count} values of {name!r} for {rows} points")
        return [{name: column[k] for name, column in columns.items()} for k in range(rows)]
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise ConfigError("other vectors: give one mapping per point, or one mapping of name -> values")
    if len(given) != rows:
        raise ConfigError(f"other vectors: {len(given)} rows for {rows} points")
    if not all(row is None or isinstance(row, Mapping) for row in given):
        raise ConfigError("other vectors: each point's entry is a mapping of vector name -> vector")
    return list(given)


def _column(name: Any, column: Any) -> list[Any]:
    """One vector's column of a mapping of name -> values: one entry per point."""
    if isinstance(column, (str, bytes, Mapping)) or not isinstance(column, Iterable):
        raise ConfigError(
            f"other vectors: {name!r:.40} maps to {type(column).__name__} {column!r:.20}; give one "
            "vector per point (a matrix, or a list with None where a point gets none)"
        )
    return list(column)


def _unknown(collection: str, name: str, known: Mapping[str, OtherVector], managed: Mapping[str, str]) -> str:
    if name in managed:
        return f"vector {name!r} of {collection!r} is {managed[name]}: rm-qdrant writes it, not other_vectors"
    have = ", ".join(f"{n!r}" + (" (sparse)" if v.sparse else "") for n, v in known.items())
    listed = f"it has {have}" if have else "it has none"
    return f"collection {collection!r} has no other vector {name!r} ({listed})"


def read_vector(raw: Any) -> np.ndarray | SparseVector:
    """A vector as a backend returned it, in rm-qdrant's form (numpy for dense ones)."""
    if hasattr(raw, "indices"):
        return SparseVector(tuple(int(i) for i in raw.indices), tuple(float(v) for v in raw.values))
    return np.asarray(raw, dtype=np.float32)
