"""Fuzz: the public Python calls and ``rmq search`` with hostile input (issue 45, item 7).

A seeded generator (fuzz_inputs.py) feeds DualIndex's search_vectors / search_vectors_batch /
upsert_vectors / set_payload / delete / retrieve / count hostile ids, vectors, payloads, filters
and options, on both stores and the three layouts. Only rm-qdrant's errors (RmqError) may escape,
each in one line; a refused call changes nothing stored (both collections compared before and
after); both stores refuse the same calls; and the store still opens and takes writes at the
end. The CLI part runs ``rmq search`` with hostile options: exit 0, or one ``Error:`` line and
exit 1, never a traceback.

Before: 24 inputs escaped as numpy's, pydantic's, json's or the embedded store's binding's own
exceptions (NaN or non-string payload keys, strings as vectors, filters nested 200 levels, a dict
filter with an integer key...), and ``rmq search --offset 10**30`` was a 55-line traceback.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from rm_qdrant import DualIndex
from rm_qdrant.errors import RmqError
from tests.conftest import OLD_DIM
from tests.serving.fuzz_inputs import Inputs
from tests.serving.hostile import LAYOUTS, build, reopen, snapshot, still_works

pytestmark = pytest.mark.slow

#: Calls a store and layout (both stores, three layouts: a few seconds on 2 cores); more, and
#: other seeds, for a longer hunt: RMQ_FUZZ_CASES=2000 RMQ_FUZZ_SEED=7 pytest tests/serving/test_fuzz_api.py
CASES = int(os.environ.get("RMQ_FUZZ_CASES", "150"))
SEED = int(os.environ.get("RMQ_FUZZ_SEED", "0"))
CALLS = ("search_vectors", "search_batch", "upsert_vectors", "set_payload", "delete", "retrieve", "count")


def _call(index: DualIndex, made: Inputs, name: str) -> Any:
    if name == "search_vectors":
        q = made.pick([np.ones(OLD_DIM), made.vectors(1), [1.0] * OLD_DIM, None, "q"])
        return lambda: index.search_vectors(q, q, filter=made.any_filter(), **made.options())
    if name == "search_batch":
        rows = made.pick([1, 2])
        new, old = made.vectors(rows), made.vectors(rows)
        return lambda: index.search_vectors_batch(new, old, filter=made.any_filter(), **made.options())
    if name == "upsert_vectors":
        ids = made.ids()
        rows = len(ids) if isinstance(ids, list) else 1
        vectors, payloads = made.vectors(rows), made.payloads(rows)
        old = {"old_vectors": made.vectors(rows)} if made.rng.random() < 0.5 else {}
        return lambda: index.upsert_vectors(ids, vectors, payloads, **old)
    if name == "set_payload":
        payload, points = made.payload(), made.pick([made.ids(), made.any_filter()])
        return lambda: index.set_payload(payload, points)
    if name == "delete":
        ids = made.ids()
        return lambda: index.delete(ids)
    if name == "retrieve":
        ids, options = (
            made.ids(),
            {k: v for k, v in made.options().items() if k in ("with_payload", "with_vectors")},
        )
        return lambda: index.retrieve(ids, **options)
    given = made.any_filter()
    return lambda: index.count(given)


def _outcome(store, index: DualIndex, run) -> str:
    """Run one call: "ok", or the library error's class (nothing stored changed on it)."""
    before = snapshot(store)
    try:
        run()
    except RmqError as exc:
        assert "\n" not in str(exc), str(exc)
        assert snapshot(store) == before, f"a refused call changed what is stored: {exc}"
        return f"{type(exc).__name__} ({str(exc) if 'cannot match true/false' in str(exc) else ''})"
    return "ok"


def _fuzz(store, index: DualIndex, seed: int) -> list[str]:
    made, outcomes = Inputs(seed), []
    for case in range(CASES):
        name = made.pick(list(CALLS))
        run = _call(index, made, name)
        try:
            outcomes.append(f"{name}: {_outcome(store, index, run)}")
        except AssertionError:
            raise
        except Exception as exc:  # anything but the library's own errors
            raise AssertionError(
                f"case {case} ({name}, seed {seed}) escaped as {type(exc).__name__}: {exc}"
            ) from exc
    return outcomes


@pytest.mark.parametrize("layout", LAYOUTS)
def test_only_library_errors_escape_and_a_refusal_changes_nothing(tmp_path, layout):
    seed = SEED + LAYOUTS.index(layout)
    answers = {}
    for kind in ("edge", "local"):
        folder = tmp_path / kind
        folder.mkdir()
        store = reopen(kind, folder)
        answers[kind] = _fuzz(store, build(store, folder, layout), seed)
        still_works(store, kind, folder, count=None).close()
    # the same calls refused, with the same kind of error, on both stores; but for the one
    # documented gap: qdrant-edge cannot match true/false (qfilter.bool_refusal)
    for edge, local in zip(answers["edge"], answers["local"], strict=True):
        assert edge == local or "cannot match true/false" in edge, (edge, local)


SEARCH_ARGS: list[tuple[str, ...]] = [
    ("--offset", str(10**30)),
    ("--limit", str(10**30)),
    ("--offset", "-1"),
    ("--limit", "0"),
    ("--limit", "1.5"),
    ("--filter", '{"must": [' * 3000 + "]}" * 3000),
    ("--filter", "[" * 100_000),
    ("--filter", '{"must": [{"key": "label", "match": {"value": 99999999999999999999}}]}'),
    ("--filter", '{"must": [{"key": "label", "range": {"gte": NaN}}]}'),
    ("--filter", '{"min_should": {"conditions": [], "min_count": 3}}'),
    ("--filter", '{"must": [{"key": "label"}]}'),
    ("--filter", '{"must": [{"has_id": [18446744073709551616]}]}'),
    ("--filter", '{"must": [{"has_id": [-1]}]}'),
    ("--filter", "label=99999999999999999999999"),
    ("--filter", "label=" + "1" * 10_000),
    ("--filter", "=x"),
    ("--filter", "label"),
    ("--filter", "\udcff=1"),
    ("--filter", '{"must": {"key": 1}}'),
    ("--score-threshold", "nan"),
    ("--score-threshold", "inf"),
    ("--score-threshold", "1e999"),
]


@pytest.mark.parametrize("seed", [0])
def test_rmq_search_with_hostile_options_is_a_result_or_one_line(rmq, demo, seed):
    made = Inputs(SEED + seed)
    cases = list(SEARCH_ARGS)
    for _ in range(8):  # and a few combinations of them
        cases.append(made.pick(SEARCH_ARGS) + made.pick(SEARCH_ARGS))
    for args in cases:
        result = rmq("search", "--name", "demo", demo, "--exact", *args, ok=False)
        assert "Traceback" not in result.output, args
        if result.exit_code != 0:
            lines = [line for line in result.output.splitlines() if line.strip()]
            assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (
                args,
                result.output[:300],
            )
