"""A seeded generator of the inputs a team's code may hand the public API, hostile ones first:
ids, vectors, payloads, filters and search options (test_fuzz_api.py)."""

from __future__ import annotations

import datetime
import math
import random
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
from qdrant_client import models

from tests.conftest import OLD_DIM

_STRINGS = ["", "a", "label", "meta.dept", "tags[]", "n", "\udcff", "é" * 3, "x" * 300, "rmq_moving", "1"]
_NUMBERS: list[Any] = [
    0, 1, -1, 5, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30,
    0.5, -0.0, 1e308, float("nan"), float("inf"), -float("inf"), True, False,
    np.int64(3), np.uint64(2**64 - 1), np.float32(1.5), np.float64("nan"), np.bool_(True), Decimal("1.5"),
]  # fmt: skip
_ODD: list[Any] = [
    None, b"x", {1, 2}, (1, 2), datetime.datetime(2025, 1, 1), datetime.date(2025, 1, 1), object(),
    uuid.UUID(int=5), np.zeros(2), complex(1, 2), math.pi,
]  # fmt: skip


class Inputs:
    """Hostile values of each kind a call takes, from one seeded ``random.Random``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, options: list[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def scalar(self) -> Any:
        return self.pick([self.pick(_STRINGS), self.pick(_NUMBERS), self.pick(_NUMBERS), self.pick(_ODD)])

    def point_id(self) -> Any:
        valid = [1, 3, 5, 7, 9, 11, str(uuid.UUID(int=1)), str(uuid.UUID(int=3)).upper(), uuid.UUID(int=5)]
        return self.pick(
            [self.pick(valid), self.pick(valid), self.scalar(), str(uuid.UUID(int=7)).replace("-", "")]
        )

    def ids(self) -> Any:
        n = self.rng.randrange(4)
        return self.one_of(
            lambda: [self.point_id() for _ in range(n)], lambda: [1, 3], self.scalar, self.filter
        )

    def vectors(self, rows: int) -> Any:
        good = np.random.default_rng(self.rng.randrange(1000)).normal(size=(rows, OLD_DIM)).astype(np.float32)
        return self.pick(
            [
                good, good, good.tolist(), good[:, :-1], good.astype(np.float64) * 1e39, good * np.nan,
                [["a"] * OLD_DIM] * rows, None, good[None], good[:0], [[1] * OLD_DIM, [1]], "vectors",
                good.astype(object), {"v": good},
            ]
        )  # fmt: skip

    def payload(self, depth: int = 0) -> Any:
        if depth > 3 or self.rng.random() < 0.3:
            return self.scalar()
        roll = self.rng.random()
        if roll < 0.1:
            return self.deep(self.pick([63, 64, 65, 127, 128, 300, 5000]))
        if roll < 0.2:
            return [self.payload(depth + 1) for _ in range(self.rng.randrange(3))]
        keys = [self.pick([*_STRINGS, 7, None, ("t",), b"k"]) for _ in range(self.rng.randrange(4))]
        return {k: self.payload(depth + 1) for k in keys}

    def deep(self, levels: int) -> Any:
        value: Any = self.scalar()
        for _ in range(levels - 1):
            value = {"a": value} if self.rng.random() < 0.5 else [value]
        return {"deep": value}

    def payloads(self, rows: int) -> Any:
        return self.pick(
            [
                None,
                [self.payload() for _ in range(rows)],
                [{"n": 1}] * rows,
                self.payload(),
                [None] * (rows + 1),
            ]
        )

    def one_of(self, *makers: Any) -> Any:
        """One of ``makers`` (functions of no argument), called: only the value picked is built."""
        return makers[self.rng.randrange(len(makers))]()

    def condition(self, depth: int) -> Any:
        key = self.pick(["n", "meta.dept", "tags[]", "", "a..b", "x" * 100])
        return self.one_of(
            lambda: models.FieldCondition(
                key=key, match=models.MatchValue(value=self.pick([1, "a", 2**64, -(2**63)]))
            ),
            lambda: models.FieldCondition(
                key=key, match=models.MatchAny(any=self.pick([[1, 2], ["a"], [2**64], []]))
            ),
            lambda: models.FieldCondition(
                key=key, range=models.Range(gte=self.pick([1, float("nan"), float("inf")]))
            ),
            lambda: models.FieldCondition(key=key),
            lambda: models.FieldCondition(
                key=key, values_count=models.ValuesCount(gte=self.pick([0, 2**63]))
            ),
            lambda: models.IsEmptyCondition(is_empty=models.PayloadField(key=key)),
            lambda: models.HasIdCondition(has_id=[self.pick([1, 2**64 - 1, 2**64, str(uuid.UUID(int=1))])]),
            lambda: models.NestedCondition(nested=models.Nested(key="meta", filter=self.filter(depth + 1))),
            lambda: self.filter(depth + 1),
        )

    def filter(self, depth: int = 0) -> Any:
        if depth > 3 or (depth > 0 and self.rng.random() < 0.1):
            return self.nested(self.pick([31, 32, 33, 200]))
        conditions = [self.condition(depth) for _ in range(self.rng.randrange(3))]
        return self.one_of(
            lambda: models.Filter(must=conditions or None),
            lambda: models.Filter(should=conditions, must_not=conditions[:1]),
            lambda: models.Filter(
                min_should=models.MinShould(conditions=conditions, min_count=self.pick([0, 1, 3]))
            ),
        )

    def nested(self, levels: int) -> models.Filter:
        inner = models.Filter(must=[models.FieldCondition(key="n", match=models.MatchValue(value=5))])
        for _ in range(levels - 1):
            inner = models.Filter(must=[inner])
        return inner

    def any_filter(self) -> Any:
        return self.one_of(
            lambda: None,
            self.filter,
            self.filter,
            lambda: {
                self.pick([*_STRINGS, 1]): self.pick(
                    [self.scalar(), [1, 2], {"gte": self.scalar()}, {"eq": 1}]
                )
            },
            self.scalar,
            lambda: [1],
        )

    def options(self) -> dict[str, Any]:
        choices: dict[str, list[Any]] = {
            "limit": [0, 1, 3, 20, -1, 10**30, 2**31 - 1, 1.5, "3", True, None],
            "offset": [0, 2, -1, 10**30, 2**31, 1.0, None],
            "score_threshold": [None, 0.5, float("nan"), "high", -1e308, True],
            "with_payload": [True, False, ["n"], ["meta.dept", "tags[]"], [""], ["a..b"], "n", 3],
            "with_vectors": [False, True, "yes", None],
            "exact": [None, True, "no"],
            "hnsw_ef": [None, 1, 0, 2**64, 1.5],
            "search_params": [
                None,
                {"hnsw_ef": 2**64},
                {"exact": "x"},
                {"nope": 1},
                models.SearchParams(exact=True),
            ],
            "timeout": [None, 1, 0, 10**30, 2.5],
            "consistency": [None, 1, 0, "all", "most", "nope", 10**30],
        }
        return {k: self.pick(v) for k, v in choices.items() if self.rng.random() < 0.4}
