"""A small pair in each layout on a store that can be closed and opened again, and a snapshot of
everything stored, for the hostile-input tests (test_hostile_inputs.py, test_fuzz_api.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant import DualIndex, create_pair, open_store
from rm_qdrant.store import Store
from rm_qdrant.store.client import ClientStore
from tests.conftest import OLD_DIM
from tests.serving.test_in_both_search import _encoders

LAYOUTS = ("paired", "keep-old", "single")
N = 12


def reopen(kind: str, folder: Path) -> Store:
    """The store in ``folder``: the embedded store, or a qdrant-client local-mode folder."""
    if kind == "edge":
        return open_store(folder / "q")
    return ClientStore(path=str(folder / "local"))


def ids() -> list[int | str]:
    return [i if i % 2 else str(uuid.UUID(int=i + 1)) for i in range(N)]


def build(store: Store, folder: Path, layout: str) -> DualIndex:
    """A pair ``p`` over ``N`` points, a third of them written through the index (so both halves
    hold points); every layout keeps the old model for writes where it may roll back."""
    rng = np.random.default_rng(1)
    points = ids()
    store.create_collection("old", dim=OLD_DIM, distance="cosine")
    payloads = [{"n": i, "tags": ["a", str(i)], "meta": {"dept": f"d{i % 3}"}} for i in range(N)]
    store.upsert("old", points, rng.normal(size=(N, OLD_DIM)).astype(np.float32), payloads)
    rm, old_model = _encoders(folder)
    extra: dict[str, Any] = {
        "paired": {},
        "keep-old": {"old_encoder": old_model, "keep_old": True},
        "single": {"old_encoder": old_model, "layout": "single-collection", "new_vector": "new"},
    }[layout]
    create_pair(store, "p", old_collection="old", encoder=rm, **extra)
    index = DualIndex.open(store, "p", exact=True)
    moved = points[: N // 3]
    vectors = rng.normal(size=(len(moved), OLD_DIM)).astype(np.float32)
    old = {"old_vectors": vectors} if layout != "paired" else {}
    index.upsert_vectors(moved, vectors, [{"n": 100 + i} for i in range(len(moved))], **old)
    return index


def _vector_names(store: Store, name: str) -> list[str]:
    opened = getattr(store, "_open", None)  # EdgeStore: the shard's specs; ClientStore: _facts
    dense = opened(name)[0][0] if opened is not None else store._facts(name)[0]  # type: ignore[attr-defined]
    return sorted(dense)


def snapshot(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every point of every collection: id, payload and each vector's values."""
    taken = {}
    for name in store.list_collections():
        names = _vector_names(store, name)
        others = tuple(n for n in names if n)
        records, _ = store.scroll(
            name, limit=10_000, with_vectors="" in names, vector="", others=others, with_payload=True
        )
        taken[name] = sorted(
            (
                str(r.id),
                repr(sorted(r.payload.items())),
                None if r.vector is None else r.vector.tobytes(),
                tuple((k, np.asarray(v).tobytes()) for k, v in sorted(r.others.items())),
            )
            for r in records
        )
    return taken


def still_works(store: Store, kind: str, folder: Path, *, count: int | None = N) -> Store:
    """Close the store, open it afresh, open the pair and write to it: the team's collection
    survived (and serves ``count`` points). Returns the reopened store."""
    store.close()
    store = reopen(kind, folder)
    index = DualIndex.open(store, "p", exact=True)
    vector = np.ones((1, OLD_DIM), np.float32)
    keeps_old = index.layout.keeps_writes_in_old
    index.upsert_vectors([ids()[-1]], vector, [{"n": -1}], **({"old_vectors": vector} if keeps_old else {}))
    index.set_payload({"after": True}, [ids()[-1]])
    assert [p.payload for p in index.retrieve([ids()[-1]])] == [{"n": -1, "after": True}]
    assert count is None or index.count() == count
    return store
