"""A process killed (SIGKILL) in the middle of a promotion's settle, right after its write to new:
the next ``rmq migrate`` repairs the pair, nothing lost or duplicated."""

# ruff: noqa: F811 - the test functions take `graphs`, test_rerank's fixture imported here
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rm_qdrant import OnnxEncoder, load_pair, migrate, open_store, status
from tests.serving.promoting import LAYOUTS, embedded, migrates_then_finalizes, new_vector, served
from tests.serving.test_rerank import graphs, make_pair  # noqa: F401 - graphs is a fixture

K = 10

KILLED_IN_SETTLE = textwrap.dedent(
    """
    import os, signal, sys
    from rm_qdrant.store.edge import EdgeStore
    from rm_qdrant import DualIndex, open_store

    def then_die(real):
        def write(self, *args, **kwargs):
            result = real(self, *args, **kwargs)
            if kwargs.get("insert_only") or real.__name__ == "set_vectors":  # the settle's write
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return write

    EdgeStore.upsert = then_die(EdgeStore.upsert)
    EdgeStore.set_vectors = then_die(EdgeStore.set_vectors)
    store = open_store(sys.argv[1])
    index = DualIndex.open(store, "p", exact=True)
    index.search(sys.argv[2], limit=int(sys.argv[3]), rerank=int(sys.argv[3]), promote=True)
    index._promoter.wait(60)
    sys.exit(3)  # not killed: the promotion never wrote
    """
)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_promotion_killed_in_its_settle_is_repaired_by_the_next_migrate(
    tmp_path,
    graphs,
    image_folder,
    layout,
):
    path = tmp_path / "q"
    with open_store(path) as store:
        items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_IN_SETTLE, str(path), query, str(K)], capture_output=True, timeout=120
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    with open_store(path) as store:
        pair = load_pair(store, "p")
        hits = served(store, query, n)
        assert len(hits) == n  # served once each, whether the copy landed or not
        report = migrate(store, "p", batch=7)
        assert report.failed == 0 and status(store, "p").fraction == 1.0
        if layout == "paired":
            assert store.count(pair.old_collection) == 0
        assert store.count(pair.new_collection) == n
        expected = embedded(OnnxEncoder(graphs.rm), [i.uri for i in items])
        got = np.stack([new_vector(store, i.point_id) for i in items])
        np.testing.assert_allclose(got, expected, atol=1e-5)
        migrates_then_finalizes(store, query, n)
