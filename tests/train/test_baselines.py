"""BCT, FCT, BiCT and RACT on tiny images: each trains, its loss falls, it serves the right vectors."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rm_qdrant_train.backbone import _influence_head, ract_loss, train_backbone
from rm_qdrant_train.baselines import (
    METHODS,
    BaselineConfig,
    baseline_embeddings,
    side_embeddings,
    train_baseline,
    train_side_info,
    train_transformation,
)
from rm_qdrant_train.cache import embeddings
from rm_qdrant_train.config import BackboneConfig, load_config
from rm_qdrant_train.data import load_image_folder

CLASSES = ("ant", "bee", "cat", "dog")
TINY = {"arch": "small-cnn", "epochs": 1, "batch": 16, "device": "cpu"}


@dataclass(frozen=True)
class World:
    data: Path
    test: Path
    old: Path  # 16-d, trained on the first two classes
    new: Path  # 24-d, trained on all four, no compatibility


def write_folder(root: Path) -> Path:
    """data/{train,test}/<class>/NNN.png: 32x32 colored noise, a colour and a bright band per class."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("test", 6)):
        for k, label in enumerate(CLASSES):
            base = np.zeros((32, 32, 3), dtype=np.int16)
            base[..., k % 3] = 170 if k < 3 else 90
            base[: 8 * (k + 1)] += 60
            for i in range(count):
                pixels = np.clip(base + rng.integers(-50, 50, size=base.shape), 0, 255).astype(np.uint8)
                target = root / split / label / f"{i:03d}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(target)
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """Old and new backbones trained once; the module's tests run inside the temporary folder (caches)."""
    root = tmp_path_factory.mktemp("baselines")
    data = write_folder(root / "data")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: more threads only spin
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        old = train_backbone(
            BackboneConfig(data=str(data), out="runs/old.pt", role="old", embed_dim=16, **TINY)
        )
        new = train_backbone(BackboneConfig(data=str(data), out="runs/new.pt", embed_dim=24, **TINY))
        yield World(data, data / "test", old, new)
    torch.set_num_threads(threads)


def config(world: World, out: str, **settings) -> BaselineConfig:
    values = {"data": str(world.data), "old": str(world.old), "new": str(world.new), "device": "cpu"}
    values.update(blocks=2, hidden=64, epochs=15, batch=16, side_dim=8, side_epochs=4)
    return BaselineConfig(out=out, **{**values, **settings})


def test_ract_loss_matches_its_formula_and_falls_while_training():
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 0, 1, 2, 1, 2])
    old = torch.randn(6, 8, generator=g)
    new = torch.randn(6, 8, generator=g)

    def cos(a, b):
        return float(torch.nn.functional.cosine_similarity(a, b, dim=0))

    expected = 0.0
    for i in range(6):
        pos = np.exp(cos(new[i], old[i]) / 0.1)
        negs = sum(
            np.exp(cos(new[i], old[j]) / 0.1) + np.exp(cos(new[i], new[j]) / 0.1)
            for j in range(6)
            if labels[j] != labels[i]
        )
        expected -= np.log(pos / (pos + negs)) / 6
    assert ract_loss(new, old, labels, temperature=0.1).item() == pytest.approx(expected, rel=1e-5)

    net = torch.nn.Linear(8, 8)
    inputs = torch.randn(6, 8, generator=g)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        value = ract_loss(net(inputs), old, labels)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["bct", "ract"])
def test_backward_compatible_methods_serve_old_vectors_until_migrated(world: World, method: str):
    cfg = config(world, f"runs/{method}.pt", backbone={**TINY, "embed_dim": 16})
    trained = train_baseline(method, cfg)
    stored = torch.load(trained, map_location="cpu", weights_only=True)
    assert stored["config"]["influence" if method == "bct" else "compat_old"] == str(world.old)

    e = baseline_embeddings(method, world.test, old=world.old, new=trained, device="cpu")
    n = len(e.labels)
    assert n == 24 and all(
        a.shape == (n, 16) for a in (e.query_new, e.query_old, e.gallery_new, e.gallery_old)
    )
    # New queries go straight against the old vectors: that is what backward compatibility buys.
    assert np.array_equal(e.query_old, e.query_new)
    assert np.array_equal(e.gallery_old, embeddings(world.old, world.test, device="cpu").emb)
    half = np.arange(n) % 2 == 0
    assert 0.0 <= e.retrieval(half).map <= 1.0


