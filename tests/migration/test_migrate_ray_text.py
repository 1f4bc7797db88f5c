"""``rmq migrate --engine ray`` on a text pair: the Ray workers tokenise the payload's documents as
the local engine does (the same vectors and payloads in the end), record a document that is not
text as failed with the same reason, and count the documents cut at the model's window."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rm_qdrant import DualIndex, RayOptions, open_store
from rm_qdrant.core.planning import ERROR
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.store import Where
from tests.migration.test_migrate_ray import _tokenless, snapshot
from tests.text_gallery import MAX_LENGTH, long_text, text_gallery, text_models
from tests.text_models import texts

pytestmark = pytest.mark.slow

N = 30


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_ray_and_local_engines_end_alike_on_a_text_pair(tmp_path, local_ray, layout):
    # Every document fills the window: the test graph averages its token states over the padding
    # too (tests/text_models.py), so a text's vector depends on the longest text of its call, and
    # the engines group a batch's texts into calls differently (Ray: a call per chunk).
    _, labels = texts(N)
    docs = [
        long_text(3 * MAX_LENGTH if i in (2, 9, 17) else MAX_LENGTH - 2, labels[i], seed=i) for i in range(N)
    ]
    models = text_models(tmp_path / "models")
    extra = {"mode": layout, "new_vector": "new"} if layout != "paired" else {}
    ends = {}
    for engine in ("local", "ray"):
        with open_store(tmp_path / f"q-{engine}") as store:
            text_gallery(store, models, docs, labels, **extra)
            store.set_payload("docs", [(5, {"body": "\x00\x01 binary"}), (11, {"body": 42})])
            ray = RayOptions(encoders=2, decoders=2) if engine == "ray" else None
            report = run_migration(DualIndex.open(store, "t"), MigrateOptions(batch=7), ray=ray)
            failed = {
                r.id: r.payload[ERROR]
                for r in store.scroll("docs", limit=100, where=Where(not_empty=(ERROR,)))[0]
            }
            ends[engine] = (report.moved, report.failed, report.truncated, failed, snapshot(store))
    local, ray = ends["local"], ends["ray"]
    assert ray[:4] == local[:4]
    assert ray[:3] == (N - 2, 2, 3)
    assert "control character" in ray[3][5] and "expected text, got int" in ray[3][11]
    alike(ray[4], local[4])


def alike(a: dict, b: dict) -> None:
    """The same points and payloads, and vectors equal to float32 rounding (ONNX Runtime's sums
    over a call's texts round differently when the engines group them differently)."""
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        for point, (payload, vector) in a[name].items():
            other_payload, other_vector = b[name][point]
            assert _tokenless(payload) == _tokenless(other_payload), (name, point)
            assert np.allclose(np.asarray(vector), np.asarray(other_vector), atol=1e-6), (name, point)


def test_status_after_a_ray_run_shows_what_it_cut(tmp_path, rmq, local_ray):
    docs, labels = texts(N)
    for i in (4, 8):
        docs[i] = long_text(MAX_LENGTH, labels[i], seed=i)
    with open_store(tmp_path / "q") as store:
        text_gallery(store, text_models(tmp_path / "models"), docs, labels)
    out = json.loads(rmq("migrate", "--name", "t", "--engine", "ray", "--batch", "8", "--json").stdout)
    assert (out["moved"], out["truncated"]) == (N, 2)
    assert f"truncated     2 documents at {MAX_LENGTH} tokens" in rmq("status", "--name", "t").output
