"""``rmq eval --rerank K`` serves the curve with the new model re-ranking the merged first K:
with K covering the gallery every t serves New's ranking, read from the images themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from rm_qdrant import OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.api.evaluating import evaluate
from rm_qdrant.api.probing import probe
from rm_qdrant.cli import cli
from rm_qdrant.core.forecast import forecast
from rm_qdrant.errors import ConfigError
from tests.conftest import one_error_line

pytestmark = pytest.mark.slow

AT = [0.0, 0.5, 1.0]


@pytest.fixture
def image_folder(tmp_path):
    return faint_folder(tmp_path / "images")


def faint_folder(root: Path) -> Path:
    """Real PNG and JPEG files whose labels the colours hint at only faintly, so that the old and
    the new model rank them differently (the suite's folder is separable by colour alone)."""
    rng = np.random.default_rng(5)
    for k, label in enumerate(("a", "b", "c")):
        for i in range(8):
            pixels = rng.integers(0, 256, size=(8, 8, 3)).astype(np.int16)
            pixels[..., k] += 40
            target = root / label / f"{i:03d}.{'png' if i % 2 else 'jpg'}"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(target)
    return root


def naive_pair(store, models, folder, **options):
    """The team's gallery (the old model) and a naive pair to the plain new model over it."""
    items = scan_image_folder(folder)
    index_images(store, "gallery", OnnxEncoder(models.old), items)
    create_pair(
        store,
        "p",
        old_collection="gallery",
        encoder=OnnxEncoder(models.new_only),
        old_encoder=OnnxEncoder(models.old),
        **options,
    )
    return items


def test_a_rerank_covering_the_gallery_serves_news_map_at_every_t(store, models, image_folder):
    items = naive_pair(store, models, image_folder)
    n = len(items)

    plain = evaluate(store, "p", image_folder, at=AT, rerank=None)
    reranked = evaluate(store, "p", image_folder, at=AT, rerank=n, deadline=60.0)

    new_map = plain.totals["new_map"]
    assert abs(plain.points[0].map - new_map) > 1e-4  # without the re-rank, t = 0 is the old model
    assert [p.map for p in reranked.points] == pytest.approx([new_map] * len(AT), abs=1e-6)
    assert [p.top1 for p in reranked.points] == pytest.approx([plain.points[-1].top1] * len(AT), abs=1e-6)
    assert sum(p.missed for p in reranked.points) == 0  # every old hit was read and embedded
    # Old and New stay the references: served without the re-rank, beside the curve
    assert reranked.totals["old_map"] == pytest.approx(plain.points[0].map)
    assert reranked.totals["new_map"] == pytest.approx(new_map)
    assert reranked.gain_map is not None and reranked.gain_map > 0.99
    assert reranked.rerank is not None and reranked.rerank.k == n and plain.rerank is None


def test_the_rerank_reads_each_image_from_its_source(store, models, image_folder, tmp_path):
    """The re-rank embeds the gallery's images, not vectors it was handed: an image removed from
    disk keeps its merged distance and is counted."""
    items = naive_pair(store, models, image_folder)
    queries = tmp_path / "queries"
    for item in items[:6]:
        target = queries / item.label / f"q-{Path(item.uri).name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(item.uri).read_bytes())
    for item in [i for i in items if i.label == "b"][:3]:
        Path(item.uri).unlink()

    report = evaluate(store, "p", queries, at=[0.0], rerank=len(items), deadline=60.0)

    assert report.points[0].missed == 3 * 6  # three unreadable old hits in each query's list


def test_eval_serves_with_the_pairs_recorded_rerank_unless_told_not_to(store, models, image_folder):
    items = naive_pair(store, models, image_folder, rerank=len(items_in(image_folder)))
    served = evaluate(store, "p", image_folder, at=[0.0], deadline=60.0)
    without = evaluate(store, "p", image_folder, at=[0.0], rerank=None)
    assert served.rerank is not None and served.rerank.k == len(items)
    assert without.rerank is None
    assert served.points[0].map != pytest.approx(without.points[0].map, abs=1e-4)
    with pytest.raises(ConfigError, match="a re-rank deadline needs a re-rank"):
        evaluate(store, "p", image_folder, at=[0.0], rerank=None, deadline=1.0)


def items_in(folder):
    return scan_image_folder(folder)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rerank", "0"], "'--rerank': 0 is not in the range 1<=x<=10000"),
        (["--rerank", "-1"], "'--rerank': -1 is not in the range 1<=x<=10000"),
        (["--rerank", "10001"], "'--rerank': 10001 is not in the range 1<=x<=10000"),
        (["--rerank", "five"], "'--rerank': 'five' is not a valid integer"),
        (["--rerank-deadline", "0"], "'--rerank-deadline': 0.0 is not in the range x>0"),
        (["--no-rerank", "--rerank", "5"], "--no-rerank serves without a re-rank"),
    ],
)
def test_bad_rerank_options_are_one_line_and_nothing_is_written(tmp_path, image_folder, args, says):
    store_path = tmp_path / "q"
    result = CliRunner().invoke(
        cli, ["--qdrant", str(store_path), "eval", "--name", "p", "--queries", str(image_folder), *args]
    )
    assert says in one_error_line(result)
    assert not store_path.exists()


