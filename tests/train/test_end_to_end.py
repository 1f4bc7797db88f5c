"""A tiny run end to end: backbones, heads, adapter; checkpoints load back to the same model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from rm_qdrant.cli import cli
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant_train.adapter_job import load_adapter
from rm_qdrant_train.backbone import embed, load_backbone, save_backbone
from rm_qdrant_train.backbones import build_backbone
from rm_qdrant_train.cache import embeddings
from rm_qdrant_train.config import BackboneConfig
from rm_qdrant_train.data import load_image_folder, to_tensor
from rm_qdrant_train.heads import load_heads

pytestmark = pytest.mark.slow


def rmq_train(*args):
    result = CliRunner().invoke(cli, ["train", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


def test_checkpoint_gives_back_the_same_embeddings(tiny_folder, tmp_path):
    model = build_backbone("small-cnn", num_classes=4, embed_dim=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    images = load_image_folder(tiny_folder / "train").images[:32]
    for _ in range(3):  # move the weights and BatchNorm statistics off their initial values
        loss = model(to_tensor(images))[1].logsumexp(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    cfg = BackboneConfig(out=str(tmp_path / "m.pt"), embed_dim=16)
    path = save_backbone(model, cfg, ["ant", "bee", "cat", "dog"], epoch=3, metric={"top1": 0.5})
    loaded, meta = load_backbone(path)
    before, _ = embed(model, images, device=torch.device("cpu"))
    after, _ = embed(loaded, images, device=torch.device("cpu"))
    assert torch.equal(before, after)
    assert meta["classes"] == ["ant", "bee", "cat", "dog"] and meta["metric"] == {"top1": 0.5}


def train_tiny(folder, *, new_arch: str = "small-cnn", new_dim: int = 16) -> str:
    """Old (small CNN, 16-d) and new backbones (1 epoch) and MCL heads (2 epochs) under runs/; returns the
    heads report."""
    common = ["--data", folder, "--epochs", "1", "--set", "batch=32"]
    rmq_train("backbone", "--role", "old", "--out", "runs/old.pt", *common, "--set", "embed_dim=16")
    new = ["--arch", new_arch, "--set", f"embed_dim={new_dim}"]
    rmq_train("backbone", "--role", "new", "--out", "runs/new.pt", *common, *new)
    heads = ["--old", "runs/old.pt", "--new", "runs/new.pt", "--data", folder, "--loss", "mcl"]
    return rmq_train("heads", *heads, "--epochs", "2", "--set", "batch=32", "--out", "runs/heads.pt")


def test_tiny_run_through_the_cli(tiny_folder):
    out = train_tiny(tiny_folder)
    old_model, old_meta = load_backbone("runs/old.pt")
    assert old_meta["classes"] == ["ant", "bee"] and 0.0 <= old_meta["metric"]["top1"] <= 1.0
    report = json.loads(out.strip().splitlines()[-1])
    assert len(report["loss"]) == 2 and report["config"]["loss"] == "mcl"
    heads, meta = load_heads("runs/heads.pt")
    assert (meta["d_new"], meta["d_old"]) == (16, 16)

    rmq_train(
        "adapter",
        "--old",
        "runs/old.pt",
        "--new",
        "runs/new.pt",
        "--data",
        tiny_folder,
        "--kind",
        "procrustes",
        "--out",
        "runs/procrustes.pt",
    )
    adapter, _ = load_adapter("runs/procrustes.pt")
    # The cache serves the same embeddings the checkpoint computes.
    cached = embeddings("runs/new.pt", tiny_folder / "test")
    direct, _ = embed(
        load_backbone("runs/new.pt")[0],
        load_image_folder(tiny_folder / "test").images,
        device=torch.device("cpu"),
    )
    np.testing.assert_allclose(cached.emb, direct.numpy(), atol=1e-6)
    with torch.no_grad():
        assert adapter(torch.from_numpy(cached.emb)).shape == (32, 16)
        assert heads(torch.from_numpy(cached.emb))[1].shape == (32, 16)


@pytest.mark.parametrize(
    ("new_arch", "new_dim"), [("small-cnn", 16), ("resnet18", 24)], ids=["same", "heterogeneous"]
)
def test_trained_models_serve_through_rmq(tiny_folder, tmp_path, monkeypatch, new_arch, new_dim):
    """The whole product path: train, export, index with the old model, pair, probe, migrate, search.

    The heterogeneous case upgrades a 16-d small CNN to a 24-d ResNet-18: ψ maps 24 → 16, the
    graph's ``rev`` output fills the 16-d old collection's queries and ``new`` the 24-d new one.
    """
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train_tiny(tiny_folder, new_arch=new_arch, new_dim=new_dim)
    runner = CliRunner()

    def rmq(*args):
        result = runner.invoke(cli, ["--qdrant", str(tmp_path / "q"), *map(str, args)])
        assert result.exit_code == 0, result.output
        return result.output

    report = json.loads(
        rmq(
            "export",
            "--new",
            "runs/new.pt",
            "--heads",
            "runs/heads.pt",
            "--out",
            "model.onnx",
            "--old",
            "runs/old.pt",
            "--out-old",
            "old.onnx",
            "--json",
        )
    )
    assert report["model"]["max_abs_diff"] <= 1e-4 and report["old"]["max_abs_diff"] <= 1e-4
    assert OnnxEncoder("model.onnx").info.outputs == {"new": new_dim, "rev": 16}
    rmq("index", "--collection", "gallery", "--data", tiny_folder / "test", "--encoder", "old.onnx")
    rmq("init", "--name", "p", "--old-collection", "gallery", "--encoder", "model.onnx")
    probe = json.loads(rmq("probe", "--name", "p", "--k", "5", "--json"))
    assert [f["mode"] for f in probe["forecasts"]] == ["no-psi", "rm"] and probe["sample"] == 32
    rmq("migrate", "--name", "p", "--until", "0.5", "--order", "confidence")
    status = json.loads(rmq("status", "--name", "p", "--json"))
    assert (status["old_count"], status["new_count"]) == (16, 16) and status["estimate"]["mode"] == "rm"
    query = sorted((tiny_folder / "test" / "cat").glob("*.png"))[0]
    hits = json.loads(rmq("search", "--name", "p", query, "--limit", "32", "--exact", "--json"))
    assert len({h["id"] for h in hits}) == 32 and {h["source"] for h in hits} == {"old", "new"}


def test_bad_settings_are_one_clear_error(tiny_folder):
    result = CliRunner().invoke(cli, ["train", "backbone", "--data", tiny_folder, "--set", "colour=blue"])
    assert result.exit_code == 1 and "unknown setting(s) colour for BackboneConfig" in result.output


def test_demo_on_a_given_folder(tiny_folder, tmp_path):
    """`rmq demo --data DIR`: both query modes served at the 11 fractions, from old to new."""
    result = CliRunner().invoke(
        cli, ["demo", "--data", str(tiny_folder), "--out", str(tmp_path / "demo"), "--epochs", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [row["t"] for row in report["rows"]] == [i / 10 for i in range(11)]
    assert all(0.0 <= row["rm_map"] <= 1.0 and 0.0 <= row["naive_map"] <= 1.0 for row in report["rows"])
    assert (tmp_path / "demo" / "model.onnx").is_file() and (tmp_path / "demo" / "curves.png").is_file()
