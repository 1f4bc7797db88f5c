"""Small real text encoders for tests: ONNX graphs ONNX Runtime runs, a WordPiece vocabulary,
and texts whose words the vocabulary knows.

A graph embeds each token (a table of ``vocab × dim``), mixes it through a seeded dense
layer and ``tanh``: token states ``(texts, tokens, dim)`` named ``last_hidden_state``, as
common exporters name BERT's, and optionally ``pooler_output`` (the first token's state,
one vector a text). Two seeds give two incompatible spaces: an old and a new model.
The real pretrained pair (MiniLM) is in :mod:`rm_qdrant.evaluation.text_corpus`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def scaled_text_graph(
    path: Path,
    *,
    dim: int,
    seed: int,
    pooled: bool = False,
    stretch: float = 1.0,
    rev: np.ndarray | None = None,
) -> Path:
    """A :func:`text_graph` (whose context, the mean state every position carries, is taken over
    the attention mask: a text's vector is the same whatever texts share its batch); its states (or,
    ``pooled``, the first token's state) are multiplied by ``stretch`` and named ``embedding``:
    a raw-scale model whose vectors are ``stretch`` times longer. With ``rev`` (a ``dim × k``
    matrix) the output is named ``new`` and a second output ``rev`` = ``new @ rev`` joins it: an
    rm graph whose ``new`` is, to the bit, the ``embedding`` of the same call without ``rev``."""
    text_graph(path, dim=dim, seed=seed, pooled=pooled)
    model = onnx.load(str(path))
    graph = model.graph
    nodes = list(graph.node)
    source = "pooler_output" if pooled else "last_hidden_state"
    shape: list[object] = ["batch", dim] if pooled else ["batch", "tokens", dim]
    name = "embedding" if rev is None else "new"
    nodes.append(helper.make_node("Mul", [source, "stretch"], [name]))
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(stretch, np.float32), "stretch"),
        ]
    )
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)]
    if rev is not None:
        graph.initializer.append(numpy_helper.from_array(np.asarray(rev, np.float32), "psi"))
        nodes.append(helper.make_node("MatMul", [name, "psi"], ["rev"]))
        outputs.append(helper.make_tensor_value_info("rev", TensorProto.FLOAT, [*shape[:-1], rev.shape[1]]))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(outputs)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def varied_texts(count: int, *, seed: int = 0) -> list[str]:
    """``count`` distinct documents of 2 to 14 words drawn from :func:`texts`: a batch of them pads
    its shorter texts, and the longest, with a prefix, pass a 16-token window."""
    drawn = texts(2 * count + 1, seed=seed)[0]
    lengths = [2 + (k * 7) % 15 for k in range(len(drawn) - 1)]
    docs = [" ".join(f"{a} {b}".split()[:n]) for a, b, n in zip(drawn, drawn[1:], lengths)]
    return list(dict.fromkeys(docs))[:count]


#: :func:`text_model_set`'s prefixes: before every query, and before each model's documents.
QUERY_PREFIX = "very "
DOCUMENT_PREFIX = {"old": "", "new": "of ", "rm": "of "}


@dataclass(frozen=True)
class TextModelSet:
    """An old text model, a new one and an rm graph (outputs ``new`` and ``rev``), stamped with one
    vocabulary, window and pooling: all :func:`reference_vectors` needs besides a graph."""

    old: Path
    new: Path
    rm: Path
    vocab: Path
    pooling: str
    normalize: bool
    max_length: int = 16


def text_model_set(
    folder: Path,
    *,
    dims: tuple[int, int],
    seeds: tuple[int, int],
    pooling: str,
    rev: np.ndarray,
    stretch: float = 1.0,
    scale: str = "unit",
    distance: str,
    new_distance: str | None,
) -> TextModelSet:
    """Stamped :func:`scaled_text_graph` graphs in ``folder``: the old model (``dims[0]``, seed
    ``seeds[0]``, stamped with ``distance``) and the new one (``dims[1]``, ``seeds[1]``, its
    vectors ``stretch`` times longer, stamped with ``new_distance``: None for any), and an rm
    graph whose ``new`` is the new model's and whose ``rev`` is ``new @ rev``. ``scale`` unit:
    L2-normalised vectors. Queries get :data:`QUERY_PREFIX`, documents :data:`DOCUMENT_PREFIX`."""
    from rm_qdrant.models.text_stamp import stamp_text_model

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder / "vocab.txt")

    def stamped(name: str, dim: int, seed: int, outputs: dict[str, str], **graph: Any) -> Path:
        raw = scaled_text_graph(
            folder / f"{name}-raw.onnx", dim=dim, seed=seed, pooled=pooling == "output", **graph
        )
        out = folder / f"{name}.onnx"
        stamp_text_model(
            raw,
            out,
            outputs=outputs,
            tokenizer=vocab,
            max_length=16,
            pooling=pooling,
            normalize=scale == "unit",
            scale=scale,
            name=name,
            query_prefix=QUERY_PREFIX,
            document_prefix=DOCUMENT_PREFIX[name],
            distance=distance if name == "old" else new_distance,
        )
        return out

    return TextModelSet(
        stamped("old", dims[0], seeds[0], {"embedding": "embedding"}),
        stamped("new", dims[1], seeds[1], {"embedding": "embedding"}, stretch=stretch),
        stamped("rm", dims[1], seeds[1], {"new": "new", "rev": "rev"}, stretch=stretch, rev=rev),
        vocab,
        pooling,
        scale == "unit",
    )


def reference_vectors(
    graph: Path, models: TextModelSet, items: list[str], *, prefix: str
) -> dict[str, np.ndarray]:
    """Each output of ``graph`` (one of ``models``) for ``prefix`` + each text, without rm-qdrant:
    tokenised by ``tokenizers``' own BERT WordPiece tokenizer, run by ONNX Runtime one text a
    run (no padding), pooled and normalised in numpy."""
    import onnxruntime as ort
    from tokenizers.implementations import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(str(models.vocab), lowercase=True)
    tokenizer.enable_truncation(models.max_length)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    rows: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for item in items:
        ids = np.array([tokenizer.encode(prefix + item).ids], np.int64)
        values = session.run(names, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        for name, value in zip(names, values):
            vector = {"mean": value[0].mean(axis=0), "cls": value[0][0], "output": value[0]}[models.pooling]
            rows[name].append(vector / np.linalg.norm(vector) if models.normalize else vector)
    return {name: np.array(vectors, np.float32) for name, vectors in rows.items()}


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
