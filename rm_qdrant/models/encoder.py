"""Encoding images with an ONNX graph through ONNX Runtime (the runtime never uses torch)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import onnxruntime as ort

from rm_qdrant.core.inputspec import DEFAULT_DECODE, check_decode
from rm_qdrant.core.modelinfo import METADATA_KEY, ModelInfo, check_input_shape, parse_metadata
from rm_qdrant.errors import EncoderError, RmqError
from rm_qdrant.models.images import MAX_PIXELS, ImageLike, as_batch, pixels

log = logging.getLogger(__name__)


def fingerprint_bytes(data: bytes) -> str:
    """The fingerprint rm-qdrant records for a graph: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(data).hexdigest()[:16]


def external_data(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """Every tensor in ``model`` whose bytes are kept in another file: ``(tensor name, file named)``.

    Looks everywhere ONNX Runtime reads tensors from: initializers and sparse
    initializers, tensor attributes (``Constant`` nodes), the subgraphs of control-flow
    nodes (``If``, ``Loop``, ``Scan``) at any depth, model-local functions and training
    graphs. ONNX Runtime would read such a file from the current directory when a
    graph is loaded from bytes.
    """
    found: list[tuple[str, str]] = []
    graphs = [model.graph, *(g for t in model.training_info for g in (t.initialization, t.algorithm))]
    # A function's attribute defaults (attribute_proto) are tensors too: a node that calls
    # the function without the attribute gets the default.
    attributes = [
        a for f in model.functions for a in (*f.attribute_proto, *(a for n in f.node for a in n.attribute))
    ]
    while graphs or attributes:
        if graphs:
            graph = graphs.pop()
            tensors = [*graph.initializer, *_sparse(graph.sparse_initializer)]
            found.extend(_external(tensors))
            attributes.extend(a for n in graph.node for a in n.attribute)
            continue
        attribute = attributes.pop()
        tensors = [*attribute.tensors, *_sparse(attribute.sparse_tensors)]
        if attribute.HasField("t"):
            tensors.append(attribute.t)
        if attribute.HasField("sparse_tensor"):
            tensors.extend(_sparse([attribute.sparse_tensor]))
        found.extend(_external(tensors))
        graphs.extend(attribute.graphs)
        if attribute.HasField("g"):
            graphs.append(attribute.g)
    return found


def _sparse(tensors: Sequence[onnx.SparseTensorProto]) -> list[onnx.TensorProto]:
    return [part for t in tensors for part in (t.values, t.indices)]


def _external(tensors: Sequence[onnx.TensorProto]) -> list[tuple[str, str]]:
    found = []
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            entries = {e.key: e.value for e in tensor.external_data}
            found.append((tensor.name, entries.get("location", "")))
    return found


def refuse_external_data(model: onnx.ModelProto, source: str, error: type[RmqError] = EncoderError) -> None:
    """Refuse a graph that keeps any tensor in another file (see :func:`external_data`).

    Raises:
        EncoderError (or ``error``): one line naming the graph, the first such tensor and its file.
    """
    found = external_data(model)
    if found:
        name, location = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise error(
            f"{source}: tensor {_short(name)} keeps its data in an external file, {_short(location)}{more}; "
            "rm-qdrant loads only self-contained graphs, which never read other files: save it as one "
            "file (onnx.save(model, path, save_as_external_data=False))"
        )


def _short(text: str) -> str:
    """A name from a graph as it appears in a message: quoted, one line, bounded."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _parse(data: bytes, source: str) -> None:
    """Check ``data`` is an ONNX graph that reads no other file, before ONNX Runtime sees it."""
    try:
        model = onnx.ModelProto.FromString(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise EncoderError(f"{source} is not a loadable ONNX graph: {type(exc).__name__}: {exc}") from exc
    refuse_external_data(model, source)


def _providers() -> list[str]:
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


#: ONNX Runtime's input types, as the metadata's ``input.dtype`` names them.
ORT_DTYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8"}


def run_in_chunks(
    session: Any,
    input_name: str,
    names: Sequence[str],
    tensor: np.ndarray,
    *,
    chunk: int,
    fixed: bool,
    what: str,
    prepare: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Run an ONNX Runtime session ``chunk`` images at a time; each output comes back ``(N, values)``.

    Args:
        session: an ``onnxruntime.InferenceSession``.
        input_name: the graph's image input.
        names: the graph outputs to compute.
        tensor: the preprocessed batch, images on axis 0.
        chunk: images per call.
        fixed: the graph takes exactly ``chunk`` images: the last chunk is padded with
            zeros and the padded rows are dropped.
        what: names the graph in errors.
        prepare: applied to each chunk before it is fed (decoded pixels to the graph's input).

    Raises:
        EncoderError: inference fails, or an output has no row per image.
    """
    parts: list[list[np.ndarray]] = [[] for _ in names]
    for start in range(0, len(tensor), chunk):
        rows = tensor[start : start + chunk]
        feed = rows if prepare is None else prepare(rows)
        if fixed and len(rows) < chunk:
            feed = np.concatenate([feed, np.zeros((chunk - len(rows), *feed.shape[1:]), feed.dtype)])
        try:
            values = session.run(list(names), {input_name: feed})
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EncoderError(f"{what}: inference failed: {exc}") from exc
        for part, name, value in zip(parts, names, values, strict=True):
            value = np.asarray(value, dtype=np.float32)
            if value.ndim == 0 or value.shape[0] != len(feed):
                raise EncoderError(
                    f"{what}: output {name!r} has shape {list(value.shape)} for {len(feed)} images; "
                    "rm-qdrant needs one row per image"
                )
            part.append(value.reshape(len(feed), -1)[: len(rows)])
    return [np.concatenate(p) for p in parts] if len(tensor) else []


_Decoder = TypeVar("_Decoder", bound="PixelDecoder")


def open_session(
    path: Path, *, threads: int = 0, spin: bool = False, providers: Sequence[str] | None = None
) -> tuple[bytes, Any]:
    """A graph file's bytes and an ONNX Runtime session over them, after :func:`_parse` has
    refused what is not a self-contained ONNX graph.

    Args:
        threads: intra-op threads (0: ONNX Runtime's default).
        spin: let ONNX Runtime's threads busy-wait between calls.
        providers: execution providers in order of preference (None: CUDA where installed, else CPU).

    Raises:
        EncoderError: the file cannot be read, or is not a loadable graph.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EncoderError(f"cannot read encoder {path}: {exc.strerror or exc}") from exc
    _parse(data, str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    # ONNX Runtime's threads otherwise busy-wait for the next call, taking the cores that
    # fetch, decode and write between calls (benchmarks/migration_throughput.py).
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    try:
        session = ort.InferenceSession(data, options, providers=list(providers or _providers()))
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EncoderError(f"{path} is not a loadable ONNX graph: {exc}") from exc
    return data, session


class PixelDecoder:
    """Decodes images as a graph takes them, from its metadata alone (no ONNX Runtime session):
    what a process that only fetches and decodes needs (see migration/ray_engine.py).

    ``decode``: ``exact`` or ``fast`` (see :func:`rm_qdrant.models.images.pixels`); a pair's
    commands use the mode it records.
    """

    def __init__(self, info: ModelInfo, *, decode: str = DEFAULT_DECODE) -> None:
        self.info = info
        self.decoding = check_decode(decode)

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one decoded item: ``(height, width, channels)``."""
        spec = self.info.input
        return (spec.height, spec.width, spec.channels)

    #: The dtype of decoded items.
    item_dtype: Any = np.uint8

    def blank(self, count: int) -> np.ndarray:
        """``count`` black images, decoded: what a check that only runs the graph feeds it."""
        return np.zeros((count, *self.item_shape), self.item_dtype)

    def decoding_as(self: _Decoder, decode: str) -> _Decoder:
        """This decoder (or encoder: the same ONNX Runtime session) decoding ``exact`` or ``fast``."""
        if check_decode(decode) == self.decoding:
            return self
        other = copy.copy(self)
        other.decoding = decode
        return other

    def decode(self, image: ImageLike, *, max_pixels: int = MAX_PIXELS) -> np.ndarray:
        """One image's ``(height, width, channels)`` uint8 pixels, sized as the graph takes them.

        Raises:
            ImageError: the image cannot be decoded, or declares more than ``max_pixels``.
        """
        spec = self.info.input
        return pixels(
            image,
            height=spec.height,
            width=spec.width,
            channels=spec.channels,
            resize=spec.resize,
            crop=spec.crop,
            channel_order=spec.channel_order,
            interpolation=spec.interpolation,
            orientation=spec.orientation,
            decode=self.decoding,
            max_pixels=max_pixels,
        )


class OnnxEncoder(PixelDecoder):
    """One ONNX graph, one ONNX Runtime session, reused for every call.

    Args:
        path: The ``.onnx`` file. Its ``rm_qdrant`` metadata entry describes it
            (see :mod:`rm_qdrant.core.modelinfo`).
        batch_size: Images per inference call. A graph whose batch axis is fixed at B
            gets exactly B per call instead (the last call padded with zeros).
        threads: Intra-op threads for ONNX Runtime (0: its default).
        spin: let ONNX Runtime's threads busy-wait between calls (its default): faster for
            an encoder that has the machine to itself, slower beside other work.
        providers: ONNX Runtime execution providers, in order of preference (None: CUDA where
            it is installed, else the CPU).
        decode: how images are decoded, ``exact`` or ``fast`` (:class:`PixelDecoder`).

    Raises:
        EncoderError: the file is missing, not an ONNX graph, keeps tensors in external
            data files, or lacks the metadata or outputs rm-qdrant needs.

    Example:
        >>> enc = OnnxEncoder("model.onnx")  # doctest: +SKIP
        >>> enc.encode(["cat.jpg", "dog.jpg"])["new"].shape  # doctest: +SKIP
        (2, 128)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int = 64,
        threads: int = 0,
        spin: bool = False,
        providers: Sequence[str] | None = None,
        decode: str = DEFAULT_DECODE,
    ):
        path = Path(path)
        data, session = open_session(path, threads=threads, spin=spin, providers=providers)
        self._setup(path, data, session, batch_size=batch_size, providers=providers, decode=decode)

    def _setup(
        self,
        path: Path,
        data: bytes,
        session: Any,
        *,
        batch_size: int,
        providers: Sequence[str] | None,
        decode: str,
    ) -> None:
        """Describe the graph at ``path`` from its bytes and its opened session (see ``__init__``)."""
        self.decoding = check_decode(decode)
        self.path = path
        self._session = session
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            names = {i.name for i in inputs}
            meta = self._session.get_modelmeta().custom_metadata_map
            if {"input_ids", "attention_mask"} <= names and METADATA_KEY in meta:
                # stamped, but load_encoder could not read it as text: say what is wrong with it
                parse_metadata(meta, [o.name for o in self._session.get_outputs()], source=str(self.path))
            if {"input_ids", "attention_mask"} <= names:
                raise EncoderError(
                    f"{self.path} is a text graph: stamp it with 'rmq model stamp --tokenizer PATH' "
                    "(rm_qdrant.load_encoder reads a stamped one)"
                )
            raise EncoderError(f"{self.path}: expected one 4-D image input, got {len(inputs)} inputs")
        self._input_name = inputs[0].name
        outputs = [o.name for o in self._session.get_outputs()]
        meta = self._session.get_modelmeta().custom_metadata_map
        info = parse_metadata(meta, outputs, source=str(self.path))
        self.info = dataclasses.replace(info, fingerprint=fingerprint_bytes(data))
        #: The batch size the graph is fixed at, or None for a dynamic batch axis.
        self.fixed_batch = check_input_shape(info.input, inputs[0].shape, str(self.path))
        if ORT_DTYPES.get(inputs[0].type, inputs[0].type) != info.input.dtype:
            raise EncoderError(
                f"{self.path}: the graph's input is {inputs[0].type}, metadata says {info.input.dtype}"
            )
        self.batch_size = batch_size
        running = self._session.get_providers()[0]
        wanted = providers or _providers()
        if "CUDAExecutionProvider" in wanted and running != "CUDAExecutionProvider":
            log.info("CUDA is installed but not usable here: %s encodes on the CPU", self.path)
        log.debug("loaded encoder %s (%s) on %s", self.path, self.info.name, self._session.get_providers())

    @property
    def fingerprint(self) -> str:
        return self.info.fingerprint

    @property
    def provider(self) -> str:
        """The ONNX Runtime execution provider the session runs on first (CUDA, or the CPU)."""
        return str(self._session.get_providers()[0])

    def preprocess(self, images: Sequence[ImageLike], *, max_pixels: int = MAX_PIXELS) -> np.ndarray:
        """Decode and lay out a batch of images as the graph's input tensor.

        Raises:
            ImageError: an image cannot be decoded, or declares more than ``max_pixels``.
        """
        return self.layout(np.stack([self.decode(i, max_pixels=max_pixels) for i in images]))

    def layout(self, batch: np.ndarray) -> np.ndarray:
        """Decoded pixels ``(N, height, width, channels)`` as the graph's input: dtype, scaling, layout."""
        spec = self.info.input
        if spec.dtype == "float32":  # the same arithmetic as (x / 255 - mean) / std, in one buffer
            batch = batch.astype(np.float32)
            batch /= np.float32(255.0)
            if spec.mean:
                batch -= np.asarray(spec.mean, dtype=np.float32)
            if spec.std:
                batch /= np.asarray(spec.std, dtype=np.float32)
        if spec.layout == "NCHW":
            batch = batch.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(batch)

    def run(self, tensor: np.ndarray, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the graph on an already preprocessed input tensor; results are keyed by role.

        A graph fixed at batch size B gets exactly B images per call (the last call
        padded with zeros, whose rows are dropped).

        Raises:
            EncoderError: an unknown role, a failed inference, or an output whose
                size is not what the metadata says.
        """
        return self._run(tensor, outputs, None)

    def run_pixels(self, images: np.ndarray, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """:meth:`run` on decoded ``(N, height, width, channels)`` pixels, laid out a call's worth at a time.

        The input tensor of a whole batch (float32, often four times the pixels) is never built.
        """
        return self._run(images, outputs, self.layout)

    def _run(
        self,
        tensor: np.ndarray,
        outputs: Sequence[str] | None,
        prepare: Callable[[np.ndarray], np.ndarray] | None,
    ) -> dict[str, np.ndarray]:
        roles = self._roles(outputs)
        if not len(tensor):
            return {r: np.zeros((0, self.info.outputs[r]), np.float32) for r in roles}
        values = run_in_chunks(
            self._session,
            self._input_name,
            [self.info.graph_output(r) for r in roles],
            tensor,
            chunk=self.fixed_batch or self.batch_size,
            fixed=self.fixed_batch is not None,
            what=str(self.path),
            prepare=prepare,
        )
        merged = dict(zip(roles, values, strict=True))
        for role, value in merged.items():
            if value.shape[1] != self.info.outputs[role]:
                raise EncoderError(
                    f"{self.path}: output {role!r} has {value.shape[1]} values per image, "
                    f"metadata says {self.info.outputs[role]}"
                )
        return merged

    def encode(
        self,
        images: ImageLike | Sequence[ImageLike],
        outputs: Sequence[str] | None = None,
        *,
        query: bool = False,
    ) -> dict[str, np.ndarray]:
        """Encode one image or a batch; every output comes back as an ``(N, dim)`` array.

        Args:
            images: one image or a list of them (paths, bytes, PIL images or uint8
                arrays), or a 4-D ``(N, H, W, C)`` uint8 array.
            outputs: which roles to compute (``new``, ``rev``, ``embedding``,
                ``scores``); all of the graph's by default. Results are keyed by role,
                whatever the graph calls its outputs.
            query: the items are search queries (a text graph puts its query prefix
                before them); images are encoded the same either way.
        """
        batch, _ = as_batch(images)
        roles = self._roles(outputs)
        if not batch:
            return {r: np.zeros((0, self.info.outputs[r]), np.float32) for r in roles}
        return self.run_pixels(np.stack([self.decode(i) for i in batch]), roles)

    def _roles(self, outputs: Sequence[str] | None) -> list[str]:
        roles = list(outputs or self.info.outputs)
        for role in roles:
            self.info.graph_output(role)  # raises EncoderError for a role the graph lacks
        return roles
