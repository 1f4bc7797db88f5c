"""Query adapters ψ: map new-model query embeddings into the old embedding space.

The old index keeps serving while the gallery migrates: a query embedded by φ_new is sent
through ψ and searched against vectors made by φ_old (Drift-Adapter, EMNLP 2025). These are
the baselines that need no contrastive training, only paired embeddings of the same images
by both models: ``x_new`` (N, d_new) and ``x_old`` (N, d_old).

Search downstream uses cosine distance, so by default an adapter L2-normalises its input and
is fitted against L2-normalised targets. Outputs are not normalised: cosine ignores the norm.

    adapter = fit_adapter("residual-mlp", x_new, x_old)
    with torch.no_grad():
        queries_in_old_space = adapter(x_new_queries)
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("procrustes", "low-rank", "residual-mlp")
LOSSES = ("cosine", "l2")
Array = torch.Tensor | np.ndarray


class Adapter(nn.Module):
    """Base class: ``forward(x_new) -> x_old_space``, (..., d_in) → (..., d_out).

    Attributes:
        d_in: width of the new model's embeddings.
        d_out: width of the old model's embeddings.
        kind: one of ``KINDS``; with ``d_in``/``d_out`` it rebuilds the module for a state dict.
        normalize: L2-normalise inputs in ``forward`` (and targets when fitting).
        losses: per-epoch mean training loss from ``fit_adapter``; empty for closed-form fits.
    """

    kind = ""

    def __init__(self, d_in: int, d_out: int, *, normalize: bool = True) -> None:
        super().__init__()
        if d_in < 1 or d_out < 1:
            raise ValueError(f"widths must be positive, got d_in={d_in}, d_out={d_out}")
        self.d_in, self.d_out, self.normalize = d_in, d_out, normalize
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_in:
            raise ValueError(f"{self.kind} adapter expects width {self.d_in}, got {x.shape[-1]}")
        return self.transform(F.normalize(x, dim=-1) if self.normalize else x)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """The map itself, on already prepared inputs."""
        raise NotImplementedError


def procrustes(x_new: Array, x_old: Array) -> torch.Tensor:
    """(Semi-)orthogonal W (d_new, d_old) minimising ||x_new W − x_old||_F; no normalisation.

    W = U Vᵀ from the thin SVD of x_newᵀ x_old. With equal widths it is orthogonal. Otherwise it
    is the partial isometry of the same problem constrained to orthonormal columns (d_new ≥ d_old)
    or orthonormal rows (d_new < d_old). Computed in float64 and returned as float32.
    """
    a, b = _pair(x_new, x_old)
    u, _, vh = torch.linalg.svd(a.double().T @ b.double(), full_matrices=False)
    return (u @ vh).float()


class ProcrustesAdapter(Adapter):
    """x ↦ x W with W (semi-)orthogonal, fitted in closed form by orthogonal Procrustes.

    No global scale is fitted: the map is kept purely orthogonal so it changes no angle and,
    where it is an isometry, no distance. For different widths it is semi-orthogonal rather than
    zero-padded:

    - d_new < d_old: WWᵀ = I, an isometric embedding of the new space into the old one; distances
      are preserved exactly.
    - d_new > d_old: WᵀW = I, an orthogonal projection onto a d_old-dimensional subspace followed
      by a rotation; the component outside that subspace is dropped, so distances can only shrink.

    The unfitted module holds the rectangular identity, itself semi-orthogonal.
    """

    kind = "procrustes"

    def __init__(self, d_in: int, d_out: int, *, normalize: bool = True) -> None:
        super().__init__(d_in, d_out, normalize=normalize)
        # A buffer, not a parameter: the map is never trained, but must travel in the state dict.
        self.register_buffer("weight", torch.eye(d_in, d_out))

    @classmethod
    def fit(cls, x_new: Array, x_old: Array, *, normalize: bool = True) -> ProcrustesAdapter:
        """The Procrustes solution on the pairs (both sides L2-normalised if ``normalize``)."""
        a, b = _pair(x_new, x_old)
        if normalize:
            a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
        adapter = cls(a.shape[1], b.shape[1], normalize=normalize).to(a.device)
        adapter.weight.copy_(procrustes(a, b))
        return adapter.eval()

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class LowRankAffineAdapter(Adapter):
    """x ↦ x A Bᵀ + b, a rank-``rank`` linear map plus bias, trained by gradient descent.

    ``rank`` is capped at min(d_in, d_out). A and B start as random semi-orthogonal matrices
    so the initial outputs have the scale of the inputs, and the bias starts at zero.
    """

    kind = "low-rank"

    def __init__(self, d_in: int, d_out: int, rank: int = 64, *, normalize: bool = True) -> None:
        super().__init__(d_in, d_out, normalize=normalize)
        if rank < 1:
            raise ValueError(f"rank must be positive, got {rank}")
        self.rank = min(rank, d_in, d_out)
        self.down = nn.Linear(d_in, self.rank, bias=False)
        self.up = nn.Linear(self.rank, d_out)
        nn.init.orthogonal_(self.down.weight)
        nn.init.orthogonal_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class ResidualMLPAdapter(Adapter):
    """x ↦ P x + MLP(x): a full linear map P plus a Linear→ReLU→Linear residual.

    The MLP's last layer starts at zero, so an untrained adapter equals its linear part and
    training starts from the linear solution set by ``init_linear``.
    """

    kind = "residual-mlp"

    def __init__(self, d_in: int, d_out: int, hidden: int = 512, *, normalize: bool = True) -> None:
        super().__init__(d_in, d_out, normalize=normalize)
        if hidden < 1:
            raise ValueError(f"hidden must be positive, got {hidden}")
        self.hidden = hidden
        self.linear = nn.Linear(d_in, d_out)
        self.mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)

    @torch.no_grad()
    def init_linear(
        self, x_new: Array, x_old: Array, *, method: str = "procrustes", ridge: float = 1e-3
    ) -> ResidualMLPAdapter:
        """Set P (bias zero) from the pairs and return self.

        Args:
            x_new: (N, d_in) new-model embeddings.
            x_old: (N, d_out) old-model embeddings of the same items.
            method: ``"procrustes"`` (default; defined for any widths via the semi-orthogonal
                solution, see ``ProcrustesAdapter``) or ``"lstsq"``, ridge least squares, which
                also fits a scale and does not throw away the extra dimensions when d_in > d_out.
            ridge: for ``"lstsq"``, the ridge as a fraction of the mean eigenvalue of x_newᵀx_new.
        """
        a, b = self._prepared(x_new, x_old)
        if method == "procrustes":
            w = procrustes(a, b)
        elif method == "lstsq":
            gram = a.double().T @ a.double()
            eye = torch.eye(self.d_in, dtype=gram.dtype, device=gram.device)
            lam = ridge * gram.trace() / self.d_in
            w = torch.linalg.solve(gram + lam * eye, a.double().T @ b.double()).float()
        else:
            raise ValueError(f"unknown init method {method!r}; expected 'procrustes' or 'lstsq'")
        self.linear.weight.copy_(w.T)
        self.linear.bias.zero_()
        return self

    def _prepared(self, x_new: Array, x_old: Array) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = _pair(x_new, x_old, self.d_in, self.d_out)
        a, b = a.to(self.linear.weight.device), b.to(self.linear.weight.device)
        return (F.normalize(a, dim=-1), F.normalize(b, dim=-1)) if self.normalize else (a, b)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.mlp(x)


def build_adapter(
    kind: str, d_in: int, d_out: int, *, rank: int = 64, hidden: int = 512, normalize: bool = True
) -> Adapter:
    """An unfitted adapter of ``kind``, e.g. to load a saved state dict into."""
    if kind == "procrustes":
        return ProcrustesAdapter(d_in, d_out, normalize=normalize)
    if kind == "low-rank":
        return LowRankAffineAdapter(d_in, d_out, rank, normalize=normalize)
    if kind == "residual-mlp":
        return ResidualMLPAdapter(d_in, d_out, hidden, normalize=normalize)
    raise ValueError(f"unknown adapter kind {kind!r}; expected one of {', '.join(KINDS)}")


def adapter_loss(pred: torch.Tensor, target: torch.Tensor, loss: str = "cosine") -> torch.Tensor:
    """Mean over rows of 1 − cos(pred, target) (``"cosine"``) or ||pred − target||² (``"l2"``)."""
    if loss == "cosine":
        return (1.0 - F.cosine_similarity(pred, target, dim=-1)).mean()
    if loss == "l2":
        return (pred - target).pow(2).sum(-1).mean()
    raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")


def train_adapter(
    adapter: Adapter,
    x_new: Array,
    x_old: Array,
    *,
    epochs: int = 50,
    lr: float = 1e-3,
    batch: int = 512,
    loss: str = "cosine",
    seed: int = 0,
) -> list[float]:
    """Train ``adapter`` in place with Adam and a per-step cosine LR decay to zero.

    Targets are L2-normalised when ``adapter.normalize`` is set (inputs are, by ``forward``).
    Training runs on the adapter's device; the adapter is left in eval mode.

    Returns:
        The mean loss of each epoch, weighted by batch size, as measured during that epoch.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    if epochs < 0 or batch < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 0, batch >= 1, lr > 0; got {epochs}, {batch}, {lr}")
    params = [p for p in adapter.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{adapter.kind} adapter has nothing to train; it is fitted in closed form")
    device = params[0].device
    a, b = _pair(x_new, x_old, adapter.d_in, adapter.d_out)
    a, b = a.to(device), b.to(device)
    if adapter.normalize:
        b = F.normalize(b, dim=-1)
    n = a.shape[0]
    optimizer = torch.optim.Adam(params, lr=lr)
    steps = max(1, epochs * math.ceil(n / batch))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    # A private generator: the shuffle order depends on ``seed`` alone, not on global RNG state.
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    adapter.train()
    for _ in range(epochs):
        total = 0.0
        for idx in torch.randperm(n, generator=generator).split(batch):
            idx = idx.to(device)
            value = adapter_loss(adapter(a[idx]), b[idx], loss)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            schedule.step()
            total += value.item() * len(idx)
        losses.append(total / n)
    adapter.eval()
    return losses


def fit_adapter(
    kind: str,
    x_new: Array,
    x_old: Array,
    *,
    epochs: int = 50,
    lr: float = 1e-3,
    batch: int = 512,
    loss: str = "cosine",
    seed: int = 0,
    rank: int = 64,
    hidden: int = 512,
    normalize: bool = True,
) -> Adapter:
    """Fit an adapter of ``kind`` (one of ``KINDS``) on paired embeddings.

    ``"procrustes"`` is solved in closed form and ignores the training arguments. The trainable
    kinds are built with ``seed`` (parameter init), the residual MLP's linear part is set to the
    Procrustes solution, then ``train_adapter`` runs; its per-epoch losses are kept in
    ``adapter.losses``.

    Args:
        kind: ``"procrustes"``, ``"low-rank"`` or ``"residual-mlp"``.
        x_new: (N, d_new) new-model embeddings, torch or numpy.
        x_old: (N, d_old) old-model embeddings of the same N items.
        epochs, lr, batch, loss, seed: see ``train_adapter``.
        rank: rank of the low-rank map (capped at min(d_new, d_old)).
        hidden: hidden width of the residual MLP.
        normalize: L2-normalise inputs and targets (cosine search downstream).

    Returns:
        The fitted adapter, in eval mode, on the device of ``x_new``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown adapter kind {kind!r}; expected one of {', '.join(KINDS)}")
    a, b = _pair(x_new, x_old)
    if kind == "procrustes":
        return ProcrustesAdapter.fit(a, b, normalize=normalize)
    # Forked so that seeding the init leaves the caller's global RNG stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        adapter = build_adapter(kind, a.shape[1], b.shape[1], rank=rank, hidden=hidden, normalize=normalize)
    adapter = adapter.to(a.device)
    if isinstance(adapter, ResidualMLPAdapter):
        adapter.init_linear(a, b)
    adapter.losses = train_adapter(adapter, a, b, epochs=epochs, lr=lr, batch=batch, loss=loss, seed=seed)
    return adapter


def _pair(
    x_new: Array, x_old: Array, d_in: int | None = None, d_out: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides as float32 2-D tensors on x_new's device, checked for shape and finiteness."""
    a = torch.as_tensor(x_new).detach().float()
    b = torch.as_tensor(x_old).detach().float().to(a.device)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"expected 2-D (N, d) arrays, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"x_new has {a.shape[0]} rows but x_old has {b.shape[0]}; they must be paired")
    if a.shape[0] == 0:
        raise ValueError("no pairs to fit on")
    if d_in is not None and a.shape[1] != d_in:
        raise ValueError(f"x_new has width {a.shape[1]}, the adapter expects {d_in}")
    if d_out is not None and b.shape[1] != d_out:
        raise ValueError(f"x_old has width {b.shape[1]}, the adapter expects {d_out}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise ValueError("embeddings contain NaN or infinity")
    return a, b
