"""Encoding text with an ONNX graph and the tokenizer stamped into it.

A text item becomes one ``(2, max_length)`` int64 row, token ids over the attention
mask, padded with zeros: the shape the migration's batches preallocate, as they do
pixels for images. The graph gets each call's rows trimmed to its longest text, its
token states are pooled as the graph's metadata says (:mod:`rm_qdrant.core.textspec`),
and the vectors L2-normalised where it says so.

What is not text is a recorded failure of that document, never a crash: a value that is
not a string or bytes, bytes that are not UTF-8, binary data read as text (a NUL, or many
control characters; a stray one is text), an empty text, or one over :data:`MAX_TEXT_BYTES`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.core.inputspec import DEFAULT_DECODE, check_decode, clip
from rm_qdrant.core.modelinfo import METADATA_KEY, ModelInfo, parse_metadata
from rm_qdrant.core.textspec import TEXT_INPUTS, TextSpec, is_text_input
from rm_qdrant.errors import EncoderError, TextError
from rm_qdrant.models.encoder import OnnxEncoder, PixelDecoder, fingerprint_bytes, open_session

#: The largest text read, in UTF-8 bytes: beyond any model's window, and a bound on the work one
#: document can cost (the tokenizer reads all of it before truncating).
MAX_TEXT_BYTES = 1 << 20
#: What no text holds, and binary data read as text does: NUL (UTF-16 text read as UTF-8 is half
#: NULs) and lone surrogates.
_BINARY = re.compile("[\x00\ud800-\udfff]")
#: The other control characters (all but tab, line feed, form feed and carriage return): a
#: stray one is text (a word processor's line break U+000B, a cp1252 byte read as Latin-1);
#: binary data holds many.
_CONTROL = re.compile("[\x01-\x08\x0b\x0e-\x1f\x7f-\x9f]")
#: A text is binary data when more than one character in this many is a control character.
CONTROL_SHARE = 20


def load_tokenizer(spec: TextSpec, source: str) -> Any:
    """The ``tokenizers.Tokenizer`` of ``spec``, truncating at ``max_length`` on its side and not padding.

    Raises:
        EncoderError: the entry is not a tokenizer ``tokenizers`` can read.
    """
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(spec.tokenizer)
    except Exception as exc:  # tokenizers raises its own untyped errors
        raise EncoderError(f"{source}: the stamped tokenizer cannot be read: {clip(str(exc))}") from exc
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_length, direction=spec.truncation)
    return tokenizer


def as_text(item: object) -> str:
    """A document or query as text: a string, or UTF-8 bytes.

    Raises:
        TextError: not a string or bytes, not UTF-8, over :data:`MAX_TEXT_BYTES`, empty, or
            binary data read as text: a NUL or a lone surrogate, or control characters in more
            than one character in :data:`CONTROL_SHARE`.
    """
    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        if len(data) > MAX_TEXT_BYTES:
            raise TextError(f"the text is {len(data):,} bytes, over the {MAX_TEXT_BYTES:,} read")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TextError(f"the text is not UTF-8 (byte {exc.start} is {data[exc.start]:#04x})") from exc
    elif isinstance(item, str):
        text = item
        if len(text) > MAX_TEXT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise TextError(f"the text is over the {MAX_TEXT_BYTES:,} bytes read")
    else:
        raise TextError(f"expected text, got {type(item).__name__} {clip(repr(item))}")
    if not text.strip():
        raise TextError("the text is empty")
    bad = _BINARY.search(text)
    controls = _CONTROL.findall(text) if bad is None else []
    if len(controls) * CONTROL_SHARE > len(text):
        bad = _CONTROL.search(text)
    if bad is not None:
        raise TextError(f"the text holds control character U+{ord(bad.group()):04X}: binary data, not text")
    return text


class TextDecoder:
    """Tokenises texts as a graph takes them, from its metadata alone (no ONNX Runtime session).

    ``truncated`` counts the items cut at ``max_length`` since it was made (all threads).
    """

    item_dtype: Any = np.int64

    def __init__(self, info: ModelInfo, *, decode: str = DEFAULT_DECODE) -> None:
        if not isinstance(info.input, TextSpec):
            raise EncoderError(f"model {info.name!r} reads images, not text")
        self.info = info
        self.decoding = check_decode(decode)  # recorded by the pair; text has one way
        self._tokenizer = load_tokenizer(info.input, info.name)
        self._lock = threading.Lock()
        self.truncated = 0

    @property
    def spec(self) -> TextSpec:
        return self.info.input  # type: ignore[return-value]  # checked in __init__

    @property
    def item_shape(self) -> tuple[int, ...]:
        return (2, self.spec.max_length)

    @property
    def vocabulary(self) -> int:
        """The tokenizer's size, added tokens included."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def blank(self, count: int) -> np.ndarray:
        """``count`` decoded one-token texts (token id 0): what a check that only runs the graph feeds it."""
        rows = np.zeros((count, *self.item_shape), self.item_dtype)
        rows[:, 1, 0] = 1
        return rows

    def decoding_as(self, decode: str) -> TextDecoder:
        check_decode(decode)
        return self  # text is read one way

    def decode(self, item: object, *, max_pixels: int = 0, query: bool = False) -> np.ndarray:
        """One text's ``(2, max_length)`` row: token ids, then the attention mask.

        ``max_pixels`` is an image's bound, unused here. ``query``: put the query prefix
        before the text, else the document prefix.

        Raises:
            TextError: the item is not text (:func:`as_text`), or tokenises to nothing.
        """
        return self.tokenise(item, query=query)[0]

    def tokenise(self, item: object, *, query: bool = False) -> tuple[np.ndarray, bool]:
        """:meth:`decode`'s row, and whether the text was cut at ``max_length`` (the migration
        counts the documents it cut, ``rmq status`` shows them).

        Raises:
            TextError: as :meth:`decode`.
        """
        text = self.spec.prefix(query=query) + as_text(item)
        encoding = self._tokenizer.encode(text)
        ids = encoding.ids
        if len(ids) == 0:
            raise TextError("the text tokenises to nothing")
        cut = bool(encoding.overflowing)
        if cut:
            with self._lock:
                self.truncated += 1
        row = np.zeros(self.item_shape, np.int64)
        row[0, : len(ids)] = ids
        row[1, : len(ids)] = encoding.attention_mask
        return row, cut


