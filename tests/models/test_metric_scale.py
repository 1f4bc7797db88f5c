"""The metric and the scale belong to the collection (issue 23): a Euclid collection of raw vectors.

The team's old model writes un-normalised vectors (norms about 6 to 10) into a Euclid
collection; its new model is raw as well. A graph that L2-normalises them points the
same way, so cosine alone cannot tell it apart: every check here compares under the
collection's own metric. Real ONNX graphs, real images, the embedded store on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from rm_qdrant import ConfigError, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant.core.modelinfo import METADATA_KEY
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC, make_image_folder

N = 30


@dataclass(frozen=True)
class Team:
    folder: Path  # the embedded store: collection 'catalog' (Euclid, raw old vectors)
    old: Path  # the old model, stamped euclid, raw
    backbone: Path  # the new model: one 'embedding' output, raw vectors
    items: list


def l2_normalised(source: Path, out: Path, roles: tuple[str, ...]) -> Path:
    """The same graph with an LpNormalization (p=2) on each of ``roles``' outputs: what a graph
    that L2-normalises its vectors looks like; its metadata loses its scale (a careless re-stamp)."""
    model = onnx.load(str(source))
    for role in roles:
        producer = next(n for n in model.graph.node if role in n.output)
        producer.output[list(producer.output).index(role)] = f"{role}_raw"
        model.graph.node.append(helper.make_node("LpNormalization", [f"{role}_raw"], [role], axis=1, p=2))
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            body = json.loads(prop.value)
            body.pop("scale", None)
            prop.value = json.dumps(body)
    onnx.save(model, str(out))
    return out


def raw_linear(path: Path, weight: np.ndarray, *, name: str, distance: str | None, scale: str | None) -> Path:
    return linear_encoder(
        path, [("embedding", "pixels", weight)], input_spec=SPEC, name=name, distance=distance, scale=scale
    )


def build_team(root: Path, *, stamp: tuple[str | None, str | None] = ("euclid", None)) -> Team:
    """A Euclid collection of raw old vectors (median norm 8), indexed by the old model; the new
    model extends the old one, so ψ can reach the old vectors from the new ones."""
    rng = np.random.default_rng(23)
    items = scan_image_folder(make_image_folder(root / "images", per_class=10))
    w_old = rng.normal(size=(PIXELS, OLD_DIM))
    unscaled = raw_linear(root / "unscaled.onnx", w_old, name="u", distance=None, scale=None)
    norms = np.linalg.norm(OnnxEncoder(unscaled).encode([i.uri for i in items])["embedding"], axis=1)
    w_old *= 8.0 / np.median(norms)
    w_new = np.hstack([w_old, rng.normal(size=(PIXELS, NEW_DIM - OLD_DIM)) * np.abs(w_old).mean()])
    old = raw_linear(root / "old.onnx", w_old, name="old-raw", distance="euclid", scale="raw")
    distance, scale = stamp  # default: stamped --distance euclid before scales existed
    backbone = raw_linear(root / "new-euclid.onnx", w_new, name="new-euclid", distance=distance, scale=scale)
    folder = root / "qdrant"
    with open_store(folder) as store:
        index_images(store, "catalog", OnnxEncoder(old), items)
    return Team(folder, old, backbone, items)


def rmq(folder: Path, *args: object, ok: bool = True):
    result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, args)])
    assert (result.exit_code == 0) == ok, result.output
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def team(tmp_path: Path) -> Team:
    return build_team(tmp_path)


def test_the_team_collection_is_euclid_with_raw_vectors(team):
    with open_store(team.folder) as store:
        spec = store.collection("catalog")
        points, _ = store.scroll("catalog", limit=N, with_vectors=True)
    norms = np.linalg.norm(np.stack([p.vector for p in points]), axis=1)
    assert spec.distance == "euclid" and len(points) == N
    assert 4 < norms.min() and norms.max() < 16 and 7 < np.median(norms) < 9  # far from unit length


def test_model_check_compares_under_euclid_and_reports_norms(team, tmp_path):
    # The old model's graph, L2-normalised: the same directions (cosine 1.0), another scale.
    unit = l2_normalised(team.old, tmp_path / "old-unit.onnx", ("embedding",))
    bad = rmq(team.folder, "model", "check", unit, "--collection", "catalog", ok=False)
    errors = [line for line in bad.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, bad.output
    assert "the same directions (cosine min 1.0000)" in errors[0] and "it L2-normalises them" in errors[0]
    assert "its norms min 1 median 1" in errors[0] and "raw vectors" in errors[0]
    good = rmq(team.folder, "model", "check", team.old, "--collection", "catalog")
    assert "(euclid)" in good.output and "norms: stored min" in good.output and "model min" in good.output
    report = json.loads(
        rmq(team.folder, "model", "check", team.old, "--collection", "catalog", "--json").output
    )
    assert report["matches"] and report["metric"] == "euclid" and report["error_max"] < 1e-4
    assert 7 < report["stored_norms"][1] < 9
    assert report["model_norms"][1] == pytest.approx(report["stored_norms"][1], rel=1e-4)


def test_a_graph_stamped_without_a_distance_serves_cosine_and_euclid_collections(team, models, tmp_path):
    stamped = tmp_path / "new-any.onnx"
    out = rmq(
        team.folder,
        "model",
        "stamp",
        team.backbone,
        "--out",
        stamped,
        "--output",
        "embedding=embedding",
        "--input-size",
        "8",
    )
    with open_store(team.folder) as store:
        index_images(store, "photos", OnnxEncoder(models.old), team.items)  # a cosine collection
        assert store.collection("photos").distance == "cosine"
    for collection, old in (("catalog", team.old), ("photos", models.old)):
        rmq(
            team.folder,
            "init",
            "--name",
            collection,
            "--old-collection",
            collection,
            "--encoder",
            stamped,
            "--old-encoder",
            old,
        )
    assert "any distance" in out.output and OnnxEncoder(stamped).info.distance is None
    with open_store(team.folder) as store:
        assert store.collection("catalog-new").distance == "euclid"
        assert store.collection("photos-new").distance == "cosine"
    cosine_only = raw_linear(
        tmp_path / "cos.onnx", np.ones((PIXELS, NEW_DIM)), name="c", distance="cosine", scale=None
    )
    with open_store(team.folder) as store:
        with pytest.raises(ConfigError, match="made for cosine distance, collection 'catalog' uses euclid"):
            create_pair(
                store,
                "q",
                old_collection="catalog",
                encoder=OnnxEncoder(cosine_only),
                old_encoder=OnnxEncoder(team.old),
                new_collection="q-new",
            )


def test_stamp_scale_unit_is_a_promise_checked_on_random_images(team, tmp_path):
    result = rmq(
        team.folder,
        "model",
        "stamp",
        team.backbone,
        "--out",
        tmp_path / "x.onnx",
        "--output",
        "embedding=embedding",
        "--input-size",
        "8",
        "--scale",
        "unit",
        ok=False,
    )
    assert "--scale unit, but output 'embedding' (embedding) gives vectors of norm" in result.output
    assert not (tmp_path / "x.onnx").exists()
    unit = l2_normalised(team.backbone, tmp_path / "unit.onnx", ("embedding",))
    rmq(
        team.folder,
        "model",
        "stamp",
        unit,
        "--out",
        tmp_path / "y.onnx",
        "--output",
        "embedding=embedding",
        "--input-size",
        "8",
        "--scale",
        "unit",
    )
    assert OnnxEncoder(tmp_path / "y.onnx").info.scale == "unit"


def test_stamp_scale_raw_says_the_norms_carry_meaning(team, tmp_path):
    args = ["--output", "embedding=embedding", "--input-size", "8", "--distance", "euclid", "--scale", "raw"]
    out = rmq(team.folder, "model", "stamp", team.backbone, "--out", tmp_path / "raw.onnx", *args)
    assert "euclid distance, raw vectors" in out.output
    info = OnnxEncoder(tmp_path / "raw.onnx").info
    assert (info.distance, info.scale) == ("euclid", "raw")
