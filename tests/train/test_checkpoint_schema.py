"""A checkpoint whose facts have the wrong type or value is one clear line, and an export
whose graph gives NaN writes nothing.

Each bad file is a real checkpoint (saved by the training code) with one field edited, run
through the real ``rmq`` command (in this process: a subprocess per case spent most of the
file's time importing PyTorch; tests/train/test_checkpoint_safety.py runs rmq as a process).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from rm_qdrant.cli import cli
from rm_qdrant_exporters.serving import export_backbone
from rm_qdrant_train.backbone import load_backbone, save_backbone
from rm_qdrant_train.backbones import build_backbone
from rm_qdrant_train.checkpoints import load_checkpoint
from rm_qdrant_train.config import BackboneConfig, HeadsConfig
from rm_qdrant_train.heads import Heads, save_heads

NAN = float("nan")


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    """A real 16-d small-CNN backbone checkpoint and 12-d heads for it."""
    folder = tmp_path_factory.mktemp("good")
    torch.manual_seed(0)
    model = build_backbone("small-cnn", num_classes=4, embed_dim=16).eval()
    cfg = BackboneConfig(out=str(folder / "new.pt"), embed_dim=16)
    new = save_backbone(model, cfg, ["ant", "bee", "cat", "dog"], epoch=0, metric={})
    heads_cfg = HeadsConfig(old=str(new), new=str(new), out=str(folder / "heads.pt"), hidden=32)
    heads = save_heads(Heads(16, 12, hidden=32).eval(), heads_cfg, epoch=0, loss=0.0)
    return {"backbone": new, "heads": heads}


def edited(source: Path, target: Path, **fields) -> Path:
    """``source`` with ``fields`` replaced (a value of ``...`` removes the field)."""
    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    for name, value in fields.items():
        if value is ...:
            del checkpoint[name]
        else:
            checkpoint[name] = value
    torch.save(checkpoint, target)
    return target


def _rmq(cwd: Path, *args: str) -> Result:
    """``rmq -q ARGS`` run from ``cwd``: quiet, so progress lines do not mix with the error."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, ["-q", *map(str, args)])
    finally:
        os.chdir(before)


