"""``rmq fit`` on a team's deployment: its collection, its payload, its ONNX models, no labels.

The deployment is the one of ``test_team_upgrade``: a qdrant-client folder with a named
vector, images on HTTP and S3, two plain ``torch.onnx.export`` models stamped by rmq.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from rm_qdrant import OnnxEncoder, load_pair, open_store
from rm_qdrant.cli import cli
from tests.e2e.test_team_upgrade import MEAN, STD, N, deployment, make_local_folder, web  # noqa: F401

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

SOURCES = ["--allow-private-network"]


@pytest.fixture
def team(tmp_path, deployment):  # noqa: F811
    rows, vectors, old, new = deployment
    folder = tmp_path / "team-store"
    make_local_folder(folder, "products", rows, vectors)

    def rmq(*args, ok=True):
        result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, args)])
        assert (result.exit_code == 0) == ok, result.output
        return result

    prep = ["--input-size", "32", "--resize", "36", "--crop", "32", "--input-layout", "NCHW"]
    prep += ["--input-dtype", "float32", "--mean", ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD))]
    for model, output in ((old, "embeddings"), (new, "image_embeds")):
        rmq(
            "model",
            "stamp",
            model,
            "--out",
            tmp_path / model.name.replace("team-", ""),
            "--output",
            f"embedding={output}",
            *prep,
        )
    rmq(
        "init",
        "--name",
        "upgrade",
        "--old-collection",
        "products",
        "--encoder",
        tmp_path / "new.onnx",
        "--old-encoder",
        tmp_path / "old.onnx",
        "--uri-field",
        "image_url",
    )
    return rmq, tmp_path, rows


FIT = ["fit", "--name", "upgrade", "--sample", str(N), "--holdout", "0.5", "--k", "3", *SOURCES]


def test_a_fitted_graph_from_the_live_gallery_is_served_by_switch_encoder(team):
    rmq, tmp, rows = team
    rmq("migrate", "--name", "upgrade", "--until", "0.5", "--batch", "8", *SOURCES)
    out = tmp / "fitted.onnx"
    report = json.loads(
        rmq(
            *FIT, "--backbone", tmp / "new.onnx", "--out", out, "--loss", "procrustes", "--force", "--json"
        ).output
    )
    assert (report["sample"], report["unreadable"], report["held_out"]) == (N // 2, 0, N // 4)
    assert report["parity"] < 1e-4  # random team models: whether it beats naive is chance, hence --force
    encoder = OnnxEncoder(out)
    assert set(encoder.info.outputs) == {"new", "rev"} and encoder.info.outputs["rev"] == 16
    # ρ is the identity: the fitted graph's new output is the backbone's, so the running pair takes it.
    rmq("switch-encoder", "--name", "upgrade", "--encoder", out, *SOURCES)
    status = json.loads(rmq("status", "--name", "upgrade", "--json").output)
    assert status["mode"] == "rm"
    with open_store(tmp / "team-store") as store:  # an image already moved: the new output finds it
        moved = store.scroll(load_pair(store, "upgrade").new_collection, limit=1)[0][0].id
    query = tmp / "query.jpg"
    query.write_bytes(next(r["data"] for r in rows if r["id"] == moved))
    hits = json.loads(rmq("search", "--name", "upgrade", query, "--json").output)
    assert hits[0]["id"] == moved and hits[0]["distance"] < 1e-4
    refused = rmq("calibrate", "--name", "upgrade", *SOURCES, ok=False).output
    assert "rm mode" in refused and "Traceback" not in refused


def test_a_fit_worse_than_the_naive_merge_is_not_written_unless_forced(team):
    rmq, tmp, _ = team
    out = tmp / "bad.onnx"
    # One tiny step leaves ψ at its random start: its queries are noise against the old collection.
    bad = ["--backbone", tmp / "new.onnx", "--out", out, "--loss", "rqt", "--steps", "1", "--lr", "1e-9"]
    result = rmq(*FIT, *bad, ok=False)
    assert "not written" in result.output and "--force" in result.output and not out.exists()
    assert "Traceback" not in result.output
    rmq(*FIT, *bad, "--force")
    assert out.is_file()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--label-field", "colour"], "payload field 'colour' is missing"),
        (["--loss", "mcl"], "--loss mcl needs labels"),
        (["--backbone-from", "old"], "gives 16-d embeddings"),
        (["--backbone-from", "unstamped"], "rmq model stamp"),
    ],
)
def test_bad_fits_say_why_in_one_line(team, args, says):
    rmq, tmp, _ = team
    backbone = tmp / "new.onnx"
    if args[0] == "--backbone-from":
        backbone = tmp / ("old.onnx" if args[1] == "old" else "team-new.onnx")
        args = []
    result = rmq(*FIT, "--backbone", backbone, "--out", tmp / "x.onnx", *args, ok=False)
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and says in lines[0], result.output
    assert not (tmp / "x.onnx").exists()


def test_labels_from_the_payload_train_mcl_with_rho(team):
    rmq, tmp, _ = team
    out = tmp / "mcl.onnx"
    report = json.loads(
        rmq(
            *FIT,
            "--backbone",
            tmp / "new.onnx",
            "--out",
            out,
            "--label-field",
            "category",
            "--steps",
            "30",
            "--force",
            "--json",
        ).output
    )
    assert report["loss"] == "mcl" and report["learned_rho"]
    assert report["forecasts"][1]["map"] is not None
    graph = onnx.load(str(out))
    assert [o.name for o in graph.graph.output] == ["new", "rev"]
    got = OnnxEncoder(out).encode([np.zeros((40, 40, 3), np.uint8)])
    assert got["new"].shape == (1, 24) and abs(float(np.linalg.norm(got["rev"])) - 1) < 1e-5


def test_without_labels_fit_trains_psi_alone_by_the_label_free_recipe(team, monkeypatch):
    monkeypatch.setattr("rm_qdrant_train.label_free.STEPS", 10)
    rmq, tmp, _ = team
    report = json.loads(
        rmq(*FIT, "--backbone", tmp / "new.onnx", "--out", tmp / "lf.onnx", "--force", "--json").output
    )
    assert report["loss"] == "label-free" and not report["learned_rho"] and (tmp / "lf.onnx").is_file()


def test_calibrate_maps_old_hits_onto_the_new_scale_and_clear_undoes_it(team):
    rmq, tmp, rows = team
    rmq("migrate", "--name", "upgrade", "--until", "0.5", "--batch", "8", *SOURCES)
    query = tmp / "query.jpg"
    query.write_bytes(rows[3]["data"])

    def old_hits():
        hits = json.loads(rmq("search", "--name", "upgrade", query, "--limit", "40", "--json").output)
        return {h["id"]: h["distance"] for h in hits if h["source"] == "old"}

    plain = old_hits()
    probe = ["probe", "--name", "upgrade", "--sample", N, "--k", "3", "--json", *SOURCES]
    naive_before = json.loads(rmq(*probe).output)["forecasts"][0]["recall"]
    report = json.loads(
        rmq(
            "calibrate",
            "--name",
            "upgrade",
            "--sample",
            N,
            "--holdout",
            "0.5",
            "--k",
            "3",
            "--force",
            "--json",
            *SOURCES,
        ).output
    )
    assert report["kept"] and report["sample"] == N // 2 and report["knots"] >= 2
    with open_store(tmp / "team-store") as store:
        calibration = load_pair(store, "upgrade").old_distance
    calibrated = old_hits()
    assert json.loads(rmq("status", "--name", "upgrade", "--json").output)["calibrated"]
    # probe forecasts the naive merge as it is served now: calibrated
    naive_after = json.loads(rmq(*probe).output)["forecasts"][0]["recall"]
    assert naive_after != naive_before
    assert set(calibrated) == set(plain) and len(plain) >= 10
    assert all(abs(calibrated[i] - float(calibration(np.array(d)))) < 1e-6 for i, d in plain.items())
    rmq("calibrate", "--name", "upgrade", "--clear")
    assert old_hits() == plain
    assert "merge         plain distances" in rmq("status", "--name", "upgrade").output


def test_nothing_is_written_or_overwritten_by_a_fit_that_cannot_be_served(team):
    rmq, tmp, _ = team
    backbone = tmp / "new.onnx"
    before = backbone.read_bytes()

    def refused(*args, says):
        result = rmq(*FIT, *args, ok=False)
        lines = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.output, result.output

    refused("--backbone", backbone, "--out", backbone, "--force", says="--out is the backbone")
    refused("--backbone", backbone, "--out", tmp / "no" / "x.onnx", says="does not exist")
    # A huge learning rate drives the heads to NaN: never written, not even with --force.
    diverge = ["--loss", "rqt", "--lr", "1e30", "--steps", "20", "--force"]
    refused("--backbone", backbone, "--out", tmp / "nan.onnx", *diverge, says="training diverged")
    assert not (tmp / "nan.onnx").exists() and not list(tmp.glob(".*.partial"))
    rmq(*FIT, "--backbone", backbone, "--out", tmp / "f.onnx", "--loss", "procrustes", "--force")
    refused("--backbone", tmp / "f.onnx", "--out", tmp / "g.onnx", says="already has heads")
    assert backbone.read_bytes() == before
