"""A text team's upgrade with rmq alone: init --text-field, search, migrate, switch-encoder,
finalize and rollback, failures, on small real text encoders (tests/text_models.py). Every
refusal is one line, exit 1, and writes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rm_qdrant import load_encoder, open_store
from tests.conftest import one_error_line
from tests.text_models import text_graph
from tests.text_pairs import LONG, TextModels, documents, gallery, make_text_models, stamp, store_state


@pytest.fixture(scope="module")
def tm(tmp_path_factory: pytest.TempPathFactory) -> TextModels:
    return make_text_models(tmp_path_factory.mktemp("text-models"))


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
    stamp(text_graph(tmp_path / "wide-raw.onnx", dim=24, seed=5), wide, tm.vocab)
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


def test_plan_of_a_text_pair_times_its_documents_and_writes_nothing(rmq, tm, tmp_path):
    gallery(tmp_path, tm)
    _init_naive(rmq, tm, "p", "articles", "--text-field", "body")
    before = store_state(tmp_path)
    plan = json.loads(rmq("plan", "p", "--no-forecast", "--json").output)
    docs = len(documents()[0])
    assert plan["left"] == docs
    assert plan["sample"]["timed"] == min(64, docs) and plan["sample"]["unreadable"] == 0
    assert plan["points_per_s"] > 0
    assert store_state(tmp_path) == before
