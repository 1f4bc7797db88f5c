"""What an adversarial review of stop 31 broke (a team with its own collections), now held."""

from __future__ import annotations

import json

import qdrant_edge as qe
from click.testing import CliRunner

from rm_qdrant import OnnxEncoder, open_store
from rm_qdrant.cli import cli
from rm_qdrant.store.tuning import edge_thresholds
from tests.conftest import OLD_DIM, one_error_line
from tests.evaluation import test_eval_probe_ends as ends
from tests.operations.test_adopt import team_rows

pairs = ends.pairs  # the fixture: pairs 'rm' and 'naive' over the same images, the plain new model


def _team_shard(folder, models, tmp_path):
    """A team's qdrant-edge collection 'products': its own vectors 'image' (searched) and 'text'."""
    items, vectors, payloads = team_rows(models, tmp_path)
    path = folder / "collections" / "products" / "shard"
    path.parent.mkdir(parents=True)
    config = qe.EdgeConfig(
        vectors={
            "image": qe.EdgeVectorParams(size=OLD_DIM, distance=qe.Distance.Cosine),
            "text": qe.EdgeVectorParams(size=3, distance=qe.Distance.Dot),
        }
    )
    shard = qe.EdgeShard.create(str(path), config)
    points = [
        qe.Point(k, {"image": v.tolist(), "text": [1.0, 2.0, 3.0]}, p)
        for k, (v, p) in enumerate(zip(vectors, payloads))
    ]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.close()
    return items, path / "edge_config.json"


def _init_single(folder, models, *extra):
    args = ["init", "--name", "p", "--collection", "products", "--mode", "single-collection"]
    args += [
        "--new-vector",
        "newv",
        "--old-vector",
        "image",
        "--encoder",
        str(models.rm),
        "--uri-field",
        "image_url",
    ]
    return CliRunner().invoke(cli, ["--qdrant", str(folder), *args, *map(str, extra)])


def test_a_full_scan_kb_qdrant_cannot_read_is_refused_and_the_team_collection_still_opens(models, tmp_path):
    folder = tmp_path / "team"
    items, _ = _team_shard(folder, models, tmp_path)
    line = one_error_line(_init_single(folder, models, "--full-scan-kb", "99999999999999999999"))
    assert "full" in line.lower()  # names the bad option, not a Rust deserializer
    with open_store(folder, create=False) as store:  # before: "cannot open collection 'products'"
        assert store.count("products") == len(items)
        assert "newv" not in {
            o.name for o in store.collection("products", "image").extra
        }  # nothing half-written


def test_drop_pair_leaves_the_team_collection_with_the_threshold_it_had(models, tmp_path):
    folder = tmp_path / "team"
    _, config = _team_shard(folder, models, tmp_path)
    before = edge_thresholds(json.loads(config.read_text()))
    assert _init_single(folder, models).exit_code == 0
    dropped = CliRunner().invoke(cli, ["--qdrant", str(folder), "drop-pair", "p"])
    assert dropped.exit_code == 0 and "'products' kept" in dropped.output
    assert edge_thresholds(json.loads(config.read_text()))["image"] == before["image"]  # 1000, was 10000


def test_eval_refuses_an_rm_graph_as_the_plain_new_model(rmq, pairs, tmp_path):
    images, _ = pairs
    args = (
        "eval",
        "--name",
        "rm",
        "--queries",
        images,
        "--at",
        "0,1",
        "--new-model",
        tmp_path / "graph.onnx",
    )
    assert "rev" in one_error_line(rmq(*args, ok=False))  # as init and switch-encoder say


def test_probe_refuses_a_plain_new_model_of_another_size(rmq, pairs, tmp_path):
    args = ("probe", "--name", "rm", "--sample", "24", "--k", "3", "--new-model", tmp_path / "old.onnx")
    assert f"{OLD_DIM}-d" in one_error_line(rmq(*args, ok=False))  # as init and switch-encoder say
    assert OnnxEncoder(tmp_path / "old.onnx").info.outputs["embedding"] == OLD_DIM
