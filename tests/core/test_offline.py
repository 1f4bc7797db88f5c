"""The offline backfill table: rows, Gain, and the Markdown, JSON and PNG it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rm_qdrant.core.metrics import retrieval
from rm_qdrant.core.offline import (
    BackfillEmbeddings,
    Row,
    as_json,
    backfill_table,
    markdown,
    plot,
    reference_rows,
)


@pytest.fixture
def world():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=120)
    new = rng.normal(size=(5, 8))[labels] + 0.5 * rng.normal(size=(120, 8))
    old = rng.normal(size=(5, 6))[labels] + 2.0 * rng.normal(size=(120, 6))
    return labels, new, old, rng.permutation(120)


def test_rows_run_from_old_to_new_with_gain_relative_to_both(world):
    labels, new, old, order = world
    r_old, r_new = retrieval(old, old, labels), retrieval(new, new, labels)
    methods = {
        "RM_naive": BackfillEmbeddings(new, old, new, old, labels),
        "new everywhere": BackfillEmbeddings.single(new, labels),
    }
    seen = []
    naive, everywhere = backfill_table(methods, order, old=r_old, new=r_new, on_row=seen.append)
    assert [r.name for r in seen] == ["RM_naive", "new everywhere"]
    assert naive.curve.maps[0] == pytest.approx(r_old.map) and naive.curve.maps[-1] == pytest.approx(
        r_new.map
    )
    assert 0.0 < naive.gain_map < 1.0
    assert everywhere.gain_map == pytest.approx(1.0) and everywhere.gain_cmc == pytest.approx(1.0)
    old_row, new_row = reference_rows(r_old, r_new)
    assert (old_row.gain_map, new_row.gain_map) == (0.0, 1.0)
    assert new_row.curve.auc_map == pytest.approx(everywhere.curve.auc_map)


@pytest.mark.slow
def test_markdown_json_and_plot_carry_every_row(world, tmp_path):
    labels, new, old, order = world
    r_old, r_new = retrieval(old, old, labels), retrieval(new, new, labels)
    rows = reference_rows(r_old, r_new) + backfill_table(
        {"RM_naive": BackfillEmbeddings(new, old, new, old, labels)}, order, old=r_old, new=r_new
    )
    text = markdown(rows)
    naive = rows[-1]
    assert f"| RM_naive | {100 * naive.curve.auc_map:.1f} | {100 * naive.curve.auc_cmc:.1f} |" in text
    assert text.count("| Old |") == 3  # the table, the mAP_t curve and the top-1_t curve
    data = json.loads(json.dumps(as_json(rows)))
    assert [Row.from_dict(d) for d in data] == rows
    assert [d["name"] for d in data] == ["Old", "New", "RM_naive"]
    assert data[2]["map"] == pytest.approx(list(naive.curve.maps)) and data[2]["flips"] == naive.curve.flips
    png = plot(rows, tmp_path / "curves.png", title="test")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gain_is_undefined_not_an_error_when_old_and_new_score_the_same(world):
    labels, new, _, order = world
    same = retrieval(new, new, labels)
    (row,) = backfill_table({"twin": BackfillEmbeddings.single(new, labels)}, order, old=same, new=same)
    assert np.isnan(row.gain_map) and row.as_dict()["gain_map"] is None
    assert "| twin |" in markdown([row]) and "n/a" in markdown([row])
