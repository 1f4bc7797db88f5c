"""What ``--engine ray`` runs on the Ray workers (see ray_engine.py): a task that fetches and
decodes a chunk of a batch, and the actor that encodes it. Nothing here touches the store."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.core.inputspec import DEFAULT_DECODE
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.modelinfo import ModelInfo
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.loading import NETWORK_WORKERS, LoadedBatch, load_batch
from rm_qdrant.migration.migrator import encode_loaded
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import decoder_for, load_encoder
from rm_qdrant.pair.outcome import ClaimedBatch, Encoded, Prepared
from rm_qdrant.sources import ImageSource, SourceConfig

CUDA = "CUDAExecutionProvider"


@lru_cache(maxsize=4)
def _source(config: SourceConfig) -> ImageSource:
    """One open image source per worker process and setting (its HTTP and S3 clients stay warm)."""
    return ImageSource(config).__enter__()


def decode_chunk(
    info: ModelInfo,
    config: SourceConfig,
    rule: UriRule,
    points: Sequence[tuple[PointId, dict[str, Any]]],
    fetch_workers: int | None,
    decode: str = DEFAULT_DECODE,
) -> LoadedBatch:
    """A Ray task: fetch and decode the images of ``points`` as the encoder takes them, ``exact``
    or ``fast`` as the pair records (``decode``)."""
    images = _source(config)
    with ThreadPoolExecutor(fetch_workers or NETWORK_WORKERS, "rmq-fetch") as pool:
        decoder = decoder_for(info, decode=decode)
        return load_batch(decoder, images, rule, points, pool, workers=fetch_workers)


class EncoderActor:
    """A Ray actor: one ONNX Runtime session of the pair's encoder, loaded from the graph's bytes
    on its first call (and again after Ray restarts it)."""

    def __init__(self, name: str, fingerprint: str, batch_size: int, gpus: float) -> None:
        self.settings = name, fingerprint, batch_size, gpus
        self.encoder: OnnxEncoder | None = None

    def _load(self, graph: list[Any]) -> OnnxEncoder:
        import ray

        name, fingerprint, batch_size, gpus = self.settings
        providers = [CUDA, "CPUExecutionProvider"] if gpus > 0 else ["CPUExecutionProvider"]
        with tempfile.TemporaryDirectory(prefix="rmq-encoder-") as folder:
            path = Path(folder, name)
            path.write_bytes(ray.get(graph[0]))
            encoder = load_encoder(path, batch_size=batch_size, threads=1, providers=providers)
        if encoder.fingerprint != fingerprint:
            raise ConfigError(f"the encoder {name} changed on disk while the run started: rerun")
        if gpus > 0 and encoder.provider != CUDA:
            raise ConfigError(
                "an encoder asked for GPUs, but ONNX Runtime has no usable CUDA provider on the "
                "Ray worker: install onnxruntime-gpu there (rm-qdrant[gpu]), or --gpus-per-encoder 0"
            )
        return encoder

    def encode(
        self, graph: list[Any], output: str, distance: str, ids: list[PointId], loaded: LoadedBatch
    ) -> Chunk:
        """Embed a decoded chunk: what the encoder made, and what the decode task reported.
        ``graph``: [the ObjectRef of the graph's bytes], nested so that only a first call (of
        this actor, or of its restart) reads it."""
        if self.encoder is None:
            self.encoder = self._load(graph)
        encoded = encode_loaded(
            self.encoder, output, distance, [ids[row] for row in loaded.rows], loaded.pixels
        )
        return Chunk(loaded.failed, encoded, loaded.seconds, loaded.retries, loaded.truncated)


@dataclass(frozen=True)
class Chunk:
    """What one chunk of a batch comes back to the driver as (never its pixels).

    Attributes:
        failed: ``(position in the chunk, reason)`` of the images that could not be read.
        encoded: what the encoder made of the others.
        seconds: the decode task's ``fetch`` and ``decode`` seconds.
        retries: network fetches the decode task retried.
        truncated: positions in the chunk of the texts cut at the model's ``max_length``.
    """

    failed: list[tuple[int, str]]
    encoded: Encoded
    seconds: dict[str, float]
    retries: int
    truncated: list[int] = field(default_factory=list)


def assemble(
    claim: ClaimedBatch, starts: list[int], chunks: list[Chunk], dim: int
) -> tuple[Prepared, Encoded]:
    """A batch from its chunks (each starting at ``starts[k]`` in ``claim.todo``), as settle takes
    it; the stages' seconds are summed over the chunks (worker seconds, not wall time)."""
    failed = [
        (start + row, why) for start, chunk in zip(starts, chunks, strict=True) for row, why in chunk.failed
    ]
    read = sorted(set(range(len(claim.todo))) - {row for row, _ in failed})
    seconds = {stage: sum(c.seconds.get(stage, 0.0) for c in chunks) for stage in ("fetch", "decode")}
    retries = sum(c.retries for c in chunks)
    cut = [start + row for start, chunk in zip(starts, chunks, strict=True) for row in chunk.truncated]
    pixels = np.zeros((0, 0, 0, 0), np.uint8)
    prepared = claim.prepared(LoadedBatch(read, pixels, failed, seconds, retries, cut))
    encoded = [c.encoded for c in chunks]
    vectors = [e.vectors for e in encoded if len(e.ids)]
    return prepared, Encoded(
        [i for e in encoded for i in e.ids],
        np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32),
        [f for e in encoded for f in e.failed],
        sum(e.seconds for e in encoded),
    )
