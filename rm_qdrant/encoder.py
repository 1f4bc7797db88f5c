"""Encoding images with an ONNX graph through ONNX Runtime (the runtime never uses torch)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from rm_qdrant.errors import EncoderError
from rm_qdrant.images import MAX_PIXELS, ImageLike, as_batch, pixels
from rm_qdrant.modelinfo import ModelInfo, parse_metadata

log = logging.getLogger(__name__)


def fingerprint_bytes(data: bytes) -> str:
    """The fingerprint rm-qdrant records for a graph: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(data).hexdigest()[:16]


def _providers() -> list[str]:
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxEncoder:
    """One ONNX graph, one ONNX Runtime session, reused for every call.

    Args:
        path: The ``.onnx`` file. Its ``rm_qdrant`` metadata entry describes it
            (see :mod:`rm_qdrant.modelinfo`).
        batch_size: Images per inference call.
        threads: Intra-op threads for ONNX Runtime (0: its default).

    Raises:
        EncoderError: the file is missing, not an ONNX graph, or lacks the
            metadata or outputs rm-qdrant needs.

    Example:
        >>> enc = OnnxEncoder("model.onnx")  # doctest: +SKIP
        >>> enc.encode(["cat.jpg", "dog.jpg"])["new"].shape  # doctest: +SKIP
        (2, 128)
    """

    def __init__(self, path: str | os.PathLike[str], *, batch_size: int = 64, threads: int = 0):
        self.path = Path(path)
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise EncoderError(f"cannot read encoder {self.path}: {exc.strerror or exc}") from exc
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(data, options, providers=_providers())
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EncoderError(f"{self.path} is not a loadable ONNX graph: {exc}") from exc
        inputs = self._session.get_inputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise EncoderError(f"{self.path}: expected one 4-D image input, got {len(inputs)} inputs")
        self._input_name = inputs[0].name
        outputs = [o.name for o in self._session.get_outputs()]
        meta = self._session.get_modelmeta().custom_metadata_map
        info = parse_metadata(meta, outputs, source=str(self.path))
        self.info = ModelInfo(info.name, info.distance, info.outputs, info.input, fingerprint_bytes(data))
        self.batch_size = batch_size
        running = self._session.get_providers()[0]
        if "CUDAExecutionProvider" in _providers() and running != "CUDAExecutionProvider":
            log.info("CUDA is installed but not usable here: %s encodes on the CPU", self.path)
        log.debug("loaded encoder %s (%s) on %s", self.path, self.info.name, self._session.get_providers())

    @property
    def fingerprint(self) -> str:
        return self.info.fingerprint

    def preprocess(self, images: Sequence[ImageLike], *, max_pixels: int = MAX_PIXELS) -> np.ndarray:
        """Decode and lay out a batch of images as the graph's input tensor.

        Raises:
            ImageError: an image cannot be decoded, or declares more than ``max_pixels``.
        """
        spec = self.info.input
        size = {"height": spec.height, "width": spec.width, "channels": spec.channels}
        batch = np.stack([pixels(i, **size, max_pixels=max_pixels) for i in images])
        if spec.dtype == "float32":
            mean = np.asarray(spec.mean, dtype=np.float32)
            std = np.asarray(spec.std, dtype=np.float32)
            batch = (batch.astype(np.float32) / 255.0 - mean) / std
        if spec.layout == "NCHW":
            batch = batch.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(batch)

    def run(self, tensor: np.ndarray, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the graph on an already preprocessed input tensor."""
        names = list(outputs or self.info.outputs)
        results: dict[str, list[np.ndarray]] = {name: [] for name in names}
        for start in range(0, len(tensor), self.batch_size):
            chunk = tensor[start : start + self.batch_size]
            try:
                values = self._session.run(names, {self._input_name: chunk})
            except Exception as exc:
                raise EncoderError(f"{self.path}: inference failed: {exc}") from exc
            for name, value in zip(names, values, strict=True):
                results[name].append(np.asarray(value, dtype=np.float32).reshape(len(chunk), -1))
        merged = {
            n: np.concatenate(v) if v else np.zeros((0, self.info.outputs[n]), np.float32)
            for n, v in results.items()
        }
        for name, value in merged.items():
            if value.shape[1] != self.info.outputs[name]:
                raise EncoderError(
                    f"{self.path}: output {name!r} has {value.shape[1]} values per image, "
                    f"metadata says {self.info.outputs[name]}"
                )
        return merged

    def encode(
        self, images: ImageLike | Sequence[ImageLike], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Encode one image or a batch; every output comes back as an ``(N, dim)`` array.

        Args:
            images: one image or a list of them (paths, bytes, PIL images or uint8
                arrays), or a 4-D ``(N, H, W, C)`` uint8 array.
            outputs: which outputs to compute; all of them by default.
        """
        batch, _ = as_batch(images)
        if not batch:
            return {n: np.zeros((0, self.info.outputs[n]), np.float32) for n in outputs or self.info.outputs}
        return self.run(self.preprocess(batch), outputs)
