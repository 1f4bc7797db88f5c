"""Describe an ONNX text encoder for rm-qdrant, with its tokenizer: ``rmq model stamp --tokenizer PATH``.

Takes a graph as common exporters write it: inputs ``input_ids`` and ``attention_mask``,
optionally ``token_type_ids``; an output of token states ``(texts, tokens, dim)`` (pooled
``mean`` or ``cls``) or one vector a text (``output``). The tokenizer (a ``tokenizers``
JSON file, or a WordPiece ``vocab.txt``) is written into the graph beside the entry, so
the stamped file is one model: a different tokenizer makes a different fingerprint.

What the stamp checks by running the graph: the tokenizer's largest token id fits the
graph's embedding table; ``max_length`` tokens fit its position table (if not, the message
names the longest window it runs on); each output has the rank its pooling needs;
``--scale unit`` vectors have norm 1.

``max_length`` left out is the window the tokenizers JSON states itself (its
``truncation.max_length``, what ``tokenizer.json`` files saved with truncation carry); a
``vocab.txt``, or a JSON that states none, needs it given: the model's window is a fact of
the model, never guessed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.core.inputspec import clip
from rm_qdrant.core.modelinfo import METADATA_KEY, ModelInfo, parse_metadata
from rm_qdrant.core.textspec import (
    MAX_TOKENS,
    TOKENIZER_KEY,
    TextSpec,
    check_prefix,
    tokenizer_sha,
)
from rm_qdrant.errors import ConfigError, EncoderError
from rm_qdrant.models.stamp import _check_roles, _load, _set_entry, _write
from rm_qdrant.models.text import check_text_inputs, load_tokenizer, pool, text_feed
from rm_qdrant.models.tokenizer_file import read_tokenizer, stated_window

__all__ = ["TextStampReport", "read_tokenizer", "stamp_text_model"]

#: Sentences the stamp runs the graph on (dimension, pooling and scale checks).
_SAMPLES = (
    "A short sentence.",
    "The quick brown fox jumps over the lazy dog, twice, and then rests in the shade of an old tree.",
)


@dataclass(frozen=True)
class TextStampReport:
    """What :func:`stamp_text_model` wrote (see :class:`~rm_qdrant.models.stamp.StampReport`).

    Attributes:
        vocabulary: the tokenizer's size, added tokens included.
        max_length_from: where ``max_length`` came from: ``"given"``, or ``"tokenizer"`` (the
            tokenizers JSON's own truncation).
    """

    source: Path
    out: Path
    info: ModelInfo
    vocabulary: int
    replaced: bool
    max_length_from: str = "given"


def _window(max_length: int | None, document: str, *, tokenizer: Path) -> tuple[int, str]:
    """``max_length`` as given, else the tokenizer's own; and where it came from."""
    if max_length is not None:
        if (
            isinstance(max_length, bool)
            or not isinstance(max_length, int)
            or not 2 <= max_length <= MAX_TOKENS
        ):
            raise ConfigError(f"--max-length is 2 to {MAX_TOKENS:,} tokens, got {max_length!r}")
        return max_length, "given"
    stated = stated_window(document)
    if stated is None:
        raise ConfigError(
            f"--max-length is needed: {tokenizer} states no window of its own (a vocab.txt, or a "
            "tokenizer.json saved without truncation); give the model's, e.g. 256 for all-MiniLM-L6-v2, "
            "512 for BERT"
        )
    return stated, "tokenizer"


def stamp_text_model(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    outputs: Mapping[str, str],
    tokenizer: str | os.PathLike[str],
    max_length: int | None = None,
    pooling: str = "mean",
    normalize: bool = True,
    truncation: str = "right",
    query_prefix: str = "",
    document_prefix: str = "",
    distance: str | None = None,
    scale: str | None = None,
    name: str | None = None,
) -> TextStampReport:
    """Write ``source`` to ``out`` with the ``rm_qdrant`` entry of a text encoder and its tokenizer.

    Args:
        source: An ONNX text graph (see the module's docstring).
        out: Where the stamped graph goes (may be ``source``).
        outputs: Role → the graph's output name, as for images.
        tokenizer: A ``tokenizers`` JSON file or a WordPiece ``vocab.txt``.
        max_length: Tokens per text, special tokens included (the model's window); None:
            the window the tokenizers JSON states itself (its truncation), else refused.
        pooling: ``mean``, ``cls`` or ``output``.
        normalize: L2-normalise the pooled vectors.
        truncation: Keep a long text's start (``right``) or end (``left``).
        query_prefix: Put before every query, e.g. ``"query: "``.
        document_prefix: Put before every document, e.g. ``"passage: "``.
        distance, scale, name: As :func:`~rm_qdrant.models.stamp.stamp_model` takes them.

    Raises:
        ConfigError: a tokenizer or option that does not fit the graph (one line each).
        EncoderError: the graph cannot be read or run.
    """
    source, out = Path(source), Path(out)
    model = _load(source)
    weights = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in weights]
    document = read_tokenizer(tokenizer)
    max_length, max_length_from = _window(max_length, document, tokenizer=Path(tokenizer))
    try:
        spec = TextSpec(
            max_length=max_length,
            pooling=pooling,
            normalize=normalize,
            truncation=truncation,
            query_prefix=check_prefix(query_prefix, "--query-prefix"),
            document_prefix=check_prefix(document_prefix, "--document-prefix"),
            token_type_ids=any(i.name == "token_type_ids" for i in inputs),
            tokenizer_sha256=tokenizer_sha(document),
            tokenizer=document,
        )
        check_text_inputs([_Input(i) for i in inputs], spec, str(source))
    except EncoderError as exc:
        raise ConfigError(str(exc)) from exc
    graph_outputs = {o.name: o for o in model.graph.output}
    _check_roles(outputs, graph_outputs, source)
    draft = ModelInfo(
        name or source.stem, distance, dict.fromkeys(outputs, 1), spec, output_names=outputs, scale=scale
    )
    try:
        info = parse_metadata(draft.to_metadata(), list(graph_outputs), source=str(source))
        tok = load_tokenizer(info.input, str(source))  # type: ignore[arg-type]  # a TextSpec
    except EncoderError as exc:
        raise ConfigError(f"cannot stamp {exc}") from exc
    _check_prefixes(tok, spec, source)
    _check_room(spec, source)
    session = _quiet_session(model, source)
    feed_types = {i.name: i.type for i in session.get_inputs()}
    vocabulary = int(tok.get_vocab_size(with_added_tokens=True))
    _check_fits(session, feed_types, tok, max_length, source)
    dims = _dims(session, feed_types, tok, info, outputs, source)
    info = dataclasses.replace(info, outputs=dims)
    entry = info.to_metadata()
    replaced = _set_entry(model, entry[METADATA_KEY])
    _set_tokenizer(model, entry[TOKENIZER_KEY])
    _write(model, out)
    return TextStampReport(source, out, info, vocabulary, replaced, max_length_from)


