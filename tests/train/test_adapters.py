"""Query adapters: closed-form Procrustes recovery, training that lowers the loss, shapes, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rm_qdrant_train.adapters import (
    KINDS,
    LowRankAffineAdapter,
    ProcrustesAdapter,
    ResidualMLPAdapter,
    adapter_loss,
    build_adapter,
    fit_adapter,
    procrustes,
    train_adapter,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices gain nothing from intra-op threads, and on a busy machine they spin and stall."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _unit(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g), dim=-1)


def _orthonormal_columns(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(rows, cols, generator=g, dtype=torch.float64))
    return q.float()


def _noisy_linear(n: int, d_in: int, d_out: int, seed: int, noise: float = 0.05):
    """Inputs and targets that are a fixed random linear map of them plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    m = torch.randn(d_in, d_out, generator=g) / d_in**0.5
    y = F.normalize(x, dim=-1) @ m + noise * torch.randn(n, d_out, generator=g)
    return x, y


def test_procrustes_recovers_rotation_same_width():
    rot = _orthonormal_columns(16, 16, seed=1)
    x_new = _unit(300, 16, seed=2)
    x_old = x_new @ rot
    adapter = fit_adapter("procrustes", x_new, x_old)
    assert isinstance(adapter, ProcrustesAdapter) and not adapter.training
    assert torch.allclose(adapter.weight, rot, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(adapter(x_new), x_old, atol=1e-5)
    assert adapter.losses == []


def test_procrustes_recovers_semi_orthogonal_map_wider_new():
    # The old space sits isometrically inside the wider new one: x_new = x_old Wᵀ, so x_new W = x_old.
    w = _orthonormal_columns(24, 10, seed=3)
    x_old = _unit(400, 10, seed=4)
    x_new = x_old @ w.T
    adapter = ProcrustesAdapter.fit(x_new.numpy(), x_old.numpy())
    assert adapter.weight.shape == (24, 10)
    assert torch.allclose(adapter.weight, w, atol=1e-5)
    assert torch.allclose(adapter.weight.T @ adapter.weight, torch.eye(10), atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(adapter(x_new), x_old, atol=1e-5)


def test_procrustes_narrower_new_is_an_isometry():
    x_new = _unit(200, 8, seed=5)
    x_old = _unit(200, 20, seed=6)
    w = procrustes(x_new, x_old)
    assert w.shape == (8, 20)
    assert torch.allclose(w @ w.T, torch.eye(8), atol=1e-5)
    adapter = ProcrustesAdapter.fit(x_new, x_old)
    with torch.no_grad():
        out = adapter(x_new)
    # Orthonormal rows: all inner products, hence norms and distances, survive the map.
    assert torch.allclose(out @ out.T, x_new @ x_new.T, atol=1e-5)


@pytest.mark.parametrize(
    "adapter",
    [
        lambda: LowRankAffineAdapter(32, 24, rank=16),
        lambda: ResidualMLPAdapter(32, 24, hidden=64),
    ],
    ids=["low-rank", "residual-mlp"],
)
@pytest.mark.parametrize("loss", ["cosine", "l2"])
def test_trainable_loss_falls(adapter, loss):
    torch.manual_seed(0)
    model = adapter()
    x_new, x_old = _noisy_linear(1024, 32, 24, seed=7)
    losses = train_adapter(model, x_new, x_old, epochs=8, lr=1e-2, batch=128, loss=loss)
    assert len(losses) == 8
    assert losses[-1] < 0.5 * losses[0]
    assert not model.training


@pytest.mark.parametrize("kind", ["low-rank", "residual-mlp"])
def test_fit_adapter_trains_and_keeps_history(kind):
    x_new, x_old = _noisy_linear(512, 20, 12, seed=8)
    adapter = fit_adapter(kind, x_new, x_old, epochs=6, lr=1e-2, batch=128, rank=12, hidden=32)
    assert adapter.kind == kind and not adapter.training
    assert len(adapter.losses) == 6 and adapter.losses[-1] < adapter.losses[0]
    again = fit_adapter(kind, x_new, x_old, epochs=6, lr=1e-2, batch=128, rank=12, hidden=32)
    assert adapter.losses == again.losses  # same seed, same run


def test_residual_mlp_starts_as_its_linear_part():
    x_new, x_old = _unit(128, 12, seed=9), _unit(128, 12, seed=10)
    model = ResidualMLPAdapter(12, 12, hidden=32).init_linear(x_new, x_old)
    rot = procrustes(x_new, x_old)
    assert torch.allclose(model.linear.weight, rot.T)
    with torch.no_grad():
        assert torch.equal(model.transform(x_new), model.linear(x_new))
        assert torch.allclose(model(x_new), x_new @ rot, atol=1e-6)


def test_residual_mlp_training_improves_on_procrustes():
    x_new, x_old = _noisy_linear(1024, 16, 16, seed=11)
    base = fit_adapter("procrustes", x_new, x_old)
    mlp = fit_adapter("residual-mlp", x_new, x_old, epochs=10, lr=5e-3, batch=128, hidden=64)
    target = F.normalize(x_old, dim=-1)
    with torch.no_grad():
        assert adapter_loss(mlp(x_new), target) < adapter_loss(base(x_new), target)


def test_lstsq_init_solves_an_exact_linear_map():
    m = torch.randn(10, 6, generator=torch.Generator().manual_seed(12))
    x_new = _unit(200, 10, seed=13)
    model = ResidualMLPAdapter(10, 6, hidden=8, normalize=False).init_linear(
        x_new, x_new @ m, method="lstsq", ridge=1e-9
    )
    assert torch.allclose(model.linear.weight, m.T, atol=1e-3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("d_new", "d_old"), [(24, 10), (10, 24)])
def test_shapes_for_different_widths(kind, d_new, d_old):
    x_new, x_old = _unit(64, d_new, seed=14), _unit(64, d_old, seed=15)
    adapter = fit_adapter(kind, x_new, x_old, epochs=1, batch=32, rank=64, hidden=16)
    assert (adapter.d_in, adapter.d_out) == (d_new, d_old)
    with torch.no_grad():
        assert adapter(x_new[:5]).shape == (5, d_old)
        assert adapter(torch.randn(2, 3, d_new)).shape == (2, 3, d_old)
    if kind == "low-rank":
        assert adapter.rank == min(d_new, d_old)
    # The kind and widths rebuild the module for its state dict.
    rebuilt = build_adapter(kind, d_new, d_old, rank=64, hidden=16)
    rebuilt.load_state_dict(adapter.state_dict())
    rebuilt.eval()
    with torch.no_grad():
        assert torch.equal(rebuilt(x_new), adapter(x_new))


def test_normalization_makes_input_scale_irrelevant():
    x_new, x_old = _noisy_linear(256, 8, 8, seed=16)
    adapter = fit_adapter("low-rank", x_new, x_old, epochs=2, batch=64)
    with torch.no_grad():
        assert torch.allclose(adapter(x_new), adapter(7.0 * x_new), atol=1e-5)


def test_numpy_inputs_are_accepted():
    x_new, x_old = _noisy_linear(128, 8, 6, seed=17)
    adapter = fit_adapter("residual-mlp", x_new.numpy(), x_old.numpy().astype(np.float64), epochs=1, hidden=8)
    assert adapter.linear.weight.dtype == torch.float32


def test_unknown_kind_lists_valid_kinds():
    x = _unit(8, 4, seed=18)
    with pytest.raises(ValueError, match="procrustes, low-rank, residual-mlp"):
        fit_adapter("mlp", x, x)
    with pytest.raises(ValueError, match="unknown adapter kind"):
        build_adapter("linear", 4, 4)


def test_bad_inputs_are_rejected():
    x = _unit(8, 4, seed=19)
    with pytest.raises(ValueError, match="8 rows but x_old has 7"):
        fit_adapter("procrustes", x, x[:7])
    with pytest.raises(ValueError, match="rows"):
        fit_adapter("low-rank", x, x[:7])
    with pytest.raises(ValueError, match="unknown loss"):
        fit_adapter("low-rank", x, x, loss="hinge")
    with pytest.raises(ValueError, match="2-D"):
        fit_adapter("procrustes", x[0], x[0])
    with pytest.raises(ValueError, match="NaN"):
        fit_adapter("procrustes", x, torch.full_like(x, float("nan")))
    with pytest.raises(ValueError, match="width 4, the adapter expects 6"):
        train_adapter(LowRankAffineAdapter(6, 4), x, x)
    with pytest.raises(ValueError, match="closed form"):
        train_adapter(ProcrustesAdapter(4, 4), x, x)
    with pytest.raises(ValueError, match="expects width 4"):
        ProcrustesAdapter(4, 4)(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="rank"):
        LowRankAffineAdapter(4, 4, rank=0)
    with pytest.raises(ValueError, match="init method"):
        ResidualMLPAdapter(4, 4).init_linear(x, x, method="svd")