def test_backward_compatible_methods_refuse_embeddings_of_another_size(world: World):
    for method in ("bct", "ract"):
        with pytest.raises(ValueError, match="old embeds to 16, new to 24"):
            train_baseline(method, config(world, "runs/x.pt", backbone={**TINY, "embed_dim": 24}))
        with pytest.raises(ValueError, match="old embeds to 16, new to 24"):
            baseline_embeddings(method, world.test, old=world.old, new=world.new, device="cpu")
    direct = BackboneConfig(data=str(world.data), out="runs/x.pt", embed_dim=24, compat="ract", **TINY)
    with pytest.raises(ValueError, match="old embeds to 16, new to 24"):
        train_backbone(replace(direct, compat_old=str(world.old)))
    assert not Path("runs/x.pt").exists()


def test_side_info_autoencoder_learns_without_labels(world: World):
    cfg = config(world, "runs/unused.pt", side="runs/side-ae.pt")
    path, history = train_side_info(cfg)
    assert len(history) == 4 and history[-1] < history[0]
    side = side_embeddings(path, world.test, device="cpu")
    assert side.shape == (24, 8) and np.isfinite(side).all()
    assert np.array_equal(side_embeddings(path, world.test, device="cpu"), side)  # served from the cache


@pytest.mark.slow
def test_fct_maps_the_whole_old_gallery_into_the_new_space(world: World):
    cfg = config(world, "runs/fct.pt", side="runs/side-fct.pt")
    assert not Path(cfg.side).exists()
    path = train_baseline("fct", cfg)
    assert Path(cfg.side).is_file()  # the label-free side-info model was trained on the way

    _, history = train_transformation(config(world, "runs/fct-again.pt"), side=cfg.side)
    assert history[-1] < 0.5 * history[0]

    e = baseline_embeddings(
        "fct", world.test, old=world.old, new=world.new, transformation=path, device="cpu"
    )
    assert all(a.shape == (24, 24) for a in (e.query_new, e.query_old, e.gallery_new, e.gallery_old))
    assert not np.array_equal(e.gallery_old, e.gallery_new)
    assert 0.0 <= e.retrieval(np.zeros(24, dtype=bool)).top1 <= 1.0
    # h belongs to one pair of backbones; serving it with another would mix spaces.
    with pytest.raises(ValueError, match="other backbones"):
        baseline_embeddings(
            "fct", world.test, old=world.new, new=world.new, transformation=path, device="cpu"
        )
    with pytest.raises(ValueError, match="needs the transformation"):
        baseline_embeddings("fct", world.test, old=world.old, new=world.new, device="cpu")


def test_bict_transforms_the_old_gallery_into_a_backward_compatible_space(world: World):
    with pytest.raises(ValueError, match="backward-compatible"):
        train_baseline("bict", config(world, "runs/bict.pt"))
    bct = train_baseline("bct", config(world, "runs/bct-for-bict.pt", backbone={**TINY, "embed_dim": 16}))
    path = train_baseline("bict", config(world, "runs/bict.pt", new=str(bct)))
    stored = torch.load(path, map_location="cpu", weights_only=True)
    assert stored["side"] == "" and stored["d_in"] == 16  # φ_old alone

    e = baseline_embeddings("bict", world.test, old=world.old, new=bct, transformation=path, device="cpu")
    assert all(a.shape == (24, 16) for a in (e.query_new, e.query_old, e.gallery_new, e.gallery_old))
    assert not np.array_equal(e.gallery_old, embeddings(world.old, world.test, device="cpu").emb)


def test_unknown_method_and_config_from_yaml(world: World, tmp_path: Path):
    assert METHODS == ("bct", "fct", "bict", "ract")
    with pytest.raises(ValueError, match="unknown baseline 'lce'"):
        train_baseline("lce", config(world, "runs/x.pt"))
    with pytest.raises(ValueError, match="unknown baseline 'lce'"):
        baseline_embeddings("lce", world.test, old=world.old, new=world.new, device="cpu")
    yaml_file = tmp_path / "bct.yaml"
    yaml_file.write_text("old: runs/old.pt\nbackbone:\n  arch: resnet18\n  epochs: 30\nhidden: 256\n")
    cfg = load_config(BaselineConfig, yaml_file, out="runs/bct.pt")
    assert (
        cfg.backbone == {"arch": "resnet18", "epochs": 30} and cfg.hidden == 256 and cfg.out == "runs/bct.pt"
    )


def test_bct_influence_reaches_classes_the_old_model_never_saw(world: World):
    train = load_image_folder(world.data / "train")
    head, names = _influence_head(str(world.old), torch.device("cpu"), train, list(CLASSES))
    assert names == list(CLASSES)  # the old model's two classes, then the two it never saw
    old = embeddings(world.old, world.data / "train", device="cpu")
    unseen = np.isin(old.labels, [2, 3])
    with torch.no_grad():
        scores = head(torch.from_numpy(old.emb[unseen]))[:, 2:]
    # A synthesised row is its class's mean old embedding: it tells cats from dogs in the old space.
    assert (scores.argmax(1).numpy() == old.labels[unseen] - 2).mean() >= 0.75
