"""ψ/ρ heads: shapes, identity ρ, and that every loss falls when the heads train."""

from __future__ import annotations

import pytest
import torch

from train.config import HeadsConfig
from train.heads import Heads, heads_loss, mlp


def toy_embeddings(n=96, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres_old, centres_new = torch.randn(classes, 8, generator=g), torch.randn(classes, 12, generator=g)
    old = centres_old[labels] + 0.8 * torch.randn(n, 8, generator=g)
    new = centres_new[labels] + 0.8 * torch.randn(n, 12, generator=g)
    return new, old, labels


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
