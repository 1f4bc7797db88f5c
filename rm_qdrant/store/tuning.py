"""Per-vector HNSW settings for the vectors a pair serves: a low ``full_scan_threshold``.

Qdrant scans a segment instead of walking its HNSW graph when the segment's vectors (or a
filter's estimated matches) take less than ``full_scan_threshold`` KB. Its default, 10,000
KB, is 20,000 128-d float vectors: a collection of 50,000 points spread over a few segments,
or the half of it that has a pair's new vector, is then scanned on every search although the
graph exists (issue 26: 3.0-4.4x the paired layout's latency through DualIndex).

:data:`SERVING_FULL_SCAN_KB` is where a scan stops being the cheaper search. Measured on one
qdrant-edge segment of n 128-d cosine vectors (2-core AMD EPYC, loaded, 300 queries, p50; a
scan of n vectors against HNSW at ef 16 and 64):

==========  ==========  =======  =======  =======
n           KB          scan     ef 16    ef 64
==========  ==========  =======  =======  =======
1,000         500        84 us    86 us   132 us
2,000       1,000       114 us    87 us   154 us
4,000       2,000       220 us   136 us   217 us
8,000       4,000       342 us   132 us   240 us
==========  ==========  =======  =======  =======

At ef 16 the graph wins from about 1,000 KB, at ef 64 from about 2,000 KB; 1,000 KB keeps
exact scans for segments (and filters) smaller than that, where they cost about what the
graph does and find every point.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qdrant_client import models

from rm_qdrant.errors import ConfigError

#: ``full_scan_threshold`` (KB) rm-qdrant gives the vectors a pair searches (see the module doc).
SERVING_FULL_SCAN_KB = 1_000

#: Qdrant's own full_scan_threshold (KB): under it, a filtered search of fewer points is a scan.
QDRANT_FULL_SCAN_KB = 10_000

#: Qdrant's HNSW defaults, for a vector whose config names none (edge_config.json wants all four).
_HNSW_DEFAULTS = {
    "m": 16,
    "ef_construct": 100,
    "full_scan_threshold": QDRANT_FULL_SCAN_KB,
    "max_indexing_threads": 0,
}


#: The largest threshold taken (1 TB of vectors: every segment scanned). Qdrant reads it as a
#: machine word; a larger number written into a shard's config left the collection unopenable.
MAX_FULL_SCAN_KB = 1_000_000_000


def check_kb(kb: int) -> int:
    """``kb`` if it is a usable threshold, else ConfigError."""
    if not isinstance(kb, int) or isinstance(kb, bool) or not 0 <= kb <= MAX_FULL_SCAN_KB:
        raise ConfigError(
            f"full_scan_threshold must be an integer from 0 to {MAX_FULL_SCAN_KB:,} (KB), got {kb!r}"
        )
    return kb


def edited_edge_config(raw: Mapping[str, Any], vectors: Iterable[str], kb: int) -> dict[str, Any]:
    """A shard's ``edge_config.json`` with ``full_scan_threshold`` set to ``kb`` on ``vectors``
    (each keeps its other HNSW settings, or the shard's, or Qdrant's defaults)."""
    config = json.loads(json.dumps(raw))  # a deep copy
    shared = {**_HNSW_DEFAULTS, **(config.get("hnsw_config") or {})}
    for name in vectors:
        if name not in config.get("vectors", {}):
            raise ConfigError(f"no dense vector {name!r} to tune")
        params = config["vectors"][name]
        params["hnsw_config"] = {**shared, **(params.get("hnsw_config") or {}), "full_scan_threshold": kb}
    return config


def edge_thresholds(raw: Mapping[str, Any]) -> dict[str, int]:
    """Each dense vector's effective ``full_scan_threshold`` (KB) in an ``edge_config.json``."""
    shared = {**_HNSW_DEFAULTS, **(raw.get("hnsw_config") or {})}["full_scan_threshold"]
    return {
        str(name): int((params.get("hnsw_config") or {}).get("full_scan_threshold", shared))
        for name, params in (raw.get("vectors") or {}).items()
    }


def write_edge_config(shard_dir: Path, vectors: Iterable[str], kb: int) -> None:
    """Rewrite a closed shard's config with the threshold (atomically: a kill keeps the old one)."""
    path = shard_dir / "edge_config.json"
    edited = edited_edge_config(json.loads(path.read_text()), vectors, kb)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(edited))
    os.replace(tmp, path)


def client_vectors_diff(vectors: Iterable[str], kb: int) -> dict[str, models.VectorParamsDiff]:
    """qdrant-client's ``update_collection(vectors_config=...)`` for the threshold on ``vectors``."""
    hnsw = models.HnswConfigDiff(full_scan_threshold=kb)
    return {name: models.VectorParamsDiff(hnsw_config=hnsw) for name in vectors}


def client_thresholds(info: models.CollectionInfo) -> dict[str, int]:
    """Each dense vector's effective ``full_scan_threshold`` (KB) from qdrant-client's info."""
    shared = info.config.hnsw_config.full_scan_threshold
    params = info.config.params.vectors or {}
    named = params if isinstance(params, dict) else {"": params}
    return {
        str(name): int(
            p.hnsw_config.full_scan_threshold
            if p.hnsw_config and p.hnsw_config.full_scan_threshold is not None
            else shared
        )
        for name, p in named.items()
        if p is not None
    }
