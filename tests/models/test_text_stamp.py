"""Text encoders as stamped: the vectors are the graph's token states pooled as numpy pools them, the
tokens are the tokenizer's own, and what is not text is a TextError, never a crash."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from rm_qdrant import ConfigError, EncoderError, load_encoder
from rm_qdrant.core.textspec import TOKENIZER_KEY
from rm_qdrant.errors import TextError
from rm_qdrant.models.text import MAX_TEXT_BYTES, TextEncoder, as_text
from rm_qdrant.models.text_stamp import read_tokenizer, stamp_text_model
from tests.text_models import text_graph, texts, vocabulary, write_vocab

#: Texts of different lengths: a batch pads the short ones to the longest, and mean pooling must not
#: count the pads' states.
UNEVEN = ["dog", "bank stock market share price money dollar", "rain on the old snow and ice"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("text-stamp")


@pytest.fixture(scope="module")
def vocab(folder: Path) -> Path:
    return write_vocab(folder / "vocab.txt")


def stamped(folder: Path, vocab: Path, name: str, *, output: str = "last_hidden_state", **options) -> Path:
    graph = {k: options.pop(k) for k in ("seed", "token_types", "pooled", "int32") if k in options}
    raw = text_graph(folder / f"{name}-raw.onnx", **graph)
    out = folder / f"{name}.onnx"
    options.setdefault("max_length", 16)
    stamp_text_model(raw, out, outputs={"embedding": output}, tokenizer=vocab, **options)
    return out


def bert(vocab: Path, max_length: int, direction: str = "right") -> Tokenizer:
    """The tokenizer a BERT team would build from its vocab.txt, independently of the stamp."""
    tokens = vocab.read_text().split()
    wordpiece = BertWordPieceTokenizer({t: i for i, t in enumerate(tokens)}, lowercase=True)
    tokenizer = Tokenizer.from_str(wordpiece.to_str())
    tokenizer.enable_truncation(max_length, direction=direction)
    return tokenizer


def token_states(
    raw: Path, ids: np.ndarray, mask: np.ndarray, output: str = "last_hidden_state"
) -> np.ndarray:
    session = ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"])
    return session.run([output], {"input_ids": ids, "attention_mask": mask})[0]


def padded(tokenizer: Tokenizer, batch: list[str]) -> tuple[np.ndarray, np.ndarray]:
    rows = [tokenizer.encode(t).ids for t in batch]
    width = max(map(len, rows))
    ids, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return ids, mask


@pytest.mark.parametrize("pooling", ["mean", "cls", "output"])
@pytest.mark.parametrize("normalize", [True, False])
def test_pooling_is_numpys_over_the_attention_mask(folder, vocab, pooling, normalize):
    output = "pooler_output" if pooling == "output" else "last_hidden_state"
    name = f"pool-{pooling}-{normalize}"
    model = stamped(folder, vocab, name, output=output, pooled=True, pooling=pooling, normalize=normalize)
    ids, mask = padded(bert(vocab, 16), UNEVEN)
    states = token_states(folder / f"{name}-raw.onnx", ids, mask, output)
    if pooling == "mean":
        expected = (states * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    else:  # cls: the first token's state; output: the graph's own vector (its first token's too)
        expected = states[:, 0] if states.ndim == 3 else states
    if normalize:
        expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    got = load_encoder(model).encode(UNEVEN)["embedding"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # one at a time, unpadded: the same vectors (a text's batch does not change its vector)
    alone = np.vstack([load_encoder(model).encode(t)["embedding"] for t in UNEVEN])
    np.testing.assert_allclose(alone, got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("direction", ["right", "left"])
def test_a_long_text_is_cut_as_the_tokenizer_cuts_it(folder, vocab, direction):
    model = load_encoder(stamped(folder, vocab, f"cut-{direction}", truncation=direction, max_length=8))
    long = " ".join(texts(6, seed=1)[0])  # 42 words: far over 8 tokens
    row = model.decode(long)
    expected = bert(vocab, 8, direction).encode(long)
    assert row[0].tolist() == expected.ids and row[1].tolist() == [1] * 8
    kept = bert(vocab, 99).decode(row[0].tolist()).split()
    words = long.split()
    assert kept == (words[:6] if direction == "right" else words[-6:])  # 8 tokens: [CLS], 6 words, [SEP]
    assert model.truncated == 1  # counted, once
    model.decode("dog cat")
    assert model.truncated == 1  # a text that fits is not


def test_the_query_prefix_goes_before_queries_and_the_document_prefix_before_documents(folder, vocab):
    model = load_encoder(stamped(folder, vocab, "prefixed", query_prefix="big ", document_prefix="small "))
    tokenizer = bert(vocab, 16)
    assert model.decode("dog cat", query=True)[0, :5].tolist() == tokenizer.encode("big dog cat").ids
    assert model.decode("dog cat")[0, :5].tolist() == tokenizer.encode("small dog cat").ids
    plain = load_encoder(stamped(folder, vocab, "unprefixed", seed=0))
    query = model.encode(["dog cat"], query=True)["embedding"]
    np.testing.assert_allclose(query, plain.encode(["big dog cat"])["embedding"], rtol=1e-6)
    np.testing.assert_allclose(
        model.encode(["dog cat"])["embedding"], plain.encode(["small dog cat"])["embedding"]
    )


def test_int32_inputs_and_token_type_ids_give_the_same_vectors(folder, vocab):
    docs = texts(12)[0]
    base = load_encoder(stamped(folder, vocab, "int64", seed=4)).encode(docs)["embedding"]
    int32 = load_encoder(stamped(folder, vocab, "int32", seed=4, int32=True))
    typed = load_encoder(stamped(folder, vocab, "typed", seed=4, token_types=True))
    assert typed.spec.token_type_ids and not int32.spec.token_type_ids
    np.testing.assert_array_equal(int32.encode(docs)["embedding"], base)
    np.testing.assert_array_equal(typed.encode(docs)["embedding"], base)


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not UTF-8"),
        (b"\x00\x01\x02binary\x03", r"control character U\+0000"),
        ("dog\x1b[31m cat", r"control character U\+001B"),
        ("", "the text is empty"),
        ("   \n\t", "the text is empty"),
        (b"\xe9t\xe9", "not UTF-8"),
        ("x" * (MAX_TEXT_BYTES + 1), "over the"),
        (b"x" * (MAX_TEXT_BYTES + 1), "over the"),
        (12, "expected text, got int"),
        (None, "expected text, got NoneType"),
    ],
)
def test_what_is_not_text_is_a_text_error(folder, vocab, item, reason):
    with pytest.raises(TextError, match=reason):
        as_text(item)
    model = load_encoder(stamped(folder, vocab, "errors", seed=2))
    with pytest.raises(TextError, match=reason):
        model.encode([item])


@pytest.mark.parametrize(
    "text",
    [
        "Slide title\x0bthe big dog and the small cat",  # a word processor's line break: U+000B
        "the dog\x92s bowl of milk and bread",  # cp1252's apostrophe read as Latin-1: U+0092
        "rain\x85snow\x85wind and the old storm of the winter",  # NEL, the line end of EBCDIC text
    ],
)
def test_a_stray_control_character_is_text(folder, vocab, text):
    """A document that holds a control character or two is still text (the old pipeline embedded
    it): encoded, not a failure that never migrates and blocks the cutover."""
    assert as_text(text) == text
    model = load_encoder(stamped(folder, vocab, "errors", seed=2))
    assert np.isfinite(model.encode([text])["embedding"]).all()


def test_utf8_bytes_and_strings_read_alike(folder, vocab):
    model = load_encoder(stamped(folder, vocab, "bytes", seed=2))
    np.testing.assert_array_equal(
        model.encode([b"dog and cat"])["embedding"], model.encode(["dog and cat"])["embedding"]
    )


def test_a_tokenizer_changed_after_stamping_is_refused_at_load(folder, vocab, tmp_path):
    graph = onnx.load(str(stamped(folder, vocab, "tampered", seed=3)))
    entry = next(p for p in graph.metadata_props if p.key == TOKENIZER_KEY)
    entry.value = entry.value.replace('"dog"', '"hog"')  # one token renamed: other ids, same size
    onnx.save(graph, str(tmp_path / "tampered.onnx"))
    with pytest.raises(EncoderError, match="the tokenizer was changed after the graph was stamped"):
        load_encoder(tmp_path / "tampered.onnx")
    del graph.metadata_props[[p.key for p in graph.metadata_props].index(TOKENIZER_KEY)]
    onnx.save(graph, str(tmp_path / "no-tokenizer.onnx"))
    with pytest.raises(EncoderError, match="needs its tokenizer"):
        load_encoder(tmp_path / "no-tokenizer.onnx")
    entry = next(p for p in graph.metadata_props if p.key == "rm_qdrant")
    entry.value = entry.value[:-10]  # an entry cut short: what is wrong is said, not "stamp it"
    onnx.save(graph, str(tmp_path / "cut.onnx"))
    with pytest.raises(EncoderError, match="'rm_qdrant' metadata is not valid JSON"):
        load_encoder(tmp_path / "cut.onnx")


def test_max_length_left_out_is_the_tokenizer_jsons_own(folder, vocab, tmp_path):
    tokenizer = Tokenizer.from_str(read_tokenizer(vocab))
    tokenizer.enable_truncation(12)
    (tmp_path / "tokenizer.json").write_text(tokenizer.to_str())
    raw = text_graph(tmp_path / "raw.onnx")
    report = stamp_text_model(
        raw,
        tmp_path / "a.onnx",
        outputs={"embedding": "last_hidden_state"},
        tokenizer=tmp_path / "tokenizer.json",
    )
    assert (report.info.input.max_length, report.max_length_from) == (12, "tokenizer")
    assert report.vocabulary == len(vocabulary())
    assert isinstance(load_encoder(tmp_path / "a.onnx"), TextEncoder)
    with pytest.raises(ConfigError, match="--max-length is needed: .* states no window of its own"):
        stamp_text_model(
            raw, tmp_path / "b.onnx", outputs={"embedding": "last_hidden_state"}, tokenizer=vocab
        )
    assert not (tmp_path / "b.onnx").exists()
