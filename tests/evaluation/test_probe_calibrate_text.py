"""``rmq probe`` and ``rmq calibrate`` on a naive text pair: the sample's documents are read from the
payload and tokenised by the pair's encoder, as the migration reads them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rm_qdrant
from rm_qdrant import open_store
from tests.conftest import one_error_line
from tests.text_gallery import text_pair_at

N = 60


@pytest.fixture
def text_pair(tmp_path):
    docs, _, models = text_pair_at(tmp_path, N)
    return docs, models


def test_probe_forecasts_a_text_pair_from_its_documents(rmq, text_pair):
    text = rmq("probe", "--name", "t", "--sample", "40").output
    assert "40 gallery points re-embedded; documents tokenised by the model's tokenizer" in text
    assert "recall@10 against the new model's own neighbours" in text and "recommendation: serve" in text
    out = json.loads(rmq("probe", "--name", "t", "--sample", "40", "--json").stdout)
    (naive,) = out["forecasts"]
    assert out["modality"] == "text" and out["label_field"] == "label"  # the topics forecast mAP too
    assert naive["recall"][-1] == 1.0 and naive["recall"][0] < 1.0  # t = 1: the new model's own top 10
    status = rmq("status", "--name", "t").output
    assert "estimate      naive: recall@10" in status and "40-point probe sample" in status


def test_the_probe_sample_is_the_new_models_embedding_of_the_payload_text(tmp_path, text_pair):
    docs, models = text_pair
    _, new = models.encoders()
    with open_store(tmp_path / "q") as store:
        report = rm_qdrant.probe(store, "t", sample=N)
        sample = np.load(report.cache)
        ids = json.loads(str(sample["meta"]))["ids"]
        expected = new.encode([docs[i] for i in ids], ["embedding"])["embedding"]
        assert np.allclose(sample["new"], expected, atol=1e-6)


def test_calibrate_writes_a_calibration_that_status_and_search_use(tmp_path, rmq, text_pair):
    args = ("calibrate", "--name", "t", "--sample", str(N), "--k", "3", "--holdout", "0.5", "--force")
    text = rmq(*args).output
    assert "calibrated on 30 sampled points (30 held out)" in text and "kept" in text
    status = json.loads(rmq("status", "--name", "t", "--json").stdout)
    assert status["calibrated"] is True
    assert "merge         calibrated (rmq calibrate)" in rmq("status", "--name", "t").output
    with open_store(tmp_path / "q") as store, rm_qdrant.DualIndex.open(store, "t") as index:
        assert index.pair.old_distance is not None and index.search("rain and snow", limit=3)


def test_decode_is_refused_on_a_text_pair(rmq, text_pair):
    line = one_error_line(rmq("probe", "--name", "t", "--decode", "fast", ok=False))
    assert "pair 't' reads text: --decode says how images are decoded" in line
