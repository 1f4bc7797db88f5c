"""What is particular to the embedded store: one process at a time, durable on disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rm_qdrant import StoreLocked, open_store

HOLDER = textwrap.dedent(
    """
    import sys, time
    from rm_qdrant import open_store
    store = open_store(sys.argv[1])
    print("open", flush=True)
    sys.stdin.readline()
    store.close()
    """
)


@pytest.mark.slow
def test_second_process_gets_a_clear_locked_error_and_data_survives(tmp_path):
    path = tmp_path / "q"
    with open_store(path) as store:
        store.create_collection("c", dim=3, distance="cosine")
        store.upsert("c", [1, 2], np.eye(3, dtype=np.float32)[:2])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreLocked, match=rf"locked by another process \(pid {holder.pid}\)"):
            open_store(path)
    finally:
        holder.communicate("\n", timeout=30)
    with open_store(path) as store:
        assert store.count("c") == 2


def test_points_survive_reopen(tmp_path):
    with open_store(tmp_path / "q") as store:
        store.create_collection("c", dim=2, distance="dot")
        store.upsert("c", [5], np.array([[1.0, 2.0]]), [{"uri": "x.jpg"}])
    with open_store(tmp_path / "q") as store:
        assert store.list_collections() == ["c"]
        assert store.retrieve("c", [5])[0].payload == {"uri": "x.jpg"}


def test_half_created_collection_is_not_a_collection(tmp_path):
    with open_store(tmp_path / "q") as store:
        (store.path / "collections" / "c" / "shard").mkdir(parents=True)  # a create that crashed
        assert not store.has_collection("c")
        store.create_collection("c", dim=2, distance="cosine")
        assert store.count("c") == 0
