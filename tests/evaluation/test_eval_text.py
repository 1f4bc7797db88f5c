"""``rmq eval`` on a text pair: judged JSONL queries (by label, by relevant ids, a gallery document
as its own query) scored through the served pair as a brute-force ranking scores them, and bad
query files refused in one line with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rm_qdrant
from rm_qdrant import open_store
from tests.conftest import one_error_line, settled
from tests.text_gallery import text_pair_at
from tests.text_models import texts

N = 40


@pytest.fixture
def text_pair(tmp_path):
    """A naive text pair 't' of N labelled documents in the store at tmp_path/q; its models."""
    return text_pair_at(tmp_path, N)


def judged(docs, labels) -> list[dict]:
    """Queries of the three kinds: new texts by label; judged ids (half the label's set, and one
    id the gallery lacks); gallery documents by label, each naming its own point."""
    new, topics = texts(8, seed=5)
    queries = [{"text": t, "label": label} for t, label in zip(new, topics)]
    for t, label in zip(new[:4], topics[:4]):
        ids = [i for i in range(N) if labels[i] == label and i % 8 < 4]
        queries.append({"text": t, "relevant": [*ids, 999]})
    queries += [{"text": docs[i], "label": labels[i], "id": i} for i in range(0, N, 5)]
    return queries


def reference(queries, model, gallery_docs, labels) -> tuple[float, float]:
    """mAP and top-1 of ``model`` alone over the whole gallery, ranked by cosine distance with
    numpy: what the pair serves at t = 0 (the old model) and t = 1 (the new model)."""
    gallery = model.encode(gallery_docs, ["embedding"])["embedding"]
    asked = model.encode([q["text"] for q in queries], ["embedding"], query=True)["embedding"]
    aps, tops = [], []
    for query, vector in zip(queries, asked):
        order = [i for i in np.argsort(-(gallery @ vector), kind="stable") if i != query.get("id")]
        if "relevant" in query:
            relevant = {i for i in query["relevant"] if i < N}
            flags = np.array([i in relevant for i in order])
        else:
            flags = np.array([labels[i] == query["label"] for i in order])
        precision = np.cumsum(flags) / np.arange(1, len(flags) + 1)
        aps.append((precision * flags).sum() / flags.sum())
        tops.append(flags[0])
    return float(np.mean(aps)), float(np.mean(tops))


def test_eval_scores_judged_text_queries_as_a_brute_force_ranking_does(tmp_path, rmq, text_pair):
    docs, labels, models = text_pair
    queries = judged(docs, labels)
    path = tmp_path / "queries.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    out = json.loads(rmq("eval", "--name", "t", "--queries", path, "--at", "0,1", "--json").stdout)
    old, new = models.encoders()
    for point, model in zip(out["points"], (old, new)):
        assert (point["map"], point["top1"]) == pytest.approx(reference(queries, model, docs, labels))
    assert out["old_map"] == out["points"][0]["map"] and out["new_map"] == out["points"][1]["map"]
    with open_store(tmp_path / "q") as store:  # the library takes the file, and the objects
        by_path = rm_qdrant.evaluate(store, "t", path, at=[0, 1])
        by_objects = rm_qdrant.evaluate(store, "t", queries, at=[0, 1])
    assert (
        [p.map for p in by_path.points]
        == [p.map for p in by_objects.points]
        == [p["map"] for p in out["points"]]
    )


def test_a_gallery_document_that_names_its_id_is_left_out_of_its_own_ranking(tmp_path, text_pair):
    """Each query is a gallery document judged relevant to itself and to two documents of other
    topics: named by its id, it is not its own first hit."""
    docs, labels, models = text_pair
    asked = [{"text": docs[i], "relevant": [i, (i + 1) % N, (i + 2) % N], "id": i} for i in range(0, N, 4)]
    unnamed = [{k: v for k, v in q.items() if k != "id"} for q in asked]
    with open_store(tmp_path / "q") as store:
        named = rm_qdrant.evaluate(store, "t", asked, at=[0]).points[0]
        itself = rm_qdrant.evaluate(store, "t", unnamed, at=[0]).points[0]
    old, _ = models.encoders()
    assert (named.map, named.top1) == pytest.approx(reference(asked, old, docs, labels))
    assert itself.top1 == 1.0 and named.top1 < 0.5 and named.map < itself.map


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (
            ['{"text": "rain and snow", "label": "weather"}', '{"text": "rain", label: "weather"}'],
            "line 2: not JSON",
        ),
        (
            ['{"text": "rain", "label": "weather"}', "", '{"text": " ", "label": "weather"}'],
            "line 3: the text is empty",
        ),
        (['{"text": "rain", "relevant": [4], "label": "weather"}'], 'line 1: a query has one of "label"'),
    ],
)
def test_a_bad_query_file_is_one_line_naming_the_line_and_nothing_is_written(
    tmp_path, rmq, text_pair, lines, says
):
    path = tmp_path / "queries.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = settled(rmq("status", "--name", "t", "--json").stdout)
    line = one_error_line(rmq("eval", "--name", "t", "--queries", path, "--at", "0,1", ok=False))
    assert f"queries.jsonl, {says}" in line
    assert settled(rmq("status", "--name", "t", "--json").stdout) == before


def test_queries_of_the_other_modality_are_refused(tmp_path, rmq, text_pair, image_folder, models):
    line = one_error_line(rmq("eval", "--name", "t", "--queries", image_folder, ok=False))
    assert "pair 't' reads text: its queries are a JSONL file" in line
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "photos", "--old-collection", "gallery", "--encoder", models.rm)
    path = tmp_path / "queries.jsonl"
    path.write_text('{"text": "rain", "label": "weather"}\n', encoding="utf-8")
    line = one_error_line(rmq("eval", "--name", "photos", "--queries", path, ok=False))
    assert "pair 'photos' reads images: its queries are a folder DIR/<label>/<image>" in line


def test_a_query_nothing_is_relevant_to_is_left_out_and_none_at_all_is_refused(tmp_path, text_pair):
    docs, labels, models = text_pair
    kept = {"text": "rain and snow", "relevant": [3, 7, 11]}
    asked = [{"text": "rain", "label": "no-such-topic"}, {"text": "fog", "relevant": [999]}, kept]
    with open_store(tmp_path / "q") as store:
        point = rm_qdrant.evaluate(store, "t", asked, at=[0]).points[0]
        old, _ = models.encoders()
        assert (point.map, point.top1) == pytest.approx(reference([kept], old, docs, labels))
        with pytest.raises(rm_qdrant.ConfigError, match="no query has a relevant point in the gallery"):
            rm_qdrant.evaluate(store, "t", asked[:2], at=[0])
