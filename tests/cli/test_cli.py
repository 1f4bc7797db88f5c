"""The rmq CLI on the embedded store: the commands a user types, and their errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from qdrant_client import QdrantClient

from rm_qdrant import open_store
from rm_qdrant.pair.record import load_pair, save_pair


def test_index_init_search_status(rmq, models, image_folder):
    out = json.loads(
        rmq(
            "index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old, "--json"
        ).output
    )
    assert out == {"collection": "gallery", "indexed": 24, "failed": []}
    assert (
        "pair 'demo' (rm): gallery -> demo-new"
        in rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm).output
    )
    query = sorted(image_folder.glob("b/*"))[0]
    hits = json.loads(rmq("search", "--name", "demo", query, "--limit", "3", "--exact", "--json").output)
    assert len(hits) == 3 and hits[0]["payload"]["uri"] == str(query.resolve())
    assert hits[0]["source"] == "old" and hits[0]["distance"] == pytest.approx(0.0, abs=1e-5)
    text = rmq("search", "--name", "demo", query, "--filter", "label=c").output
    assert "label" in text.splitlines()[0] and all(" c " in line for line in text.splitlines()[1:])
    status = json.loads(rmq("status", "--name", "demo", "--json").output)
    assert (status["old_count"], status["new_count"], status["fraction"], status["mode"]) == (
        24,
        0,
        0.0,
        "rm",
    )
    assert "migrated      0.0%" in rmq("status", "--name", "demo").output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "--name", "nope"], "no pair named 'nope'"),
        (
            ["init", "--name", "x", "--old-collection", "missing", "--encoder", "{rm}"],
            "collection 'missing' not found",
        ),
        (["index", "--collection", "g", "--data", "{tmp}/none", "--encoder", "{old}"], "image folder"),
        (["index", "--collection", "g", "--data", "{tmp}", "--encoder", "{tmp}/x.onnx"], "no images in"),
        (["index", "--data", "{tmp}", "--encoder", "{old}"], "exactly one of --name and --collection"),
        (
            ["init", "--name", "x", "--old-collection", "g", "--encoder", "{tmp}/missing.onnx"],
            "cannot read encoder",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(rmq, models, tmp_path, args, message):
    open_store(tmp_path / "q").close()  # an empty store
    filled = [a.format(rm=models.rm, old=models.old, tmp=tmp_path) for a in args]
    result = rmq(*filled, ok=False)
    assert result.exit_code == 1
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_search_with_an_unreadable_image(rmq, models, image_folder, tmp_path):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    bad = tmp_path / "bad.jpg"
    bad.write_text("not an image")
    result = rmq("search", "--name", "demo", bad, ok=False)
    assert result.exit_code == 1 and "not a readable image" in result.output
    result = rmq("search", "--name", "demo", bad, "--filter", "nonsense", ok=False)
    assert "expected FIELD=VALUE" in result.output


@pytest.mark.slow
def test_rmq_script_runs_as_a_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rm_qdrant", "--qdrant", str(tmp_path / "q"), "status", "--name", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"Error: no embedded store at {tmp_path / 'q'} (check --qdrant; 'rmq index' creates one)"
    )


@pytest.mark.parametrize("command", ["status", "finalize", "migrate", "search", "rollback", "probe"])
def test_a_mistyped_store_folder_is_an_error_and_creates_nothing(rmq, tmp_path, command):
    args = ["--name", "p"] + (["query.jpg"] if command == "search" else [])
    result = rmq(command, *args, ok=False)
    assert result.exit_code == 1 and "no embedded store at" in result.output
    assert not (tmp_path / "q").exists()


def test_migrate_finalize_from_the_command_line(rmq, models, image_folder):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    refused = rmq(
        "init",
        "--name",
        "demo",
        "--old-collection",
        "gallery",
        "--encoder",
        models.rm,
        "--keep-old",
        ok=False,
    )
    assert "--keep-old needs --old-encoder" in refused.output
    rmq(
        "init",
        "--name",
        "demo",
        "--old-collection",
        "gallery",
        "--encoder",
        models.rm,
        "--keep-old",
        "--old-encoder",
        models.old,
    )
    plan = json.loads(rmq("migrate", "--name", "demo", "--until", "0.5", "--dry-run", "--json").output)
    assert plan["would_move_at_most"] == 12 and plan["order_ready"] is False
    assert (
        json.loads(rmq("status", "--name", "demo", "--json").output)["new_count"] == 0
    )  # dry run wrote nothing
    assert (
        "ranked 'demo' in centroid order"
        in rmq("migrate", "--name", "demo", "--order", "centroid", "--prepare").output
    )
    report = json.loads(rmq("migrate", "--name", "demo", "--until", "0.5", "--batch", "5", "--json").output)
    assert report["moved"] == 12 and report["failed"] == 0
    out = rmq("finalize", "--name", "demo", ok=False).output
    assert "12 points still serve from 'gallery'" in out
    text = rmq("migrate", "--name", "demo", "--workers", "2", "--batch", "3").output
    assert "moved 12 points" in text
    status = json.loads(rmq("status", "--name", "demo", "--json").output)
    assert (status["old_count"], status["kept_count"], status["order"]) == (0, 24, "centroid")
    assert "alias 'live' -> demo-new" in rmq("finalize", "--name", "demo", "--alias", "live").output
    assert "rolled back: alias 'live' -> gallery" in rmq("rollback", "--name", "demo").output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--order", "alphabetical"], "unknown backfill order 'alphabetical'"),
        (["--shard", "2/2"], "bad --shard '2/2'"),
        (["--shard", "0/2"], "run 'rmq migrate --prepare'"),
        (["--shard", "0/2", "--workers", "2"], "not both"),
        (["--workers", "99999999999999999999999"], "workers (--workers) is a whole number from 1 to 256"),
        (["--workers", "99999999999999999999999", "--dry-run"], "from 1 to 256"),
        (["--fetch-workers", "257", "--dry-run"], "fetch_workers (--fetch-workers) is a whole number"),
        (["--order", "confidence"], "have no numeric payload 'old_confidence'"),
    ],
)
def test_migrate_bad_input(rmq, models, image_folder, args, message):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.new_only)
    rmq(
        "init",
        "--name",
        "demo",
        "--old-collection",
        "gallery",
        "--encoder",
        models.new_only,
        "--old-encoder",
        models.new_only,
    )
    result = rmq("migrate", "--name", "demo", *args, ok=False)
    assert result.exit_code != 0 and message in result.output


def test_eval_summary_gives_auc_gain_against_old_and_new_and_the_shape_against_its_ends():
    from rm_qdrant.cli.evaluate import summary
    from rm_qdrant.evaluation.baseline import Ends
    from rm_qdrant.evaluation.evaluate import ServedPoint

    points = [ServedPoint(t, t, m, c) for t, m, c in ((0.0, 0.4, 0.5), (0.5, 0.8, 0.7), (1.0, 0.8, 0.9))]
    totals = summary(points, Ends(ServedPoint(0.0, 0.0, 0.5, 0.6), ServedPoint(1.0, 1.0, 0.9, 0.8)))
    assert totals["auc_map"] == pytest.approx(0.7) and totals["shape_map"] == pytest.approx(0.75)
    assert totals["auc_cmc"] == pytest.approx(0.7) and totals["shape_cmc"] == pytest.approx(0.5)
    assert totals["gain_map"] == pytest.approx(0.5) and totals["gain_cmc"] == pytest.approx(0.5)
    assert (totals["old_map"], totals["new_top1"]) == (0.5, 0.8)
    unknown = summary(points, Ends(None, None, "no plain new model"))
    assert unknown["gain_map"] is None and unknown["gain_note"] == "no plain new model"
    assert summary(points[1:])["auc_map"] is None  # no t = 0: no area over [0, 1]


@pytest.mark.slow
def test_eval_measures_a_copy_and_leaves_the_pair_as_it_was(rmq, models, image_folder):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    rmq("migrate", "--name", "demo", "--until", "0.25")
    before = json.loads(rmq("status", "--name", "demo", "--json").stdout)
    result = rmq(
        "eval",
        "--name",
        "demo",
        "--queries",
        image_folder,
        "--at",
        "1,0,0.5",
        "--order",
        "centroid",
        "--json",
    )
    out = json.loads(result.stdout)
    assert [p["t"] for p in out["points"]] == [0.0, 0.5, 1.0]
    assert out["points"][0]["fraction"] == 0.25 and out["points"][-1]["fraction"] == 1.0  # the copy moved
    assert "already in new" in result.stderr and "t=0.5" in result.stderr  # progress on stderr
    assert out["auc_map"] is not None and "gain_map" in out and out["in_place"] is False
    assert out["gain_map"] is None and "records no plain new model" in out["gain_note"]  # rm, none given
    after = json.loads(rmq("status", "--name", "demo", "--json").stdout)
    assert (after["new_count"], after["order"]) == (before["new_count"], before["order"])  # not moved
    text = rmq("eval", "--name", "demo", "--queries", image_folder, "--at", "0,1").output
    assert "AUC_mAP" in text and "Gain" in text and "was not moved" in text
    rmq("eval", "--name", "demo", "--queries", image_folder, "--at", "0,1", "--in-place")
    assert json.loads(rmq("status", "--name", "demo", "--json").stdout)["fraction"] == 1.0
    for bad in ("half", "0,2"):
        assert (
            "bad --at"
            in rmq("eval", "--name", "demo", "--queries", image_folder, "--at", bad, ok=False).output
        )


def test_probe_forecasts_without_writing_and_status_shows_the_estimate(
    rmq, models, image_folder, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    assert "run rmq probe" in rmq("status", "--name", "demo").output
    out = json.loads(rmq("probe", "--name", "demo", "--sample", "20", "--k", "5", "--json").output)
    assert (out["sample"], out["unreadable"], out["order"]) == (20, 0, "random")
    no_psi, rm = out["forecasts"]
    assert (no_psi["mode"], rm["mode"]) == ("no-psi", "rm")  # no plain new model given: no naive curve
    assert rm["recall"][-1] == pytest.approx(1.0) and len(rm["recall"]) == len(rm["map"]) == 11
    # ψ selects the old part of the new vector exactly, yet the new vectors' extra dimensions stretch their
    # distances: merged with the old ones they rank too far, and the forecast must say where that dips.
    assert "The naive merge was not forecast" in out["recommendation"]
    assert ("rm dips at t = " in out["recommendation"]) == bool(rm["dips_at"])
    status = json.loads(rmq("status", "--name", "demo", "--json").output)
    assert status["new_count"] == 0  # the probe wrote nothing
    assert status["estimate"]["mode"] == "rm" and status["estimate"]["sample_migrated"] == 0.0
    rmq("migrate", "--name", "demo", "--until", "0.5")
    estimate = json.loads(rmq("status", "--name", "demo", "--json").output)["estimate"]
    assert 0.0 < estimate["sample_migrated"] < 1.0 and estimate["sample"] == 20
    assert "label-free, 20-point probe sample" in rmq("status", "--name", "demo").output
    text = rmq("probe", "--name", "demo", "--sample", "8", "--k", "3").output
    assert "recall@3 against the new model's own neighbours" in text and "recommendation:" in text
    assert "mAP over the sample (payload labels; 8 of the gallery's 12 points)" in text
    assert "ranks only the other 7" in text and "not comparable with served mAP" in text


def test_probe_bad_input(rmq, models, image_folder):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    assert "no pair named 'nope'" in rmq("probe", "--name", "nope", ok=False).output
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    # Four gone: probe reads a few sampled images first and stops only if none can be read, so
    # fewer than five gone keeps the test independent of the sample (ids follow the tmp path).
    for image in sorted(image_folder.rglob("*.png"))[:4]:
        image.unlink()
    assert "20 gallery points re-embedded, 4 unreadable skipped" in rmq("probe", "--name", "demo").output
    for image in [*image_folder.rglob("*.png"), *image_folder.rglob("*.jpg")]:
        image.unlink()
    result = rmq("probe", "--name", "demo", ok=False)
    assert result.exit_code == 1 and "sampled images could be read" in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in result.output  # after the progress label, one line


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["edge", "local"])
@pytest.mark.parametrize(
    ("state", "why"),
    [
        ("finalizing", "is finalizing"),
        ("finalized", "is finalized"),
        ("finalized, old name aliased to new", "is finalized"),  # the old name now serves 10-d vectors
        ("rolled_back", "is rolled_back"),
        ("old collection deleted", "its old collection 'products' is gone"),
    ],
)
def test_probe_refuses_in_one_line_a_pair_with_no_backfill_to_forecast(
    rmq, models, image_folder, tmp_path, backend, state, why
):
    if backend == "local":
        QdrantClient(path=str(tmp_path / "q")).close()  # a QdrantClient(path=...) folder
    rmq("index", "--collection", "products", "--data", image_folder, "--encoder", models.old)
    init = ["init", "--name", "p", "--old-collection", "products", "--encoder", models.rm]
    rmq(*init, "--keep-old", "--old-encoder", models.old)
    rmq("migrate", "--name", "p", "--until", "0.5")
    probe = ["probe", "--name", "p", "--sample", "6", "--k", "3"]
    assert json.loads(rmq(*probe, "--json").output)["sample"] == 6  # backfilling: a forecast
    if state == "finalizing":  # what a cutover killed half-way leaves
        with open_store(tmp_path / "q") as store:
            save_pair(store, dataclasses.replace(load_pair(store, "p"), state="finalizing"))
    elif state == "old collection deleted":
        with open_store(tmp_path / "q") as store:
            store.delete_collection("products")
    else:
        rmq("migrate", "--name", "p")
        if state == "rolled_back":
            rmq("rollback", "--name", "p")
        else:
            drop = ["--alias", "products", "--drop-old"] if "aliased" in state else []
            rmq("finalize", "--name", "p", *drop)

    for args in (probe, [*probe, "--json"]):
        result = rmq(*args, ok=False)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("Error: pair 'p'") and why in result.stderr
