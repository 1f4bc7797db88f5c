"""A single-collection pair's old prefetch searches with ACORN (issue 26).

Its filter, the points that lack the new vector, matches fewer points as the backfill goes on.
Where Qdrant walks the old vector's HNSW graph under it (a low full_scan_threshold, the team's
or ``--full-scan-kb``, or a gallery so large that a quarter of it is over the threshold), a
plain filtered walk misses neighbours; ACORN, used by Qdrant under its own selectivity cut-off,
finds them. The graph here is a team's shard built small on purpose (m 4, a 1 KB threshold), so
the loss shows on 3,000 points.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import models

from rm_qdrant import DualIndex, open_store
from rm_qdrant.pair.record import SINGLE, ModelRef, PairRecord
from rm_qdrant.store.client_query import takes_acorn
from rm_qdrant.store.params import old_side_params

N, DIM, QUERIES = 3000, 16, 200
OFF = models.SearchParams(acorn=models.AcornSearchParams(enable=False))


def recall(found: list[list], truth: list[list]) -> float:
    return float(np.mean([len({h.id for h in a} & {h.id for h in b}) / 10 for a, b in zip(found, truth)]))


@pytest.fixture(scope="module")
def late_backfill(tmp_path_factory):
    """A team's single-collection shard, 80 % migrated, indexed under a low threshold."""
    rng = np.random.default_rng(0)
    old = (rng.normal(size=(40, DIM))[rng.integers(0, 40, N)] + 0.8 * rng.normal(size=(N, DIM))).astype(
        np.float32
    )
    new = (old @ rng.normal(size=(DIM, DIM))).astype(np.float32)
    migrated = set(rng.permutation(N)[: int(0.8 * N)].tolist())
    root = tmp_path_factory.mktemp("acorn")
    hnsw = qe.HnswIndexConfig(m=4, ef_construct=32, full_scan_threshold=1)
    params = qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine, hnsw_config=hnsw)
    optimizers = qe.EdgeOptimizersConfig(indexing_threshold=10, default_segment_number=1)
    config = qe.EdgeConfig(vectors={"": params, "new": params}, optimizers=optimizers)
    shard = qe.EdgeShard.create(str(root / "collections" / "photos" / "shard"), config)
    points = [
        qe.Point(i, {"": old[i].tolist(), **({"new": new[i].tolist()} if i in migrated else {})}, {})
        for i in range(N)
    ]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.close()
    with open_store(root) as store:
        store.optimize("photos")
        model = ModelRef("m", "0", DIM, "-")
        pair = PairRecord("p", "photos", "photos", "rm", "cosine", model, layout=SINGLE, new_vector="new")
        # A calibrated naive pair searches the two vectors one after the other (the map is applied
        # between): its old search takes the same ACORN.
        mapped = {"old": [0.0, 2.0], "new": [0.0, 2.2]}
        naive = dataclasses.replace(pair, name="q", mode="naive", calibration=mapped)
        queries = rng.permutation(N)[:QUERIES]
        indexes = {}
        for kind, record in (("merged", pair), ("two queries", naive)):
            index = DualIndex(store, record)
            truth = index.search_vectors_batch(new[queries], old[queries], limit=10, exact=True)
            indexes[kind] = (index, new[queries], old[queries], truth)
        yield indexes


@pytest.mark.parametrize("kind", ["merged", "two queries"])
def test_the_old_prefetch_finds_what_a_plain_filtered_walk_misses(late_backfill, kind) -> None:
    index, q_new, q_old, truth = late_backfill[kind]
    served = recall(index.search_vectors_batch(q_new, q_old, limit=10, hnsw_ef=10), truth)
    plain = recall(index.search_vectors_batch(q_new, q_old, limit=10, hnsw_ef=10, search_params=OFF), truth)
    assert plain < 0.9  # the loss the default now avoids: 0.85 here
    assert served >= 0.93 and served > plain + 0.05


def test_a_callers_own_acorn_or_exact_search_is_left_as_given() -> None:
    given = models.SearchParams(hnsw_ef=12)
    assert old_side_params(given).acorn == models.AcornSearchParams(enable=True)
    assert old_side_params(given).hnsw_ef == 12 and given.acorn is None
    assert old_side_params(OFF) is OFF
    tuned = models.SearchParams(acorn=models.AcornSearchParams(enable=True, max_selectivity=1.0))
    assert old_side_params(tuned) is tuned
    exact = models.SearchParams(exact=True)
    assert old_side_params(exact) is exact


@pytest.mark.parametrize(
    ("version", "takes"),
    [("1.16.0", True), ("v1.17.2", True), ("2.0.0", True), ("1.15.5", False), ("1.9.0", False), ("", False)],
)
def test_a_server_gets_acorn_from_1_16_on(version: str, takes: bool) -> None:
    assert takes_acorn(version) is takes


def test_a_failed_version_read_is_asked_again_not_kept(tmp_path) -> None:
    """A server restarting at the first search must not turn ACORN off for the store's life."""
    from types import SimpleNamespace

    from rm_qdrant.store.client import ClientStore

    store = ClientStore(path=str(tmp_path / "local"))
    answers = iter([ConnectionError("restarting"), SimpleNamespace(version="1.17.0")])

    def info():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    store._remote, store._client.info = True, info  # what a server answers, in turn
    assert store.capabilities.filtered_recall is False  # not known: no ACORN on this search
    assert store.capabilities.filtered_recall is True  # read the next time, and kept
    assert store.capabilities.filtered_recall is True
    store.close()