class TextEncoder(TextDecoder, OnnxEncoder):
    """A text graph, its tokenizer, and one ONNX Runtime session reused for every call.

    Takes :class:`~rm_qdrant.models.encoder.OnnxEncoder`'s arguments; ``decode`` is recorded
    and ignored. ``run_pixels`` takes the decoded ``(N, 2, max_length)`` rows.

    Raises:
        EncoderError: the file is missing or not a text graph rm-qdrant can run: inputs other
            than ``input_ids``, ``attention_mask`` and ``token_type_ids``, or an output that is
            not what ``pooling`` says.
    """

    __init__ = OnnxEncoder.__init__  # not TextDecoder's, which comes first in the MRO

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
        self.path = path
        self._session = session
        outputs = [o.name for o in self._session.get_outputs()]
        meta = self._session.get_modelmeta().custom_metadata_map
        info = parse_metadata(meta, outputs, source=str(self.path))
        info = dataclasses.replace(info, fingerprint=fingerprint_bytes(data))
        TextDecoder.__init__(self, info, decode=decode)
        self._inputs = check_text_inputs(self._session.get_inputs(), self.spec, str(self.path))
        self.fixed_batch = None
        self.batch_size = batch_size

    def layout(self, batch: np.ndarray) -> np.ndarray:
        return batch

    def preprocess(self, images: Sequence[Any], *, max_pixels: int = 0) -> np.ndarray:
        return np.stack([self.decode(i) for i in images])

    def encode(
        self, images: Any, outputs: Sequence[str] | None = None, *, query: bool = False
    ) -> dict[str, np.ndarray]:
        """Encode one text or a list of them (strings or UTF-8 bytes); see :meth:`OnnxEncoder.encode`.

        Raises:
            TextError: an item is not text.
        """
        batch = list(images) if isinstance(images, (list, tuple)) else [images]
        roles = self._roles(outputs)
        if not batch:
            return {r: np.zeros((0, self.info.outputs[r]), np.float32) for r in roles}
        return self.run_pixels(np.stack([self.decode(t, query=query) for t in batch]), roles)

    def _run(self, tensor: np.ndarray, outputs: Sequence[str] | None, prepare: Any) -> dict[str, np.ndarray]:
        roles = self._roles(outputs)
        names = [self.info.graph_output(r) for r in roles]
        parts: list[list[np.ndarray]] = [[] for _ in roles]
        # Texts of like length go in one call: each call is padded to its longest text only.
        order = np.argsort(tensor[:, 1].sum(axis=1), kind="stable")
        for start in range(0, len(tensor), self.batch_size):
            rows = tensor[order[start : start + self.batch_size]]
            for part, value in zip(parts, self._call(rows, names), strict=True):
                part.append(value)
        merged = {}
        for role, part in zip(roles, parts, strict=True):
            value = np.zeros((len(tensor), self.info.outputs[role]), np.float32)
            if part:
                joined = np.concatenate(part)
                if joined.shape[1] != value.shape[1]:
                    raise EncoderError(
                        f"{self.path}: output {role!r} has {joined.shape[1]} values per text, "
                        f"metadata says {value.shape[1]}"
                    )
                value[order] = joined
            merged[role] = value
        return merged

    def _call(self, rows: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """One inference on ``rows`` trimmed to their longest text; each output pooled and scaled."""
        mask = rows[:, 1]
        width = max(1, int(mask.sum(axis=1).max()))
        feed = text_feed(self._inputs, rows[:, 0, :width], mask[:, :width])
        try:
            values = self._session.run(names, feed)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise EncoderError(f"{self.path}: inference failed: {clip(str(exc))}") from exc
        width_mask = mask[:, :width]
        return [
            pool(np.asarray(v, np.float32), width_mask, self.spec, n)
            for v, n in zip(values, names, strict=True)
        ]


def check_text_inputs(inputs: Sequence[Any], spec: TextSpec, what: str) -> dict[str, str]:
    """The graph's inputs by name → their ONNX type, if they are what a text graph takes.

    Raises:
        EncoderError: an input not named as common exporters name them, a missing one, or
            ``token_type_ids`` where the metadata says otherwise.
    """
    found = {i.name: i.type for i in inputs}
    unknown = sorted(set(found) - set(TEXT_INPUTS))
    missing = [n for n in TEXT_INPUTS[:2] if n not in found]
    if unknown or missing:
        raise EncoderError(
            f"{what}: a text graph takes input_ids, attention_mask and optionally token_type_ids; "
            f"this one takes {', '.join(found) or 'nothing'}"
        )
    if ("token_type_ids" in found) != spec.token_type_ids:
        raise EncoderError(f"{what}: the graph's token_type_ids input and its metadata disagree")
    for name, kind in found.items():
        if kind not in ("tensor(int64)", "tensor(int32)"):
            raise EncoderError(f"{what}: input {name!r} is {kind}, not integer token ids")
    return found


def text_feed(inputs: dict[str, str], ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's feed for token ``ids`` and attention ``mask`` (token type ids all zero)."""
    values = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {
        name: np.ascontiguousarray(values[name], np.int32 if kind == "tensor(int32)" else np.int64)
        for name, kind in inputs.items()
    }


def pool(value: np.ndarray, mask: np.ndarray, spec: TextSpec, name: str) -> np.ndarray:
    """One output's vectors: token states ``(N, tokens, dim)`` pooled as ``spec`` says, or an
    ``(N, dim)`` output as it is; L2-normalised where ``spec.normalize``.

    Raises:
        EncoderError: the output's rank is not what ``spec.pooling`` needs.
    """
    if spec.pooling == "output":
        if value.ndim != 2:
            raise EncoderError(
                f"output {name!r} has shape {list(value.shape)}: pooling 'output' needs one vector a text"
            )
        vectors = value
    else:
        if value.ndim != 3 or value.shape[1] != mask.shape[1]:
            raise EncoderError(
                f"output {name!r} has shape {list(value.shape)}: pooling {spec.pooling!r} needs token "
                f"states (texts, {mask.shape[1]} tokens, dim)"
            )
        if spec.pooling == "cls":
            vectors = value[:, 0]
        else:
            weights = mask.astype(np.float32)[:, :, None]
            vectors = (value * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    if spec.normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, np.float32)


def reads_text(props: Mapping[str, str]) -> bool:
    """Whether a graph's metadata says it reads text (False where its entry is unreadable: the
    image encoder's own checks then say what is wrong with it)."""
    try:
        raw = json.loads(props.get(METADATA_KEY, "{}"))
    except (ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and is_text_input(raw.get("input"))


def is_text_graph(path: str | os.PathLike[str]) -> bool:
    """Whether the graph at ``path`` says it reads text (False for anything unreadable)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError, OSError: OnnxEncoder reports them
        return False
    return reads_text({p.key: p.value for p in model.metadata_props})


def load_encoder(
    path: str | os.PathLike[str],
    *,
    batch_size: int = 64,
    threads: int = 0,
    spin: bool = False,
    providers: Sequence[str] | None = None,
    decode: str = DEFAULT_DECODE,
) -> OnnxEncoder:
    """The encoder for the graph at ``path``: a :class:`TextEncoder` for a text graph, else an
    :class:`~rm_qdrant.models.encoder.OnnxEncoder` (the arguments are theirs). The file is read
    and its session opened once, whichever it is."""
    path = Path(path)
    data, session = open_session(path, threads=threads, spin=spin, providers=providers)
    kind = TextEncoder if reads_text(session.get_modelmeta().custom_metadata_map) else OnnxEncoder
    encoder = object.__new__(kind)
    encoder._setup(path, data, session, batch_size=batch_size, providers=providers, decode=decode)
    return encoder


def decoder_for(info: ModelInfo, *, decode: str = DEFAULT_DECODE) -> Any:
    """A decoder from a graph's metadata alone: a :class:`TextDecoder` or a ``PixelDecoder``."""
    if isinstance(info.input, TextSpec):
        return TextDecoder(info, decode=decode)
    return PixelDecoder(info, decode=decode)
