"""Exported graphs: parity with PyTorch, loaded by rm_qdrant's encoder, composed with an ONNX backbone."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from rm_qdrant import InputSpec, OnnxEncoder
from rm_qdrant.cli import cli
from rm_qdrant.models.stamp import stamp_model
from rm_qdrant_exporters.compose import attach_heads
from rm_qdrant_exporters.linear import linear_encoder
from rm_qdrant_exporters.serving import ExportError, export_backbone, export_serving
from rm_qdrant_train.backbone import load_backbone, save_backbone
from rm_qdrant_train.backbones import build_backbone
from rm_qdrant_train.config import BackboneConfig, HeadsConfig
from rm_qdrant_train.data import load_image_folder, to_tensor
from rm_qdrant_train.heads import Heads, load_heads, save_heads


def checkpoints(tmp_path, arch, *, embed_dim=16, d_old=12):
    torch.manual_seed(0)
    model = build_backbone(arch, num_classes=5, embed_dim=embed_dim).eval()
    new = save_backbone(
        model,
        BackboneConfig(out=str(tmp_path / f"{arch}.pt"), arch=arch, embed_dim=embed_dim),
        list("abcde"),
        epoch=0,
        metric={},
    )
    heads = Heads(embed_dim, d_old, hidden=32).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for bn in (m for m in heads.modules() if isinstance(m, torch.nn.BatchNorm1d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    cfg = HeadsConfig(old=str(new), new=str(new), out=str(tmp_path / f"heads-{arch}.pt"), hidden=32)
    return new, save_heads(heads, cfg, epoch=0, loss=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["small-cnn", "resnet18"])
def test_parity_with_pytorch_at_batch_1_and_7(tmp_path, arch):
    new, heads = checkpoints(tmp_path, arch)
    path, worst = export_serving(new, heads, tmp_path / "model.onnx")
    assert worst <= 1e-4
    encoder = OnnxEncoder(path)
    assert encoder.info.query_modes == ("rm",) and encoder.info.outputs == {"new": 16, "rev": 12}


def test_encoder_gives_what_train_computes(tmp_path, tiny_folder):
    new, heads = checkpoints(tmp_path, "small-cnn")
    path, _ = export_serving(new, heads, tmp_path / "model.onnx")
    data = load_image_folder(tiny_folder / "test")
    backbone, _ = load_backbone(new)
    head_model, _ = load_heads(heads)
    with torch.no_grad():
        embedding, _ = backbone(to_tensor(data.images))
        expected_new, expected_rev = (F.normalize(t, dim=1).numpy() for t in head_model(embedding))
    got = OnnxEncoder(path).encode(list(data.paths))
    np.testing.assert_allclose(got["new"], expected_new, atol=1e-4)
    np.testing.assert_allclose(got["rev"], expected_rev, atol=1e-4)


def test_old_model_export_with_scores(tmp_path):
    old, _ = checkpoints(tmp_path, "small-cnn")
    path, worst = export_backbone(old, tmp_path / "old.onnx")
    info = OnnxEncoder(path).info
    assert worst <= 1e-4 and info.outputs == {"embedding": 16, "scores": 5}


def test_heads_attached_to_an_onnx_backbone(tmp_path):
    spec = InputSpec(8, 8, 3)
    weights = np.random.default_rng(1).normal(size=(192, 16))
    backbone = linear_encoder(
        tmp_path / "theirs.onnx", [("embedding", "pixels", weights)], input_spec=spec, name="theirs"
    )
    _, heads = checkpoints(tmp_path, "small-cnn")
    path, worst = attach_heads(backbone, heads, tmp_path / "composed.onnx")
    encoder = OnnxEncoder(path)
    assert worst <= 1e-4 and encoder.info.outputs == {"new": 16, "rev": 12}
    image = np.random.default_rng(2).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    head_model, _ = load_heads(heads)
    with torch.no_grad():
        phi = torch.from_numpy((image.reshape(1, -1) / 255.0 @ weights).astype(np.float32))
        expected = F.normalize(head_model(phi)[1], dim=1).numpy()
    np.testing.assert_allclose(encoder.encode(image)["rev"], expected, atol=1e-4)


def test_bad_exports_are_clear_errors(tmp_path):
    _, heads = checkpoints(tmp_path, "small-cnn")
    other_new, _ = checkpoints(tmp_path, "resnet18", embed_dim=24)
    with pytest.raises(ExportError, match="expects 16-d backbone embeddings"):
        export_serving(other_new, heads, tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="not an rm-qdrant backbone checkpoint"):
        export_serving(heads, heads, tmp_path / "m.onnx")
    spec = InputSpec(8, 8, 3)
    two = linear_encoder(
        tmp_path / "two.onnx",
        [("embedding", "pixels", np.ones((192, 16))), ("scores", "embedding", np.ones((16, 3)))],
        input_spec=spec,
        name="two",
    )
    # The stamped 'embedding' role says which output the heads read; --output-name overrides it.
    _, worst = attach_heads(two, heads, tmp_path / "c.onnx")
    assert worst <= 1e-4
    with pytest.raises(ExportError, match="is 3-d"):
        attach_heads(two, heads, tmp_path / "c.onnx", output_name="scores")
    with pytest.raises(ExportError, match="has no output 'nope'"):
        attach_heads(two, heads, tmp_path / "c.onnx", output_name="nope")


def test_an_unstamped_backbone_is_refused(tmp_path):
    theirs = linear_encoder(
        tmp_path / "theirs.onnx",
        [("embedding", "pixels", np.ones((192, 16)))],
        input_spec=InputSpec(8, 8, 3),
        name="t",
    )
    model = onnx.load(str(theirs))
    del model.metadata_props[:]
    onnx.save(model, str(theirs))
    _, heads = checkpoints(tmp_path, "small-cnn")
    with pytest.raises(
        ExportError, match="has no rm_qdrant metadata: describe it first with 'rmq model stamp'"
    ):
        attach_heads(theirs, heads, tmp_path / "c.onnx")
    runner = CliRunner()
    base = ["export", "--new-onnx", str(theirs), "--heads", str(heads), "--out", str(tmp_path / "c.onnx")]
    for extra, message in [
        ([], "describe it first with 'rmq model stamp'"),
        (["--input-size", "8"], "are gone"),
    ]:
        result = runner.invoke(cli, [*base, *extra])
        assert result.exit_code == 1 and result.output.count("\n") == 1 and message in result.output
    assert not (tmp_path / "c.onnx").exists()


def test_heads_on_a_stamped_team_graph_keep_its_preprocessing(tmp_path):
    """A team's float32 graph (ImageNet normalisation, resize + crop, output 'image_embeds'), stamped, then
    composed: the composed graph serves exactly heads(φ) of what the stamped backbone serves."""
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 7 * 7, 16),
    ).eval()
    team = tmp_path / "team.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.zeros(1, 3, 16, 16),), str(team), input_names=["pixel_values"],
            output_names=["image_embeds"], dynamic_axes={"pixel_values": {0: "b"}, "image_embeds": {0: "b"}},
            dynamo=False,
        )  # fmt: skip
    # Stamped cosine, scale unstated: the composed heads are L2-normalised, as they always were.
    stamped = stamp_model(
        team, tmp_path / "stamped.onnx", outputs={"embedding": "image_embeds"}, size=16, resize=20, crop=16,
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), distance="cosine",
    ).out  # fmt: skip
    _, heads = checkpoints(tmp_path, "small-cnn")
    path, worst = attach_heads(stamped, heads, tmp_path / "composed.onnx")
    composed, backbone = OnnxEncoder(path), OnnxEncoder(stamped)
    assert worst <= 1e-4 and composed.info.input == backbone.info.input
    rng = np.random.default_rng(4)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in [(30, 22), (17, 40), (16, 16)]]
    head_model, _ = load_heads(heads)
    with torch.no_grad():
        phi = torch.from_numpy(backbone.encode(images)["embedding"])
        expected = [F.normalize(t, dim=1).numpy() for t in head_model(phi)]
    got = composed.encode(images)
    np.testing.assert_allclose(got["new"], expected[0], atol=1e-4)
    np.testing.assert_allclose(got["rev"], expected[1], atol=1e-4)


def test_the_plain_new_model_exports_without_heads_named_as_new(tmp_path):
    new, _ = checkpoints(tmp_path, "small-cnn")
    result = CliRunner().invoke(cli, ["export", "--new", str(new), "--out", str(tmp_path / "new.onnx")])
    assert result.exit_code == 0, result.output
    encoder = OnnxEncoder(tmp_path / "new.onnx")
    assert encoder.info.name == "small-cnn-new" and encoder.info.outputs == {"embedding": 16}
    plain, _ = export_backbone(new, tmp_path / "old.onnx", scores=False)
    assert OnnxEncoder(plain).info.name == "small-cnn-old"
    result = CliRunner().invoke(cli, ["export", "--new-onnx", str(tmp_path / "new.onnx"), "--out", "x.onnx"])
    assert result.exit_code == 1 and "--new-onnx needs --heads" in result.output