def _quiet_session(model: Any, source: Path) -> Any:
    """A CPU session that logs nothing: a run the checks expect to fail is reported in one line,
    not also in ONNX Runtime's own error log on stderr."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EncoderError(f"{source} is not a loadable ONNX graph: {clip(str(exc))}") from exc


@dataclass(frozen=True)
class _Input:
    """A graph input as :func:`check_text_inputs` reads an ONNX Runtime one (name and type)."""

    proto: Any

    @property
    def name(self) -> str:
        return str(self.proto.name)

    @property
    def type(self) -> str:
        elem = self.proto.type.tensor_type.elem_type
        return {6: "tensor(int32)", 7: "tensor(int64)"}.get(elem, f"tensor type {elem}")


def _check_prefixes(tok: Any, spec: TextSpec, source: Path) -> None:
    """A prefix must mean something to the tokenizer: not blank, not only unknown tokens."""
    unk_token = (json.loads(spec.tokenizer).get("model") or {}).get("unk_token")
    unknown = tok.token_to_id(unk_token) if isinstance(unk_token, str) else None
    for option, prefix in (
        ("--query-prefix", spec.query_prefix),
        ("--document-prefix", spec.document_prefix),
    ):
        if not prefix:
            continue
        ids = tok.encode(prefix, add_special_tokens=False).ids
        if not prefix.strip() or not ids or all(i == unknown for i in ids):
            raise ConfigError(
                f"{option} {prefix!r} is no text this tokenizer knows ({source}): a model that takes no "
                "prefix takes no option either"
            )


def _check_room(spec: TextSpec, source: Path) -> None:
    """A text keeps a token of its own in the window, after the special tokens and its prefix: else
    every document (or every query) is the same tokens, and so the same vector. A prefix is kept
    only where a long text is cut at its end: cut at its start, a long text loses the prefix."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(spec.tokenizer)
    tok.no_truncation()
    tok.no_padding()
    specials = tok.encode("").tokens
    for option, prefix in (
        ("--document-prefix", spec.document_prefix),
        ("--query-prefix", spec.query_prefix),
    ):
        if prefix and spec.truncation == "left":  # the tokenizer cuts the prefix off a long text
            raise ConfigError(
                f"--truncation left cuts a long text's start, and {option} {prefix!r} with it: a model "
                "that takes a prefix reads it on every text (--truncation right)"
            )
        taken = len(tok.encode(prefix).ids)
        if taken < spec.max_length:
            continue
        parts = ([f"{option} {prefix!r}"] if prefix else []) + specials
        names = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}"
        raise ConfigError(
            f"--max-length {spec.max_length} leaves no token for the text: {names} "
            f"take{'s' if len(parts) == 1 else ''} {taken} ({source}); every text would be the same vector"
        )


