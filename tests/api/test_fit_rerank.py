"""``rmq fit --rerank K``: the guard weighs the graph with the re-rank against the naive merge with
the re-rank; without it, the judgement is unchanged."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import rm_qdrant
from rm_qdrant import open_store
from rm_qdrant.cli import cli
from tests.api.test_library_commands import FIT, as_json, rmq, twin
from tests.conftest import one_error_line
from tests.evaluation.test_eval_rerank import faint_folder

pytestmark = pytest.mark.slow


@pytest.fixture
def images(tmp_path):
    return faint_folder(tmp_path / "images")


@pytest.fixture
def torch_threads():
    torch = pytest.importorskip("torch", reason="fit needs the train extra")
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_fit_with_a_rerank_judges_both_sides_reranked(tmp_path, models, images, torch_threads):
    """Re-ranked over the whole sample, the naive merge and the graph both serve their new
    model's ranking (the backbone's: procrustes keeps ρ the identity): every margin is 0."""
    lib = twin(tmp_path / "lib", models, images)
    with open_store(lib) as store:
        options = {"backbone": models.new_only, "loss": "procrustes", "force": True, **FIT}
        plain = rm_qdrant.fit(store, "p", out=tmp_path / "a.onnx", **options)
        full = rm_qdrant.fit(store, "p", out=tmp_path / "b.onnx", rerank=24, **options)
    assert plain.rerank is None and full.rerank == 24 and full.rerank_depth == 23
    # the gallery's payload has labels: they decide, by each side's mAP at every t
    assert full.decided_by == plain.decided_by == "labels"
    assert full.labelled.passed and full.labelled.naive == pytest.approx(full.labelled.fitted)
    assert plain.labelled.naive != pytest.approx(plain.labelled.fitted)
    naive_maps = full.forecasts[0].maps
    assert naive_maps == pytest.approx([naive_maps[-1]] * len(naive_maps))  # New's from t = 0
    shell = twin(tmp_path / "cli", models, images)
    printed = rmq(
        shell, "fit", "--name", "p", "--backbone", models.new_only, "--out", tmp_path / "c.onnx",
        "--loss", "procrustes", "--force", "--sample", 24, "--holdout", 0.5, "--k", 3, "--rerank", 24,
    )  # fmt: skip
    timing = ("train_seconds", "seconds", "out")
    assert {k: v for k, v in printed.items() if k not in timing} == {
        k: v for k, v in as_json(full.as_dict()).items() if k not in timing
    }


@pytest.mark.parametrize("k", ["0", "-1", "10001"])
def test_fit_rerank_out_of_range_is_one_line_and_nothing_is_written(tmp_path, models, k):
    out = tmp_path / "fit.onnx"
    result = CliRunner().invoke(
        cli,
        ["--qdrant", str(tmp_path / "q"), "fit", "--name", "p", "--backbone", str(models.new_only)]
        + ["--out", str(out), "--rerank", k],
    )
    assert f"'--rerank': {k} is not in the range 1<=x<=10000" in one_error_line(result)
    assert not out.exists() and not (tmp_path / "q").exists()
