"""Heads on a text backbone: the pooling rm-qdrant's text encoder does in numpy, moved into the graph.

A text backbone's ``embedding`` output is usually its token states, ``(texts, tokens, dim)``,
which :class:`~rm_qdrant.models.text.TextEncoder` pools outside the graph (the mean over the
attention mask, or the first token) and L2-normalises where the stamp says
(:func:`rm_qdrant.models.text.pool`). Heads take one vector a text, so before they are joined
:func:`pool_in_graph` adds that pooling and normalisation to the backbone as ONNX nodes, with
the same arithmetic: a text's padding (the shorter texts of a batch are padded to its longest)
never reaches its vector. The composed graph then gives one vector a text, and its stamp says
so (:func:`pooled_spec`): pooling ``output``, no normalisation of its own (the heads normalise
where the backbone's scale says). The tokenizer, window, truncation, prefixes and token type
input are the backbone's, so the graph reads texts exactly as the backbone did.

No PyTorch here: ONNX nodes, and the backbone run through rm-qdrant's own encoder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rm_qdrant.core.modelinfo import ModelInfo
from rm_qdrant.core.textspec import TextSpec
from rm_qdrant.errors import EncoderError, ExportError
from rm_qdrant.models.text import TextEncoder, load_tokenizer

#: Prefix of every tensor and node the pooling adds (apart from the backbone's own names).
PREFIX = "rmq_pool/"
#: The pooled output the heads read.
POOLED = f"{PREFIX}pooled"
#: Texts of the parity check drawn from the tokenizer's own words, in these word counts: a
#: batch of several lengths (padding), one text of a single word, one cut at ``max_length``.
PARITY_WORDS = (1, 6, 3, 0, 9, 2, 4)
#: Sentences the parity check falls back on where the vocabulary has too few plain words.
_SENTENCES = (
    "A short sentence.",
    "The quick brown fox jumps over the lazy dog, twice, and then rests in the shade of an old tree.",
    "Rain",
    "Prices of bread and cheese rose again this week.",
)


def pooled_spec(spec: TextSpec) -> TextSpec:
    """The composed graph's stamp: the backbone's, but one vector a text out, normalised by the heads."""
    return dataclasses.replace(spec, pooling="output", normalize=False)


def pool_in_graph(model: onnx.ModelProto, states: str, spec: TextSpec, dim: int) -> onnx.ModelProto:
    """A copy of ``model`` with output :data:`POOLED`, ``(texts, dim)``: output ``states`` pooled and
    normalised as ``spec`` says, as :func:`rm_qdrant.models.text.pool` does (opset 13 or later).

    Raises:
        ExportError: the graph already uses a name the pooling needs.
    """
    pooled = onnx.ModelProto()
    pooled.CopyFrom(model)
    graph = pooled.graph
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    if any(name.startswith(PREFIX) for name in taken):
        raise ExportError(f"the backbone already names tensors {PREFIX}*: it has heads attached already")
    nodes, inits = _pooling(states, spec)
    vector = nodes[-1].output[0] if nodes else states
    if spec.normalize:
        more_nodes, more_inits = _l2(vector)
        nodes, inits = nodes + more_nodes, inits + more_inits
        vector = more_nodes[-1].output[0]
    nodes.append(helper.make_node("Identity", [vector], [POOLED], name=f"{PREFIX}out"))
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    graph.output.append(helper.make_tensor_value_info(POOLED, TensorProto.FLOAT, ["batch", dim]))
    return pooled


def _pooling(states: str, spec: TextSpec) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes from the token states to one vector a text (none where the output is one already)."""
    p = PREFIX
    if spec.pooling == "output":
        return [helper.make_node("Cast", [states], [f"{p}vector"], to=TensorProto.FLOAT)], []
    cast = helper.make_node("Cast", [states], [f"{p}states"], to=TensorProto.FLOAT)
    if spec.pooling == "cls":
        first = numpy_helper.from_array(np.array(0, np.int64), f"{p}first")
        return [cast, helper.make_node("Gather", [f"{p}states", f"{p}first"], [f"{p}vector"], axis=1)], [
            first
        ]
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), f"{p}tokens_axis"),
        numpy_helper.from_array(np.array([2], np.int64), f"{p}last_axis"),
        numpy_helper.from_array(np.array(1e-9, np.float32), f"{p}min_count"),
    ]
    nodes = [
        cast,
        helper.make_node("Cast", ["attention_mask"], [f"{p}mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", [f"{p}mask", f"{p}last_axis"], [f"{p}mask3"]),
        helper.make_node("Mul", [f"{p}states", f"{p}mask3"], [f"{p}masked"]),
        helper.make_node("ReduceSum", [f"{p}masked", f"{p}tokens_axis"], [f"{p}sum"], keepdims=0),
        helper.make_node("ReduceSum", [f"{p}mask", f"{p}tokens_axis"], [f"{p}count"], keepdims=1),
        helper.make_node("Max", [f"{p}count", f"{p}min_count"], [f"{p}divisor"]),
        helper.make_node("Div", [f"{p}sum", f"{p}divisor"], [f"{p}vector"]),
    ]
    return nodes, inits


def _l2(vector: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes that divide each row by its L2 norm (at least 1e-12, as the encoder does)."""
    p = PREFIX
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), f"{p}dim_axis"),
        numpy_helper.from_array(np.array(1e-12, np.float32), f"{p}min_norm"),
    ]
    nodes = [
        helper.make_node("Mul", [vector, vector], [f"{p}squares"]),
        helper.make_node("ReduceSum", [f"{p}squares", f"{p}dim_axis"], [f"{p}sum_squares"], keepdims=1),
        helper.make_node("Sqrt", [f"{p}sum_squares"], [f"{p}norm"]),
        helper.make_node("Max", [f"{p}norm", f"{p}min_norm"], [f"{p}norm_at_least"]),
        helper.make_node("Div", [vector, f"{p}norm_at_least"], [f"{p}unit"]),
    ]
    return nodes, inits


def parity_texts(spec: TextSpec, *, seed: int = 0) -> list[str]:
    """Seven texts of several lengths in the tokenizer's own words (one of them longer than
    ``max_length``), or, where its vocabulary has too few plain words, English sentences."""
    vocabulary = load_tokenizer(spec, "the backbone").get_vocab()
    words = sorted({w.lstrip("Ġ▁") for w in vocabulary if w.lstrip("Ġ▁").isalpha() and len(w) > 1})
    if len(words) < 8:
        return [*_SENTENCES, *_SENTENCES][: len(PARITY_WORDS)]
    rng = np.random.default_rng(seed)
    counts = [n or 2 * spec.max_length for n in PARITY_WORDS]
    return [" ".join(rng.choice(words, size=n)) for n in counts]


def text_embeddings(source: str, info: ModelInfo, output: str, texts: Sequence[str]) -> np.ndarray:
    """φ of ``texts`` as rm-qdrant reads the backbone: tokenised, its ``output`` pooled and
    normalised by :class:`~rm_qdrant.models.text.TextEncoder`, all texts in one batch.

    Raises:
        ExportError: ``output`` is not one of the stamped roles (the stamp says how each is pooled).
    """
    role = next((r for r, name in info.output_names.items() if name == output), None)
    if role is None:
        raise ExportError(
            f"{source}: output {output!r} has no role in the stamp; a text backbone's heads read its "
            "stamped 'embedding' output (rmq model stamp --output embedding=OUTPUT)"
        )
    try:
        encoder = TextEncoder(source, batch_size=max(1, len(texts)))
        return encoder.encode(list(texts), [role])[role]
    except EncoderError as exc:
        raise ExportError(str(exc)) from exc