def _run(
    session: Any, feed_types: dict[str, str], ids: np.ndarray, names: list[str] | None = None
) -> list[Any]:
    return list(session.run(names, text_feed(feed_types, ids, np.ones_like(ids))))


def _check_fits(session: Any, feed_types: dict[str, str], tok: Any, max_length: int, source: Path) -> None:
    """The tokenizer's largest id, and ``max_length`` tokens, are inputs the graph can take.

    The largest id, not the vocabulary's size less one: a vocabulary's ids may have gaps (an
    added token numbered past the rest), and the graph meets every one of them in some text.
    """
    vocabulary = int(tok.get_vocab_size(with_added_tokens=True))
    largest = max(tok.get_vocab(with_added_tokens=True).values(), default=0)
    try:
        _run(session, feed_types, np.array([[1, largest, 2]], np.int64))
    except Exception as exc:  # onnxruntime raises its own untyped errors
        ids = "" if largest == vocabulary - 1 else f", ids up to {largest:,}"
        raise ConfigError(
            f"{source} does not take token id {largest:,}: the tokenizer's vocabulary ({vocabulary:,}{ids}) "
            f"is larger than the graph's embedding table; is it the model's own tokenizer? "
            f"({clip(str(exc).splitlines()[0])})"
        ) from exc
    if _runs(session, feed_types, width=max_length):
        return
    longest = _longest_window(session, feed_types, fails=max_length)
    takes = f"it runs on {longest} at most: --max-length {longest}" if longest else "nor on 2"
    raise ConfigError(f"{source} does not run on {max_length} tokens, over its position table; {takes}")


def _runs(session: Any, feed_types: dict[str, str], *, width: int) -> bool:
    try:
        _run(session, feed_types, np.ones((1, width), np.int64))
    except Exception:  # onnxruntime raises its own untyped errors
        return False
    return True


def _longest_window(session: Any, feed_types: dict[str, str], *, fails: int) -> int | None:
    """The most tokens below ``fails`` the graph runs on (a bisection: a few runs), None if not 2."""
    if not _runs(session, feed_types, width=2):
        return None
    runs = 2
    while fails - runs > 1:
        middle = (runs + fails) // 2
        runs, fails = (middle, fails) if _runs(session, feed_types, width=middle) else (runs, middle)
    return runs


def _dims(
    session: Any,
    feed_types: dict[str, str],
    tok: Any,
    info: ModelInfo,
    outputs: Mapping[str, str],
    source: Path,
) -> dict[str, int]:
    """Each role's dimension, from a run on sample sentences pooled as ``info`` says; a ``unit``
    scale is checked on the vectors."""
    encodings = tok.encode_batch(list(_SAMPLES))
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), np.int64)
    mask = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    names = list(outputs.values())
    try:
        values = session.run(names, text_feed(feed_types, ids, mask))
    except Exception as exc:
        raise ConfigError(
            f"{source} does not run on tokenised text: {str(exc).splitlines()[0][:200]}"
        ) from exc
    dims = {}
    for (role, name), value in zip(outputs.items(), values, strict=True):
        try:
            vectors = pool(np.asarray(value, np.float32), mask, info.input, name)  # type: ignore[arg-type]
        except EncoderError as exc:
            raise ConfigError(f"{source}: {exc} (--pooling)") from exc
        norms = np.linalg.norm(vectors, axis=1)
        if info.scale == "unit" and role != "scores" and not np.all(np.abs(norms - 1.0) <= 1e-3):
            raise ConfigError(
                f"{source}: --scale unit, but output {name!r} ({role}) gives vectors of norm "
                f"{norms.min():.4g} to {norms.max():.4g}: add --normalize, or stamp it --scale raw"
            )
        dims[role] = int(vectors.shape[1])
    return dims


def _set_tokenizer(model: Any, document: str) -> None:
    for index in reversed([i for i, p in enumerate(model.metadata_props) if p.key == TOKENIZER_KEY]):
        del model.metadata_props[index]
    model.metadata_props.add(key=TOKENIZER_KEY, value=document)