def _one_error_line(done: Result, *words: str) -> str:
    assert done.exit_code == 1, (done.exit_code, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# The files the adversarial tester reported (issue 22, item 1's follow-up), through the real CLI.
BAD_BACKBONES = {
    "classes-int": ("classes", {"classes": 7}),
    "embed-dim-negative": ("embed_dim", {"embed_dim": -1}),
    "embed-dim-float": ("embed_dim", {"embed_dim": 16.0}),
    "embed-dim-str": ("embed_dim", {"embed_dim": "16"}),
    "image-size-str": ("image_size", {"image_size": "32"}),
    "mean-one-value": ("mean", {"mean": (0.5,)}),
    "mean-str": ("mean", {"mean": "0.5,0.5,0.5"}),
    "mean-nan": ("mean", {"mean": (NAN, 0.5, 0.5)}),
    "std-zero": ("std", {"std": (0.0, 0.25, 0.25)}),
}


@pytest.mark.parametrize("field,fields", BAD_BACKBONES.values(), ids=BAD_BACKBONES.keys())
def test_a_backbone_with_a_bad_field_is_one_line_on_export(good, tmp_path, field, fields):
    bad = edited(good["backbone"], tmp_path / "bad.pt", **fields)
    done = _rmq(tmp_path, "export", "--new", bad, "--out", "x.onnx")
    _one_error_line(done, "bad.pt", repr(field))
    assert not list(tmp_path.glob("*.onnx*")), "a graph was written"


BAD_HEADS = {
    "config-without-loss": ("config.loss", {"config": {"old": "a", "new": "b"}}),
    "config-str": ("config", {"config": "x"}),
    "rho-blocks-str": ("rho_blocks", {"rho_blocks": "x"}),
    "d-new-str": ("d_new", {"d_new": "x"}),
    "d-old-negative": ("d_old", {"d_old": -5}),
}


@pytest.mark.slow
@pytest.mark.parametrize("field,fields", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_heads_with_a_bad_field_are_one_line_on_export(good, tmp_path, field, fields):
    bad = edited(good["heads"], tmp_path / "bad_heads.pt", **fields)
    done = _rmq(tmp_path, "export", "--new", good["backbone"], "--heads", bad, "--out", "x.onnx")
    _one_error_line(done, "bad_heads.pt", repr(field))
    assert not list(tmp_path.glob("*.onnx*")), "a graph was written"


def test_heads_with_a_bad_field_are_one_line_on_a_team_graph_too(good, tmp_path):
    team, _ = export_backbone(good["backbone"], tmp_path / "team.onnx", role="new", scores=False)
    bad = edited(good["heads"], tmp_path / "bad_heads.pt", d_old=-5)
    done = _rmq(tmp_path, "export", "--new-onnx", team, "--heads", bad, "--out", "x.onnx")
    _one_error_line(done, "bad_heads.pt", "'d_old'")
    assert not (tmp_path / "x.onnx").exists()


TRAIN_COMMANDS = {
    name: line.split()
    for name, line in {
        "heads-old": "train heads -q --old {bad} --new {good} --data data --out out.pt",
        "heads-new": "train heads -q --old {good} --new {bad} --data data --out out.pt",
        "adapter": "train adapter -q --old {bad} --new {good} --data data --out out.pt",
        "fct": "train baseline -q --method fct --old {bad} --new {good} --data data --out out.pt "
        "--set side_info=false",
        "bct": "train baseline -q --method bct --old {bad} --data data --out out.pt",
        "bict": "train baseline -q --method bict --old {good} --new {bad} --data data --out out.pt",
    }.items()
}


@pytest.mark.parametrize(
    "args,field,fields",
    [
        (TRAIN_COMMANDS["heads-old"], "embed_dim", {"embed_dim": -1}),
        (TRAIN_COMMANDS["heads-new"], "classes", {"classes": 7}),
        (TRAIN_COMMANDS["adapter"], "mean", {"mean": (0.5,)}),
        (TRAIN_COMMANDS["fct"], "embed_dim", {"embed_dim": "16"}),
        (TRAIN_COMMANDS["bct"], "embed_dim", {"embed_dim": 16.0}),
        (TRAIN_COMMANDS["bict"], "config", {"config": "x"}),
    ],
    ids=["heads-old", "heads-new", "adapter", "fct", "bct", "bict"],
)
def test_training_on_a_bad_backbone_is_one_line(good, tiny_folder, tmp_path, args, field, fields):
    bad = edited(good["backbone"], tmp_path / "bad.pt", **fields)
    filled = [a.replace("{bad}", str(bad)).replace("{good}", str(good["backbone"])) for a in args]
    done = _rmq(tmp_path, *filled)
    _one_error_line(done, "bad.pt", repr(field))
    assert not (tmp_path / "out.pt").exists()


def _poisoned(source: Path, target: Path) -> Path:
    """``source`` with every floating-point weight NaN: facts fine, weights broken."""
    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    weights = checkpoint["state_dict"]
    checkpoint["state_dict"] = {k: v.fill_(NAN) if v.is_floating_point() else v for k, v in weights.items()}
    torch.save(checkpoint, target)
    return target


@pytest.mark.parametrize("what", ["backbone", "heads", "old"])
def test_an_export_that_gives_nan_writes_nothing(good, tmp_path, what):
    nan = _poisoned(good["backbone" if what == "old" else what], tmp_path / "nan.pt")
    args = {
        "backbone": ["--new", nan, "--out", "nan.onnx"],
        "heads": ["--new", good["backbone"], "--heads", nan, "--out", "nan.onnx"],
        "old": ["--old", nan, "--out-old", "nan.onnx"],
    }[what]
    done = _rmq(tmp_path, "export", *args)
    line = _one_error_line(done, "NaN or infinity", "nothing written")
    assert "wrote" not in done.stdout, line
    assert not list(tmp_path.glob("*.onnx*")), "a graph of NaNs was written"


def test_nan_heads_on_a_team_graph_write_nothing(good, tmp_path):
    team, _ = export_backbone(good["backbone"], tmp_path / "team.onnx", role="new", scores=False)
    nan = _poisoned(good["heads"], tmp_path / "nan.pt")
    done = _rmq(tmp_path, "export", "--new-onnx", team, "--heads", nan, "--out", "nan.onnx")
    _one_error_line(done, "NaN or infinity", "nothing written")
    assert not list(tmp_path.glob("nan.onnx*"))


def test_the_schema_names_the_file_and_the_field(good, tmp_path):
    bad = edited(good["heads"], tmp_path / "h.pt", d_old=-5)
    with pytest.raises(ValueError, match=r"h\.pt.*'d_old'.*-5"):
        load_checkpoint(bad, "heads")
    missing = edited(good["heads"], tmp_path / "m.pt", config={"hidden": 32})
    with pytest.raises(ValueError, match=r"m\.pt.*lacks 'config\.loss'"):
        load_checkpoint(missing, "heads")
    # A good checkpoint's facts come back as they were saved.
    assert load_checkpoint(good["backbone"], "backbone")["classes"] == ["ant", "bee", "cat", "dog"]


# More of each kind's table, in process (the CLI paths above show how a ValueError reaches the user).
MORE_BAD = {
    "classes-not-strings": ("backbone", "classes", {"classes": [1, 2, 3, 4]}),
    "classes-empty": ("backbone", "classes", {"classes": []}),
    "embed-dim-bool": ("backbone", "embed_dim", {"embed_dim": True}),
    "embed-dim-huge": ("backbone", "embed_dim", {"embed_dim": 10**9}),
    "image-size-zero": ("backbone", "image_size", {"image_size": 0}),
    "mean-inf": ("backbone", "mean", {"mean": (float("inf"), 0.5, 0.5)}),
    "mean-four": ("backbone", "mean", {"mean": (0.5, 0.5, 0.5, 0.5)}),
    "std-negative": ("backbone", "std", {"std": (-0.25, 0.25, 0.25)}),
    "std-nan": ("backbone", "std", {"std": (NAN, 0.25, 0.25)}),
    "std-missing": ("backbone", "std", {"std": ...}),
    "arch-int": ("backbone", "arch", {"arch": 7}),
    "config-str": ("backbone", "config", {"config": "x"}),
    "state-dict-str": ("backbone", "state_dict", {"state_dict": "x"}),
    "psi-blocks-nine": ("heads", "psi_blocks", {"psi_blocks": 9}),
    "hidden-huge": ("heads", "hidden", {"hidden": 10**12}),
    "learn-rho-str": ("heads", "learn_rho", {"learn_rho": "yes"}),
    "loss-int": ("heads", "config.loss", {"config": {"loss": 3}}),
}


@pytest.mark.parametrize("kind,field,fields", MORE_BAD.values(), ids=MORE_BAD.keys())
def test_each_field_of_the_table_is_checked(good, tmp_path, kind, field, fields):
    bad = edited(good[kind], tmp_path / "bad.pt", **fields)
    with pytest.raises(ValueError, match=rf"bad\.pt.*'{field}'") as caught:
        load_checkpoint(bad, kind)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_facts_that_fit_the_table_but_not_the_weights_allocate_nothing(good, tmp_path):
    # 65,536-d embeddings for 1,000,000 classes: 256 GB of classifier, were it built before the check.
    bad = edited(good["backbone"], tmp_path / "big.pt", embed_dim=1 << 16, classes=["c"] * 1_000_000)
    with pytest.raises(ValueError, match=r"big\.pt: its weights do not fit the model it describes"):
        load_backbone(bad)
    with pytest.raises(ValueError, match=r"big\.pt: unknown arch 'alexnet'"):
        load_backbone(edited(good["backbone"], tmp_path / "big.pt", arch="alexnet"))
