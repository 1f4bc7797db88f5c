"""ψ/ρ heads: shapes, identity ρ, every loss falls, and training lasts the steps asked for."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from rm_qdrant.caches import CACHE_ENV
from rm_qdrant_train.backbone import save_backbone
from rm_qdrant_train.backbones import build_backbone
from rm_qdrant_train.config import BackboneConfig, HeadsConfig
from rm_qdrant_train.heads import Heads, heads_loss, load_heads, mlp, run_steps, train_heads


def toy_embeddings(n=96, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres_old, centres_new = torch.randn(classes, 8, generator=g), torch.randn(classes, 12, generator=g)
    old = centres_old[labels] + 0.8 * torch.randn(n, 8, generator=g)
    new = centres_new[labels] + 0.8 * torch.randn(n, 12, generator=g)
    return new, old, labels


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["rqt", "cl-s", "cl-m", "mcl"])
@pytest.mark.parametrize("learn_rho", [True, False])
def test_every_loss_falls_while_the_heads_train(loss, learn_rho):
    torch.manual_seed(0)
    phi_new, phi_old, labels = toy_embeddings()
    cfg = HeadsConfig(loss=loss, learn_rho=learn_rho, temperature=0.2)
    heads = Heads(12, 8, learn_rho=learn_rho, hidden=32)
    optimizer = torch.optim.Adam(heads.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        new, rev = heads(phi_new)
        value = heads_loss(cfg, new, rev, phi_old, labels)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_shapes_and_identity_rho():
    heads = Heads(12, 8, learn_rho=False, psi_blocks=3, hidden=16).eval()
    x = torch.randn(5, 12)
    new, rev = heads(x)
    assert torch.equal(new, x) and rev.shape == (5, 8)
    assert len([m for m in mlp(4, 2, blocks=3, hidden=8) if isinstance(m, torch.nn.Linear)]) == 3
    with pytest.raises(ValueError, match="1 to 5"):
        mlp(4, 2, blocks=6, hidden=8)


def test_run_steps_takes_exactly_the_steps_asked_for_on_a_small_set(caplog):
    phi_new, phi_old, labels = toy_embeddings(n=7)  # batches of 3, 3 and 1: the 1-row batch is skipped
    heads = Heads(12, 8, hidden=16)
    start = copy.deepcopy(heads.state_dict())
    seen = []

    def step_loss(idx):
        seen.append(len(idx))
        new, rev = heads(phi_new[idx])
        return heads_loss(HeadsConfig(loss="mcl"), new, rev, phi_old[idx], labels[idx])

    with caplog.at_level(logging.INFO, logger="rm_qdrant_train.heads"):
        history = run_steps(heads, step_loss, 7, steps=25, batch=3, lr=1e-3, what="toy")
    assert len(history) == 25 and len(seen) == 25 and min(seen) == 3  # the 1-row batch never reaches the loss
    assert "toy step 25/25 loss" in caplog.text and "toy step 10/25" in caplog.text
    heads.load_state_dict(start)
    assert run_steps(heads, step_loss, 7, steps=25, batch=3, lr=1e-3) == history  # seeded batches


def test_run_steps_needs_two_rows_and_positive_settings():
    heads = Heads(12, 8, hidden=16)
    with pytest.raises(ValueError, match="at least 2 training rows"):
        run_steps(heads, lambda idx: heads(torch.zeros(len(idx), 12))[1].sum(), 1, steps=5, batch=4, lr=1e-3)
    with pytest.raises(ValueError, match="need steps ≥ 1, batch ≥ 2 and lr > 0"):
        run_steps(heads, lambda idx: heads(torch.zeros(len(idx), 12))[1].sum(), 8, steps=0, batch=4, lr=1e-3)


@pytest.fixture
def untrained_backbones(tiny_folder, tmp_path, monkeypatch):
    """Old (2 classes) and new (4 classes) small CNNs, saved untrained: the heads only need embeddings."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    torch.manual_seed(0)
    for role, classes in (("old", ["ant", "bee"]), ("new", ["ant", "bee", "cat", "dog"])):
        cfg = BackboneConfig(out=str(tmp_path / f"{role}.pt"), embed_dim=8)
        save_backbone(
            build_backbone("small-cnn", num_classes=len(classes), embed_dim=8),
            cfg,
            classes,
            epoch=0,
            metric={},
        )
    return tiny_folder


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "steps", "points"),
    [({"steps": 20}, 20, 10), ({"epochs": 2}, 6, 2)],  # the loss per tenth of the run, or per epoch
)
def test_heads_train_for_the_steps_set_whatever_the_data_size(
    untrained_backbones, tmp_path, caplog, settings, steps, points
):
    # 96 training images at batch 40: 3 steps a pass (40, 40, 16), so 20 steps are almost 7 passes.
    cfg = HeadsConfig(
        old=str(tmp_path / "old.pt"),
        new=str(tmp_path / "new.pt"),
        data=str(untrained_backbones),
        out=str(tmp_path / "heads.pt"),
        batch=40,
        hidden=16,
        **settings,
    )
    with caplog.at_level(logging.INFO, logger="rm_qdrant_train.heads"):
        path, history = train_heads(cfg)
    _, meta = load_heads(path)
    assert meta["steps"] == steps and len(history) == points
    assert f"mcl step {steps}/{steps} loss" in caplog.text
