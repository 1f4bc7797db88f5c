"""What ``--engine ray`` runs on the Ray workers (see ray_engine.py): a task that fetches and
decodes a chunk of a batch, and the actor that encodes it. Nothing here touches the store."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from rm_qdrant.core.inputspec import DEFAULT_DECODE
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.modelinfo import ModelInfo
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.loading import NETWORK_WORKERS, LoadedBatch, load_batch
from rm_qdrant.migration.migrator import encode_loaded
from rm_qdrant.models.encoder import OnnxEncoder, PixelDecoder
from rm_qdrant.pair.outcome import Encoded
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
        decoder = PixelDecoder(info, decode=decode)
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
            encoder = OnnxEncoder(path, batch_size=batch_size, threads=1, providers=providers)
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
    ) -> tuple[list[tuple[int, str]], Encoded]:
        """Embed a decoded chunk: its decode failures (positions in the chunk), and what the
        encoder made. ``graph``: [the ObjectRef of the graph's bytes], nested so that only a
        first call (of this actor, or of its restart) reads it."""
        if self.encoder is None:
            self.encoder = self._load(graph)
        return loaded.failed, encode_loaded(
            self.encoder, output, distance, [ids[row] for row in loaded.rows], loaded.pixels
        )
