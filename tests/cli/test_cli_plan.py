"""``rmq plan`` end to end on real small pairs (real JPEG and PNG files, real ONNX encoders, the
embedded store): what it prints and reports, that it writes nothing anywhere (the store, the
probe cache, the temporary folder), and its one-line refusals."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import rm_qdrant
from rm_qdrant import open_store
from rm_qdrant.caches import cache_root
from rm_qdrant.core.capacity import link_bytes
from tests.conftest import NEW_DIM, OLD_DIM, one_error_line
from tests.serving.hostile import snapshot

LAYOUTS = {
    "paired": ["--old-collection", "gallery"],
    "keep-old": ["--old-collection", "gallery", "--keep-old"],
    "single-collection": ["--mode", "single-collection", "--collection", "gallery", "--new-vector", "fresh"],
}


def pair(rmq, models, images: Path, layout: str = "paired") -> None:
    rmq("index", "--collection", "gallery", "--data", images, "--encoder", models.old)
    rmq("init", "--name", "p", "--encoder", models.rm, "--old-encoder", models.old, *LAYOUTS[layout])


def everything(tmp_path: Path) -> dict:
    """What a plan must leave as it was: every point of every collection (the pair record
    included), the payload indexes, the probe cache, and the scratch folders in the temp folder."""
    with open_store(tmp_path / "q") as store:
        stored = snapshot(store)
        indexes = {name: store.payload_indexes(name) for name in store.list_collections()}
    cache = (
        sorted((str(p), p.stat().st_mtime_ns) for p in cache_root().rglob("*"))
        if cache_root().exists()
        else []
    )
    scratch = sorted(p.name for p in Path(tempfile.gettempdir()).glob(f"rmq-eval-{os.getpid()}-*"))
    return {"points": stored, "indexes": indexes, "cache": cache, "scratch": scratch}


def plan_json(rmq, *args: object) -> dict:
    return json.loads(rmq("plan", "--name", "p", "--probe-sample", 24, *args, "--json").output)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_plan_times_every_stage_reports_the_storage_and_writes_nothing(
    rmq, models, image_folder, tmp_path, layout
):
    pair(rmq, models, image_folder, layout)
    before = everything(tmp_path)
    data = plan_json(rmq, "--sample", 16)
    assert everything(tmp_path) == before
    assert (data["points"], data["left"], data["in_new"], data["failed_skipped"]) == (24, 24, 0, 0)
    assert data["layout"] == {"keep-old": "paired --keep-old"}.get(layout, layout) and not data["server"]
    assert data["sample"] == {
        "drawn": 16,
        "timed": 16,
        "unreadable": 0,
        "unreadable_share": 0.0,
        "first_reason": None,
        "local_files": True,
    }
    stages = {s["name"]: s for s in data["stages"]}
    assert set(stages) - {"process"} == {"fetch", "decode", "encode", "cpu", "write"}  # process: light images
    for name in ("fetch", "decode", "encode", "write"):
        assert stages[name]["ms_per_point"] > 0 and stages[name]["points_per_s"] > 0
    slowest = min(data["stages"], key=lambda s: s["points_per_s"])
    assert data["bottleneck"] == slowest["name"] and data["points_per_s"] == slowest["points_per_s"]
    assert data["seconds"] == pytest.approx(24 / data["points_per_s"])
    storage = data["storage"]
    assert (storage["old_dim"], storage["new_dim"], storage["hnsw_m"]) == (OLD_DIM, NEW_DIM, 16)
    assert storage["new_vectors_bytes"] == 24 * NEW_DIM * 4
    assert storage["hnsw_links_bytes"] == pytest.approx(24 * link_bytes(16))
    if layout == "single-collection":  # the new vector joins each point: no copy, old freed at finalize
        assert storage["payload_copies_bytes"] == storage["frees_during_bytes"] == 0
        assert storage["frees_at_finalize_bytes"] == pytest.approx(24 * (OLD_DIM * 4 + link_bytes(16)))
    else:  # each copy carries its payload (the image's uri, its label, rm-qdrant's mark)
        assert storage["payload_copy_mean_bytes"] > len('{"uri":"","label":"a","rmq_origin":"migrate"}')
        kept = storage["frees_at_finalize_bytes"] if layout == "keep-old" else storage["frees_during_bytes"]
        assert kept == pytest.approx(storage["keep_old_holds_bytes"]) and kept > 24 * OLD_DIM * 4
    assert [c["mode"] for c in data["forecast"]["curves"]] == ["no-psi", "rm"]
    assert data["forecast"]["sample"] == 24 and data["forecast_note"] is None
    assert any("server's own write time was not measured" in n for n in data["notes"])


def test_plan_prints_a_table_the_bottleneck_the_storage_and_the_forecast(rmq, models, image_folder):
    pair(rmq, models, image_folder)
    text = rmq("plan", "--name", "p", "--sample", 8, "--probe-sample", 24, "--workers", 2).output
    assert "plan for pair p (paired, the embedded store): 24 point(s) left to migrate, 0 in new" in text
    assert "local engine, 2 worker(s)" in text
    for line in ("stage     ms/point", "fetch ", "decode ", "encode ", "write ", "bottleneck: "):
        assert line in text
    assert "24 x 10-d x 4 B = 960 B" in text
    assert "forecast (rmq probe on 24 point(s), order random, kept nowhere): no-psi recall@10" in text
    assert "a server's own write time was not measured" in text


def test_plan_until_plans_part_of_the_gallery_and_counts_what_moved(rmq, models, image_folder):
    pair(rmq, models, image_folder)
    rmq("migrate", "--name", "p", "--limit", 6)
    data = plan_json(rmq, "--until", 0.5, "--no-forecast")
    assert (data["left"], data["in_new"], data["points"]) == (18, 6, 6)
    assert data["storage"]["points"] == 6 and data["seconds"] == pytest.approx(6 / data["points_per_s"])
    assert data["forecast"] is None and data["forecast_note"] == "left out (--no-forecast)"


def test_unreadable_images_are_a_share_left_out_of_the_timing_and_nothing_is_recorded(
    rmq, models, image_folder, tmp_path
):
    pair(rmq, models, image_folder)
    for path in sorted(image_folder.glob("a/*")):  # 8 of the 24 images
        path.unlink()
    before = everything(tmp_path)
    data = plan_json(rmq, "--sample", 24, "--no-forecast")
    assert everything(tmp_path) == before  # no point marked failed, as a migration would
    sample = data["sample"]
    assert (sample["drawn"], sample["timed"], sample["unreadable"]) == (24, 16, 8)
    assert sample["unreadable_share"] == pytest.approx(1 / 3) and "a/00" in sample["first_reason"]
    text = rmq("plan", "--name", "p", "--sample", 24, "--no-forecast").output
    assert "8 unreadable (33%: a migration records them as failed; first: " in text


def test_a_pair_whose_images_are_all_missing_is_one_line_and_changes_nothing(
    rmq, models, image_folder, tmp_path
):
    pair(rmq, models, image_folder)
    shutil.rmtree(image_folder)
    before = everything(tmp_path)
    line = one_error_line(rmq("plan", "--name", "p", ok=False))
    assert line.startswith("Error: none of 5 sampled images could be read from local files, so nothing was")
    assert "No such file or directory" in line
    assert everything(tmp_path) == before


def test_a_sample_of_which_no_image_decodes_is_an_error_naming_the_first_reason(
    rmq, models, image_folder, tmp_path
):
    pair(rmq, models, image_folder)
    for path in image_folder.glob("*/*"):
        path.write_bytes(b"not an image")  # read, so the pre-flight passes; decoded, none
    before = everything(tmp_path)
    line = one_error_line(rmq("-q", "plan", "--name", "p", ok=False))
    assert line.startswith(
        "Error: none of the 24 sampled images of pair 'p' could be read, so nothing was timed: "
    )
    assert "not a JPEG, PNG, WebP, AVIF, GIF, BMP, TIFF, TGA or PPM image data" in line
    assert line.endswith("(a migration would record each as failed)")
    assert everything(tmp_path) == before


def test_a_pair_with_nothing_left_says_so(rmq, models, image_folder):
    pair(rmq, models, image_folder)
    rmq("migrate", "--name", "p")
    data = plan_json(rmq)
    assert (data["points"], data["left"], data["in_new"], data["seconds"]) == (0, 0, 24, None)
    assert data["stages"] == [] and data["forecast"] is None
    text = rmq("plan", "--name", "p").output
    assert "pair 'p' has no point left to migrate; 'rmq finalize --name p' ends it" in text


def test_a_forecast_that_cannot_run_is_named_and_the_plan_still_prints(rmq, models, image_folder):
    pair(rmq, models, image_folder)
    rmq("migrate", "--name", "p", "--limit", 23)  # one point left: a probe needs two
    data = plan_json(rmq)
    assert data["points"] == 1 and data["bottleneck"] is not None
    assert data["forecast"] is None and data["forecast_note"].startswith("rmq probe could not run: ")
    assert "forecast: rmq probe could not run: " in rmq("plan", "--name", "p").output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", 0], "'--workers': 0 is not in the range 1<=x<=256"),
        (["--workers", 257], "'--workers': 257 is not in the range 1<=x<=256"),
        (["--encoders", 0], "'--encoders': 0 is not in the range 1<=x<=256"),
        (["--fetch-workers", 0], "'--fetch-workers'"),
        (["--gpus", -1], "'--gpus': -1 is not in the range 0<=x<=4096"),
        (["--gpu-rate", 0], "'--gpu-rate'"),
        (["--gpu-rate", "nan"], "'--gpu-rate'"),
        (["--sample", 0], "'--sample'"),
        (["--gpus", 1], "--gpus 1 needs --gpu-rate R (points a second one GPU embeds"),
        (["--gpu-rate", 3000], "--gpu-rate is the rate of one GPU: give --gpus N with it"),
        (["--gpus", 2, "--gpu-rate", 3000], "--gpus 2: the local engine encodes on one GPU"),
        (
            ["--gpus", 2, "--gpu-rate", 3000, "--encoders", 1],
            "--gpus 2 with --encoders 1: each encoder actor",
        ),
    ],
)
def test_bad_options_are_one_line_and_nothing_is_timed(rmq, models, image_folder, tmp_path, args, says):
    pair(rmq, models, image_folder)
    before = everything(tmp_path)
    assert says in one_error_line(rmq("plan", "--name", "p", *args, ok=False))
    assert everything(tmp_path) == before


def test_a_pair_that_is_missing_finalized_or_rolled_back_is_one_line(rmq, models, image_folder):
    pair(rmq, models, image_folder, "keep-old")
    assert "no pair named 'nope'" in one_error_line(rmq("plan", "--name", "nope", ok=False))
    rmq("rollback", "--name", "p")
    line = one_error_line(rmq("plan", "--name", "p", ok=False))
    assert line == "Error: pair 'p' is rolled_back: there is no backfill left to plan"


def test_a_finalized_pair_is_one_line(rmq, models, image_folder):
    pair(rmq, models, image_folder)
    rmq("migrate", "--name", "p")
    rmq("finalize", "--name", "p")
    line = one_error_line(rmq("plan", "--name", "p", ok=False))
    assert line == "Error: pair 'p' is finalized: there is no backfill left to plan"


def test_the_library_call_plans_the_ray_engine_and_given_gpus_and_keeps_no_probe(
    models, image_folder, tmp_path
):
    with open_store(tmp_path / "q") as store:
        rm_qdrant.index(store, image_folder, encoder=models.old, collection="gallery")
        rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm)
        steps: list[rm_qdrant.Step] = []
        probes = sorted(cache_root().glob("probe-*"))
        report = rm_qdrant.plan(
            store, "p", sample=8, encoders=4, decoders=3, gpus=2, gpu_rate=5000.0, cores=16, probe_sample=24,
            on_step=steps.append,
        )  # fmt: skip
        with pytest.raises(rm_qdrant.ConfigError, match="workers is a whole number from 1 to 256, got 0"):
            rm_qdrant.plan(store, "p", workers=0)
        with pytest.raises(rm_qdrant.ConfigError, match="until is a fraction from 0 to 1"):
            rm_qdrant.plan(store, "p", until=1.5)
    assert isinstance(report, rm_qdrant.PlanReport)
    setup = report.as_dict()["setup"]
    assert (setup["engine"], setup["encoders"], setup["decoders"], setup["gpus"], setup["cores"]) == (
        "ray",
        4,
        3,
        2,
        16,
    )
    assert setup["gpu_rate_from"] == "given" and setup["fetch_threads"] == 2  # a Ray task's local default
    encode = next(s for s in report.capacity.stages if s.name == "encode")
    assert encode.rate == pytest.approx(10_000)
    assert any("given, not measured" in n for n in report.notes)
    assert report.forecast is not None and sorted(cache_root().glob("probe-*")) == probes  # kept nowhere
    assert [s.label for s in steps if s.total is not None][:1] == ["timing the sample"]


def test_a_server_store_with_images_over_http(models, image_folder, http_images, monkeypatch):
    """qdrant-client's local mode declaring what a server does (its searches concurrent): the workers'
    writes add up, a paired batch's 1 s wait is added to the write, and images over HTTP get the
    network's 8 fetch threads; the pair's store is left as it was."""
    from rm_qdrant import SourceConfig
    from tests.conftest import says_remote

    with open_store(":memory:") as store:
        rm_qdrant.index(store, image_folder, encoder=models.old, collection="gallery")
        rm_qdrant.init(store, "p", old_collection="gallery", encoder=models.rm)
        page, _ = store.scroll("gallery", limit=100)
        relative = {r.id: Path(r.payload["uri"]).relative_to(image_folder) for r in page}
        store.set_payload(
            "gallery", [(i, {"uri": f"{http_images}/ok/{path}"}) for i, path in relative.items()]
        )
        says_remote(store, monkeypatch)
        before = snapshot(store)
        report = rm_qdrant.plan(
            store,
            "p",
            sample=8,
            workers=3,
            batch=500,
            forecast=False,
            source=SourceConfig(allow_private=True),
        )
        assert snapshot(store) == before
    data = report.as_dict()
    assert data["server"] and data["sample"]["local_files"] is False and data["sample"]["timed"] == 8
    assert data["setup"]["fetch_threads"] == 8 and not data["setup"]["embedded_store"]
    write = next(s for s in report.capacity.stages if s.name == "write")
    assert write.seconds == pytest.approx(report.sample.times.write + 1 / 500)  # REMOVAL_GRACE a batch
    assert write.rate == pytest.approx(3 / write.seconds)  # three workers write side by side
    assert "process" not in {s.name for s in report.capacity.stages}
    assert any("the 1 s a paired run waits each --batch of 500 is added" in n for n in report.notes)