def test_rmq_eval_says_the_k_it_served_with(tmp_path, models, image_folder):
    store_path = str(tmp_path / "q")
    runner = CliRunner()
    base = ["--qdrant", store_path]
    for args in (
        ["index", "--collection", "gallery", "--data", str(image_folder), "--encoder", str(models.old)],
        ["init", "--name", "p", "--old-collection", "gallery", "--encoder", str(models.new_only)]
        + ["--old-encoder", str(models.old)],
    ):
        done = runner.invoke(cli, base + args)
        assert done.exit_code == 0, done.output
    args = ["eval", "--name", "p", "--queries", str(image_folder), "--at", "0,1"]
    text = runner.invoke(cli, base + args + ["--rerank", "24", "--rerank-deadline", "60"])
    assert text.exit_code == 0, text.output
    assert "served with the re-rank at K = 24 (deadline 60 s" in text.output
    data = json.loads(
        runner.invoke(cli, base + args + ["--rerank", "24", "--rerank-deadline", "60", "--json"]).stdout
    )
    assert data["rerank"]["k"] == 24 and data["points"][0]["missed"] == 0
    plain = runner.invoke(cli, base + args + ["--no-rerank"])
    assert "served without a re-rank" in plain.output


def test_the_probe_forecast_of_a_full_rerank_is_news_curve():
    """The forecast's re-rank (rmq probe --rerank, fit's guard) with K covering the sample ranks
    every item by the new model at every t."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    centres = rng.normal(size=(4, 16))
    new = centres[labels] + 0.6 * rng.normal(size=(40, 16))
    old = rng.normal(size=(40, 8)) + 0.3 * centres[labels][:, :8]
    order = rng.permutation(40)
    fractions = (0.0, 0.5, 1.0)
    plain = forecast(old, new, order=order, labels=labels.tolist(), k=5, fractions=fractions)[0]
    full = forecast(old, new, order=order, labels=labels.tolist(), k=5, fractions=fractions, rerank=39)[0]
    assert plain.maps[0] < plain.maps[-1] - 0.05
    assert full.maps == pytest.approx([plain.maps[-1]] * 3)
    assert full.recall == pytest.approx([1.0] * 3)


def test_probe_with_a_rerank_covering_the_gallery_forecasts_news_curve(store, models, image_folder):
    items = naive_pair(store, models, image_folder)
    plain = probe(store, "p", sample=len(items), cache=False)
    full = probe(store, "p", sample=len(items), cache=False, rerank=len(items))
    before, after = plain.forecasts[0], full.forecasts[0]
    assert before.recall[0] < 0.99 and after.recall == pytest.approx([1.0] * len(after.fractions))
    assert after.maps == pytest.approx([before.maps[-1]] * len(after.fractions))
    assert full.rerank == len(items) and full.rerank_depth == len(items) - 1
    assert full.as_dict()["rerank_depth"] == len(items) - 1


@pytest.mark.parametrize("command", ["probe"])
@pytest.mark.parametrize("k", ["0", "-1", "10001"])
def test_probe_rerank_out_of_range_is_one_line(tmp_path, command, k):
    store_path = tmp_path / "q"
    result = CliRunner().invoke(cli, ["--qdrant", str(store_path), command, "--name", "p", "--rerank", k])
    assert f"'--rerank': {k} is not in the range 1<=x<=10000" in one_error_line(result)
    assert not store_path.exists()
