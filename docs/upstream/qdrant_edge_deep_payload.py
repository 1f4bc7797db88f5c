"""qdrant-edge 0.9 (qdrant-edge-py): a payload nested 128 levels deep corrupts a shard's WAL.

Standalone reproduction for an upstream report (not run by rm-qdrant's tests). A ``set_payload``
of a payload 128 objects deep is written to the write-ahead log, then refused ("Failed to decode
value: Failed to deserialize payload: recursion limit exceeded": serde_json's limit, 128); from
then on every update to the shard fails ("Not recovered from previous error"), and after close
the shard no longer loads ("failed to read WAL entry ... Can't deserialize"). 127 levels are
fine. The same payload in ``upsert_points`` is accepted (seen with qdrant-edge-py 0.9.0).

    python docs/upstream/qdrant_edge_deep_payload.py [DEPTH ...]

Prints, for each operation and depth, whether the update was accepted, whether a later update
works, and whether the shard loads again after close. rm-qdrant refuses payloads deeper than
64 levels before they reach either store (rm_qdrant/store/bounds.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import qdrant_edge as qe


def nested(depth: int) -> dict:
    """A payload ``depth`` objects deep (the payload itself is level 1)."""
    value: object = 1
    for _ in range(depth - 1):
        value = {"a": value}
    return {"a": value}


def attempt(depth: int, how: str) -> str:
    folder = Path(tempfile.mkdtemp()) / "shard"
    config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=2, distance=qe.Distance.Cosine))
    shard = qe.EdgeShard.create(str(folder), config)
    shard.update(qe.UpdateOperation.upsert_points([qe.Point(1, [1.0, 0.0], {"ok": 1})]))
    steps = []
    try:
        if how == "set_payload":
            shard.update(qe.UpdateOperation.set_payload([1], nested(depth)))
        else:
            shard.update(qe.UpdateOperation.upsert_points([qe.Point(1, [1.0, 0.0], nested(depth))]))
        steps.append("deep update accepted")
    except Exception as exc:  # noqa: BLE001 - the binding raises plain Exception
        steps.append(f"deep update refused ({str(exc)[:80]})")
    try:
        shard.update(qe.UpdateOperation.upsert_points([qe.Point(2, [0.0, 1.0], {"ok": 2})]))
        steps.append("next update ok")
    except Exception as exc:  # noqa: BLE001
        steps.append(f"NEXT UPDATE FAILS ({str(exc)[:80]})")
    shard.close()
    try:
        qe.EdgeShard.load(str(folder)).close()
        steps.append("reopens")
    except Exception as exc:  # noqa: BLE001
        steps.append(f"DOES NOT REOPEN ({str(exc)[:80]})")
    return "; ".join(steps)


if __name__ == "__main__":
    depths = [int(a) for a in sys.argv[1:]] or [64, 120, 124, 125, 126, 127, 128, 200]
    for how in ("set_payload", "upsert_points"):
        for d in depths:
            print(f"{how:13} depth {d:4}: {attempt(d, how)}")
