"""Small real text encoders for tests: ONNX graphs ONNX Runtime runs, a WordPiece vocabulary,
and texts whose words the vocabulary knows.

A graph embeds each token (a table of ``vocab × dim``), mixes it through a seeded dense
layer and ``tanh``: token states ``(texts, tokens, dim)`` named ``last_hidden_state``, as
common exporters name BERT's, and optionally ``pooler_output`` (the first token's state,
one vector a text). Two seeds give two incompatible spaces: an old and a new model.
The real pretrained pair (MiniLM) is in :mod:`rm_qdrant.evaluation.text_corpus`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOPICS = {
    "animals": "dog cat horse bird fish lion tiger puppy kitten wolf bear fox".split(),
    "money": "bank stock market share price money dollar trade profit loss fund tax".split(),
    "food": "bread cheese apple soup rice pasta salad cake butter milk egg honey".split(),
    "weather": "rain snow wind storm cloud sun fog frost heat cold thunder ice".split(),
}
FILLER = "the a of and on in with is was big small old new very".split()


def vocabulary() -> list[str]:
    words = sorted({w for group in TOPICS.values() for w in group} | set(FILLER))
    return SPECIAL + words


def write_vocab(path: Path) -> Path:
    """A WordPiece ``vocab.txt`` (lower case), one token a line."""
    path.write_text("\n".join(vocabulary()) + "\n", encoding="utf-8")
    return path


def texts(count: int, *, seed: int = 0) -> tuple[list[str], list[str]]:
    """``count`` short documents and their topic labels, drawn from :data:`TOPICS`."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    docs, labels = [], []
    for i in range(count):
        topic = names[i % len(names)]
        words = list(rng.choice(TOPICS[topic], size=4)) + list(rng.choice(FILLER, size=3))
        rng.shuffle(words)
        docs.append(" ".join(words))
        labels.append(topic)
    return docs, labels


