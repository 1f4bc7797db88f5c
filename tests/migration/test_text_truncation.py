"""A text pair's migration counts the documents it cut at the model's ``max_length``, and ``rmq
status`` shows the count: every run and process together, and still after a day."""

from __future__ import annotations

import json

import pytest

import rm_qdrant
from rm_qdrant import open_store
from rm_qdrant.pair import progress
from tests.text_gallery import MAX_LENGTH, long_text, text_gallery, text_models
from tests.text_models import texts

#: Words that fill the window exactly ([CLS] + 14 + [SEP] = 16 tokens): not cut.
FITS = MAX_LENGTH - 2


def gallery_with_long_documents(tmp_path) -> tuple[object, int]:
    """40 documents: 6 far longer than the window, 2 one word too long, 3 that fill it exactly."""
    docs, labels = texts(40)
    cut = {3: 40, 7: 25, 11: 31, 19: 60, 23: 17, 31: 22, 33: FITS + 1, 35: FITS + 1}
    exact = {5: FITS, 13: FITS, 29: FITS}
    for i, words in {**cut, **exact}.items():
        docs[i] = long_text(words, labels[i], seed=i)
    models = text_models(tmp_path / "models")
    with open_store(tmp_path / "q") as store:
        text_gallery(store, models, docs, labels)
    return models, len(cut)


def test_status_shows_exactly_the_documents_the_migration_cut(tmp_path, rmq):
    _, cut = gallery_with_long_documents(tmp_path)
    assert "truncated" not in rmq("status", "--name", "t").output  # no run yet: nothing known
    first = json.loads(rmq("migrate", "--name", "t", "--batch", "6", "--until", "0.5", "--json").stdout)
    rest = json.loads(rmq("migrate", "--name", "t", "--batch", "5", "--workers", "2", "--json").stdout)
    assert first["moved"] + rest["moved"] == 40
    assert first["truncated"] + rest["truncated"] == cut == 8
    text = rmq("status", "--name", "t").output
    assert f"truncated     8 documents at {MAX_LENGTH} tokens" in text
    assert "documents     the text of payload field 'body'" in text
    status = json.loads(rmq("status", "--name", "t", "--json").stdout)
    assert (status["truncated"], status["truncated_at"]) == (8, [MAX_LENGTH])


def test_a_failed_document_is_not_counted_and_a_day_later_the_count_is_still_whole(
    tmp_path, rmq, monkeypatch
):
    _, cut = gallery_with_long_documents(tmp_path)
    with open_store(tmp_path / "q") as store:  # one long document's text is gone: it fails
        store.set_payload("docs", [(3, {"body": ""})])
    rmq("migrate", "--name", "t", "--until", "0.5")
    # Progress records stop counting for the pace after a day and a run that starts removes them;
    # a text run's count of cut documents stays (every record is a day old here).
    monkeypatch.setattr(progress, "FORGET_AFTER", -10 * 86_400.0)
    rmq("migrate", "--name", "t")
    status = json.loads(rmq("status", "--name", "t", "--json").stdout)
    assert (status["failed"], status["truncated"]) == (1, cut - 1)
    with open_store(tmp_path / "q") as store:
        assert "the text is empty" in next(rm_qdrant.failures(store, "t")).reason


def test_an_image_pair_has_no_truncation_line(rmq, demo):
    rmq("migrate", "--name", "demo")
    assert "truncated" not in rmq("status", "--name", "demo").output
    assert json.loads(rmq("status", "--name", "demo", "--json").stdout)["truncated"] is None


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_the_library_call_reports_the_same_count(tmp_path, layout):
    docs, labels = texts(12)
    docs[2] = long_text(30, labels[2])
    models = text_models(tmp_path / "models")
    with open_store(":memory:") as store:
        extra = {"mode": layout, "collection": "docs", "new_vector": "new"} if layout != "paired" else {}
        if extra:
            old, _ = models.encoders()
            vectors = old.encode(docs, ["embedding"])["embedding"]
            store.create_collection("docs", dim=vectors.shape[1], distance="cosine")
            store.upsert("docs", list(range(12)), vectors, [{"body": d} for d in docs])
            rm_qdrant.init(store, "t", encoder=models.new, old_encoder=models.old, text_field="body", **extra)
        else:
            text_gallery(store, models, docs, labels)
        assert rm_qdrant.migrate(store, "t", batch=4).truncated == 1
        assert rm_qdrant.status(store, "t").status.truncated == 1
