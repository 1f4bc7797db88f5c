"""benchmarks/text/model_pair.py: its held-out mAP is the textbook one, and the script runs end to
end with the real pinned pair on a small corpus in the bundled format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.text import make_corpus, model_pair
from rm_qdrant.evaluation.text_corpus import load_text_corpus


def test_heldout_map_averages_precision_at_each_relevant_hit():
    gallery = np.eye(4, dtype=np.float32)
    # the query is nearest to item 0, then 1, then 2, then 3; items 0 and 2 share its label
    query = np.array([[0.8, 0.5, 0.3, 0.1]], dtype=np.float32)
    mean_ap, top1 = model_pair.heldout_map(query, gallery, np.array(["a"]), np.array(["a", "b", "a", "b"]))
    assert mean_ap == pytest.approx((1 / 1 + 2 / 3) / 2)
    assert top1 == 1.0


@pytest.mark.slow
def test_the_script_measures_both_models_on_a_small_corpus(tmp_path: Path):
    corpus = load_text_corpus()
    records, classes = [], ("bird", "drug", "city")
    for split, part in (("gallery", corpus.gallery), ("query", corpus.queries)):
        for label in classes:
            rows = [i for i, lab in enumerate(part.labels) if lab == label][: 8 if split == "gallery" else 2]
            records += [
                {
                    "id": len(records),
                    "text": part.texts[i],
                    "label": label,
                    "lemma": part.lemmas[i],
                    "split": split,
                }
                for i in rows
            ]
    small = tmp_path / "small.jsonl.gz"
    make_corpus.write_corpus(records, small)

    result = model_pair.measure(small, batch=4, repeats=1, sample=8)

    assert result["corpus"] == {"gallery": 24, "queries": 6, "classes": 3}
    assert result["chance_map"] == pytest.approx(1 / 3)
    assert set(result["heldout"]) == {"old->old", "new->new", "new->old", "old->new"}
    assert result["heldout"]["new->new"]["map"] > 0.6  # birds, drugs and cities: both models tell them apart
    naive = result["rm_naive_heldout_map"]  # t = 0 is the old system, t = 1 the new one
    assert (naive[0], naive[-1]) == (
        result["heldout"]["old->old"]["map"],
        result["heldout"]["new->new"]["map"],
    )
    assert set(result["per_class_gain"]) == set(classes)
    assert result["alignment"]["nearest_of"] == 30
    assert result["l3_pooled_vs_masked_mean"] < 1e-5
    assert result["tokens"]["old"]["max_length"] == 128 and result["tokens"]["new"]["max_length"] == 256
    text = model_pair.report(result)
    assert "| new->new |" in text and "texts/s at batch 4, best of 1 passes over 8 texts" in text