def text_graph(
    path: Path,
    *,
    dim: int = 16,
    seed: int = 0,
    vocab: int | None = None,
    token_types: bool = False,
    pooled: bool = False,
    int32: bool = False,
    positions: int | None = None,
) -> Path:
    """Write a text encoder graph (see the module's docstring); ``vocab`` rows in its table
    (default: :func:`vocabulary`'s size); ``positions``: a position table of that many rows
    added to the token embeddings, as BERT's (a longer text does not run)."""
    words = vocabulary()
    rows = vocab or len(words)
    rng = np.random.default_rng(seed)
    table = 0.3 * rng.normal(size=(rows, dim))
    for topic in TOPICS.values():  # a topic's words lie near one direction: labels mean something
        direction = rng.normal(size=dim)
        for word in topic:
            table[words.index(word)] += 2.0 * direction
    table = table.astype(np.float32)
    mix = (rng.normal(size=(dim, dim)) / np.sqrt(dim)).astype(np.float32)
    kind = TensorProto.INT32 if int32 else TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", kind, ["batch", "tokens"]),
        helper.make_tensor_value_info("attention_mask", kind, ["batch", "tokens"]),
    ]
    if token_types:
        inputs.append(helper.make_tensor_value_info("token_type_ids", kind, ["batch", "tokens"]))
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["embedded"])]
    weights = []
    if positions:
        weights = [
            numpy_helper.from_array(
                (0.1 * rng.normal(size=(positions, dim))).astype(np.float32), "positions"
            ),
            numpy_helper.from_array(np.array(0, np.int64), "start"),
            numpy_helper.from_array(np.array(1, np.int64), "step"),
        ]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
            helper.make_node("Gather", ["ids_shape", "step"], ["length"]),
            helper.make_node("Range", ["start", "length", "step"], ["position"]),
            helper.make_node("Gather", ["positions", "position"], ["placed"]),
            helper.make_node("Add", ["embedded", "placed"], ["embedded_at"]),
        ]
    nodes += [
        helper.make_node("MatMul", ["embedded_at" if positions else "embedded", "mix"], ["mixed"]),
        helper.make_node("Tanh", ["mixed"], ["tokens"]),
        # every position also carries the mean state of the text's own tokens, as attention over
        # the mask would: the first token's state (cls pooling) then says what the text is about,
        # and a text's vectors do not depend on the padding of the batch it is encoded in
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_3d"]),
        helper.make_node("Mul", ["tokens", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "token_axis"], ["masked_sum"], keepdims=1),
        helper.make_node("ReduceSum", ["mask_3d", "token_axis"], ["mask_count"], keepdims=1),
        helper.make_node("Div", ["masked_sum", "mask_count"], ["context"]),
        helper.make_node("Add", ["tokens", "context"], ["states"]),
    ]
    if token_types:
        nodes += [
            helper.make_node("Cast", ["token_type_ids"], ["types_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["types_f"], ["types_sum"], keepdims=1),
            helper.make_node("Mul", ["types_sum", "zero"], ["types_zero"]),
            helper.make_node("Add", ["states", "types_zero"], ["last_hidden_state"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["states"], ["last_hidden_state"]))
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", dim])
    ]
    if pooled:
        nodes += [
            helper.make_node("Gather", ["last_hidden_state", "first"], ["pooler_output"], axis=1),
        ]
        outputs.append(helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", dim]))
    graph = helper.make_graph(
        nodes,
        "text",
        inputs,
        outputs,
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(mix, "mix"),
            numpy_helper.from_array(np.zeros((), np.float32), "zero"),
            numpy_helper.from_array(np.array([2], np.int64), "last_axis"),
            numpy_helper.from_array(np.array([1], np.int64), "token_axis"),
            *([numpy_helper.from_array(np.array(0, np.int64), "first")] if pooled else []),
            *weights,
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def stamped_text_graph(folder: Path, name: str, *, seed: int, pooling: str = "mean", **stamp: object) -> Path:
    """A :func:`text_graph` stamped with the test vocabulary: ready for ``load_encoder``."""
    from rm_qdrant.models.text_stamp import stamp_text_model

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder / "vocab.txt")
    raw = text_graph(folder / f"{name}-raw.onnx", seed=seed, pooled=pooling == "output")
    output = "pooler_output" if pooling == "output" else "last_hidden_state"
    out = folder / f"{name}.onnx"
    stamp_text_model(
        raw, out, outputs={"embedding": output}, tokenizer=vocab, max_length=16, pooling=pooling, **stamp
    )  # type: ignore[arg-type]
    return out


def rm_text_graph(path: Path, *, new: Path, old: Path) -> Path:
    """An rm text graph from two :func:`text_graph` files: output ``new`` is ``new``'s token states
    and ``rev`` is ``old``'s (a ψ that reproduces the old model exactly), one graph over the same
    ``input_ids`` and ``attention_mask``, as an exporter writes φ_new + ρ + ψ."""
    from onnx import compose

    parts = [compose.add_prefix(onnx.load(str(p)), f"{tag}_") for tag, p in (("n", new), ("o", old))]
    inputs = [i for i in onnx.load(str(new)).graph.input]
    nodes = [
        helper.make_node("Identity", [i.name], [f"{tag}_{i.name}"]) for tag in ("n", "o") for i in inputs
    ]
    nodes += [n for part in parts for n in part.graph.node]
    nodes += [
        helper.make_node("Identity", ["n_last_hidden_state"], ["new_states"]),
        helper.make_node("Identity", ["o_last_hidden_state"], ["rev_states"]),
    ]
    dim = [d for d in parts[0].graph.output[0].type.tensor_type.shape.dim][-1].dim_value
    old_dim = [d for d in parts[1].graph.output[0].type.tensor_type.shape.dim][-1].dim_value
    graph = helper.make_graph(
        nodes,
        "rm-text",
        inputs,
        [
            helper.make_tensor_value_info("new_states", TensorProto.FLOAT, ["batch", "tokens", dim]),
            helper.make_tensor_value_info("rev_states", TensorProto.FLOAT, ["batch", "tokens", old_dim]),
        ],
        initializer=[t for part in parts for t in part.graph.initializer],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
