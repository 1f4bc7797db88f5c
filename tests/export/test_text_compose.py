"""Heads on a team's text backbone: one graph rm-qdrant reads as text, equal to backbone + heads.

A text backbone's embedding is usually token states that rm-qdrant's encoder pools outside the
graph; the composed graph must pool (masked mean, first token) and normalise inside, keep the
backbone's tokenizer, window and prefixes, and give what the backbone through
:class:`~rm_qdrant.TextEncoder` and then the heads give, whatever the batch pads to.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rm_qdrant import TextEncoder, load_encoder
from rm_qdrant.models.text import pool
from rm_qdrant.models.text_stamp import stamp_text_model
from tests.text_models import text_graph, texts, write_vocab

torch = pytest.importorskip("torch")

from rm_qdrant_exporters.compose import attach_model  # noqa: E402
from rm_qdrant_exporters.serving import ExportError  # noqa: E402
from rm_qdrant_exporters.text_pool import POOLED, pool_in_graph  # noqa: E402
from rm_qdrant_train.heads import Heads  # noqa: E402

MAX_LENGTH = 16


def documents() -> list[str]:
    """Seven documents of the test vocabulary, 1 to 21 words: a batch pads the short ones, and
    the longest is cut at ``MAX_LENGTH`` tokens."""
    docs, _ = texts(12, seed=3)
    words = " ".join(docs).split()
    return [" ".join(words[start : start + n]) for start, n in zip(range(0, 84, 12), (3, 1, 7, 21, 5, 2, 11))]


def backbone(tmp_path, *, pooling="mean", token_types=False, int32=False, **stamp):
    vocab = write_vocab(tmp_path / "vocab.txt")
    raw = text_graph(
        tmp_path / "raw.onnx", seed=2, pooled=pooling == "output", token_types=token_types, int32=int32
    )
    output = "pooler_output" if pooling == "output" else "last_hidden_state"
    out = tmp_path / "backbone.onnx"
    stamp_text_model(
        raw,
        out,
        outputs={"embedding": output},
        tokenizer=vocab,
        max_length=MAX_LENGTH,
        pooling=pooling,
        **stamp,
    )
    return out


def heads(d_new=16, d_old=12, *, learn_rho=True):
    torch.manual_seed(0)
    model = Heads(d_new, d_old, learn_rho=learn_rho, hidden=32)
    for norm in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)):
        norm.running_mean.uniform_(-0.2, 0.2)  # folded into the Linear layers on export
        norm.running_var.uniform_(0.5, 2.0)
    return model.eval()


def by_backbone_then_heads(path, model, items, *, query=False, unit=True):
    """What the composed graph must give: the backbone read by rm-qdrant, then the heads in PyTorch."""
    phi = TextEncoder(path).encode(items, ["embedding"], query=query)["embedding"]
    with torch.no_grad():
        new, rev = (t.numpy() for t in model(torch.from_numpy(phi)))
    if unit:
        new, rev = (v / np.linalg.norm(v, axis=1, keepdims=True) for v in (new, rev))
    return new, rev


@pytest.mark.parametrize(
    "setting",
    [
        {"pooling": "mean"},
        {"pooling": "cls"},
        {"pooling": "output"},
        {"pooling": "mean", "normalize": False, "token_types": True},
        {"pooling": "cls", "int32": True, "query_prefix": "the ", "document_prefix": "a "},
    ],
    ids=["mean", "cls", "output", "mean-raw-token-types", "cls-int32-prefixes"],
)
def test_the_composed_graph_reads_text_as_the_backbone_did_and_equals_backbone_then_heads(tmp_path, setting):
    path = backbone(tmp_path, **setting)
    model = heads()
    out, worst = attach_model(
        path, model, tmp_path / "fitted.onnx", distance="cosine", parity_items=documents()
    )
    assert worst < 1e-4

    fitted = load_encoder(out)
    before = TextEncoder(path).spec
    assert isinstance(fitted, TextEncoder) and set(fitted.info.outputs) == {"new", "rev"}
    assert (fitted.spec.pooling, fitted.spec.normalize) == ("output", False)  # pooled inside the graph
    kept = (
        "max_length",
        "truncation",
        "query_prefix",
        "document_prefix",
        "token_type_ids",
        "tokenizer_sha256",
    )
    assert {k: getattr(fitted.spec, k) for k in kept} == {k: getattr(before, k) for k in kept}
    assert fitted.spec.tokenizer == before.tokenizer and fitted.info.scale == "unit"

    docs = documents()
    for count in (1, 7):  # one text alone, and seven padded to the longest
        for query in (False, True):  # a query gets the query prefix, through the same tokenizer
            got = fitted.encode(docs[:count], ["new", "rev"], query=query)
            want = by_backbone_then_heads(path, model, docs[:count], query=query)
            np.testing.assert_allclose(got["new"], want[0], atol=1e-5)
            np.testing.assert_allclose(got["rev"], want[1], atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "output"])
@pytest.mark.parametrize("normalize", [True, False])
def test_pooling_in_the_graph_is_the_encoders_pooling_and_never_reads_padding(tmp_path, pooling, normalize):
    path = backbone(tmp_path, pooling=pooling, normalize=normalize)
    encoder = TextEncoder(path)
    spec = encoder.spec
    graph = onnx.load(str(path))
    states = encoder.info.graph_output("embedding")
    session = ort.InferenceSession(pool_in_graph(graph, states, spec, 16).SerializeToString())
    rows = np.stack([encoder.decode(d) for d in documents()])
    ids, mask = rows[:, 0], rows[:, 1]  # padded to MAX_LENGTH: up to 15 padding tokens a text
    pooled, raw = session.run([POOLED, states], {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(pooled, pool(raw, mask, spec, states), atol=1e-6)
    if pooling == "mean":  # padding is masked out: the mean over every position differs
        assert not np.allclose(pooled[:1], pool(raw[:1], np.ones_like(mask[:1]), spec, states), atol=1e-3)


def test_a_text_output_without_a_role_is_refused_in_one_line(tmp_path):
    path = backbone(tmp_path, pooling="output")
    with pytest.raises(ExportError, match="has no role in the stamp"):
        attach_model(path, heads(), tmp_path / "x.onnx", output_name="last_hidden_state")
    assert not (tmp_path / "x.onnx").exists()


def test_heads_for_a_raw_text_backbone_keep_its_scale(tmp_path):
    """A dot collection of raw vectors: the heads are not normalised, and parity still holds."""
    path = backbone(tmp_path, normalize=False, scale="raw", distance="dot")
    model = heads(learn_rho=False)
    out, worst = attach_model(path, model, tmp_path / "fitted.onnx", parity_items=documents())
    fitted = load_encoder(out)
    assert worst < 1e-4 and fitted.info.scale == "raw" and fitted.info.distance == "dot"
    got = fitted.encode(documents(), ["new", "rev"])
    want = by_backbone_then_heads(path, model, documents(), unit=False)
    np.testing.assert_allclose(got["rev"], want[1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.linalg.norm(got["new"], axis=1), 1.0)  # ρ the identity: φ as it was
