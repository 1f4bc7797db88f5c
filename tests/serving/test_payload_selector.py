"""``with_payload=[fields]`` keeps what Qdrant's payload selector keeps, nested lists included,
and qdrant-client's ``PayloadSelectorInclude``/``Exclude`` are taken (they were refused).

Before, a field was read by dots only: ``items[].a`` (Qdrant's path into each item of a list)
kept nothing, and ``items.a`` on a list kept nothing where Qdrant keeps ``{"items": []}``.
Reference: qdrant-client's local mode (which follows Qdrant's own rules) reading the same
payloads with the same selector, on random nested payloads and random selectors, through a
half-migrated pair on both stores.
"""

from __future__ import annotations

import numpy as np
from qdrant_client import QdrantClient, models

from rm_qdrant import DualIndex, create_pair
from tests.conftest import OLD_DIM
from tests.serving.test_in_both_search import _encoders

N = 40
PATHS = [
    "label", "items", "items[]", "items[].a", "items[].b", "items.a", "items[0]", "n", "n.x", "n.x.y",
    "n.x.z", "n.w", "tags", "tags[]", "s.t", "missing", "deep[].v[].w", "deep[].v", "a.b", '"a.b"', '"n".x',
    "n[].x", "file-name_2",
]  # fmt: skip


def _payload(rng: np.random.Generator) -> dict:
    payload: dict = {}
    if rng.random() < 0.8:
        payload["label"] = str(rng.choice(["cat", "dog"]))
    if rng.random() < 0.7:
        payload["items"] = [{"a": int(rng.integers(9)), "b": "u"} for _ in range(rng.integers(0, 3))]
    if rng.random() < 0.5:
        payload["items"] = rng.integers(9, size=2).tolist()  # a list of plain values
    if rng.random() < 0.7:
        payload["n"] = {"x": {"y": 1, "z": [2, 3]}, "w": None} if rng.random() < 0.7 else {"x": 5}
    if rng.random() < 0.5:
        payload["tags"] = ["a", "b"]
    payload["s"] = 5
    if rng.random() < 0.4:
        payload["deep"] = [{"v": [{"w": 1, "q": 2}]}, {"v": 3}]
    if rng.random() < 0.3:
        payload["a.b"] = 1
    if rng.random() < 0.3:
        payload["file-name_2"] = "x.jpg"
    return payload


def test_selected_payloads_are_qdrants(store, tmp_path):
    rng = np.random.default_rng(4)
    payloads = [_payload(rng) for _ in range(N)]
    vectors = rng.normal(size=(N, OLD_DIM)).astype(np.float32)
    store.create_collection("old", dim=OLD_DIM, distance="cosine")
    store.upsert("old", list(range(N)), vectors, payloads)
    create_pair(store, "p", old_collection="old", encoder=_encoders(tmp_path)[0])
    index = DualIndex.open(store, "p", exact=True)
    half = list(range(0, N, 2))
    index.upsert_vectors(half, vectors[half], [payloads[i] for i in half])
    reference = QdrantClient(":memory:")
    reference.create_collection(
        "ref", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT)
    )
    reference.upsert(
        "ref", [models.PointStruct(id=i, vector=[1.0, 0.0], payload=p) for i, p in enumerate(payloads)]
    )
    for draw in range(60):
        fields: object = [str(f) for f in rng.choice(PATHS, size=int(rng.integers(1, 4)), replace=False)]
        if draw % 3 == 1:
            fields = models.PayloadSelectorInclude(include=fields)
        elif draw % 3 == 2:
            fields = models.PayloadSelectorExclude(exclude=fields)
        hits = index.search_vectors(vectors[0], vectors[0], limit=N, with_payload=fields)
        assert sorted(h.id for h in hits) == list(range(N))
        expected = {r.id: r.payload for r in reference.retrieve("ref", list(range(N)), with_payload=fields)}
        for hit in hits:
            assert hit.payload == (expected[hit.id] or {}), (draw, fields, hit.id)
    index.close()
