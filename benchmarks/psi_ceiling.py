"""How much Gain can a ψ alone buy? Label-free ψ variants beside a ψ trained with the true labels.

``rmq fit`` without labels keeps ρ the identity (the finished backfill serves the team's own new
model), so its Gain comes from ψ alone. This trains, on one pair's cached backbones
(``benchmarks/fit_table.py``'s ``.cache/fit-bench/<tag>/onnx``) and a seeded 20,000-image sample
of the training images (90 % of it, as ``rmq fit --sample 20000`` trains), with ``rmq fit``'s
steps, batch and learning rate:

- ``procrustes`` and ``label-free``: ``rmq fit --loss procrustes`` and ``rmq fit`` without labels
  (its whole recipe: ladders, holdout choice);
- ``label-free + anchor W``: the recipe's MCL on the consensus pairs of the ladder it chose, plus
  W × the cosine distance of ψ(φ_new) to the point's own stored old vector (the regression anchor
  of asymmetric metric learning);
- ``label-free, learned ρ``: the same pairs, ρ learned too (CL-M on the new side);
- ``labels, ψ only``: MCL with the true classes as the pairs, ρ the identity: the most a ψ trained
  this way can reach (a benchmark's ceiling; no label is read on ``rmq fit``'s own path).

Each is scored on a seeded 4,000 of the test images (queries against the other test images),
random backfill order, 11 points: Gain = (AUC − AUC_Old) / (AUC_New − AUC_Old).

Run: ``OMP_NUM_THREADS=1 python benchmarks/psi_ceiling.py [--tag cifar-small-cnn-128-e8-5]``
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cifar import cifar_root  # noqa: E402
from benchmarks.cifar_table import machine  # noqa: E402
from benchmarks.fit_table import ROOT, curve, embed  # noqa: E402
from rm_qdrant import scan_image_folder  # noqa: E402
from rm_qdrant.core.forecast import holdout_split  # noqa: E402
from rm_qdrant_train.fit import FitSettings, fit_recipe, match_norms  # noqa: E402
from rm_qdrant_train.heads import Heads, run_steps  # noqa: E402
from rm_qdrant_train.holdout import apply_heads  # noqa: E402
from rm_qdrant_train.label_free import BATCH, LR, STEPS, consensus_masks, spherical_kmeans  # noqa: E402
from rm_qdrant_train.losses import masked_contrastive_loss  # noqa: E402

Masks = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]


def trained(x: Tensor, y: Tensor, masks: Masks, *, anchor: float = 0.0, rho: bool = False) -> Heads:
    """MCL on ``masks`` of each batch (plus the anchor), rmq fit's label-free steps and rate."""
    torch.manual_seed(0)
    heads = Heads(x.shape[1], y.shape[1], learn_rho=rho)

    def step_loss(idx: Tensor) -> Tensor:
        new, rev = heads(x[idx])
        loss = masked_contrastive_loss("mcl", rev, y[idx], new, masks(idx))
        return loss + anchor * (1 - F.cosine_similarity(rev, y[idx], dim=1)).mean() if anchor else loss

    run_steps(heads, step_loss, len(x), steps=STEPS, batch=BATCH, lr=LR, seed=0, what="ψ")
    return match_norms(heads.eval(), x, y)  # as fit_recipe scales its heads


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tag", default="cifar-small-cnn-128-e8-5")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    onnx, data = ROOT / ".cache" / "fit-bench" / args.tag / "onnx", cifar_root()
    train, test = scan_image_folder(data / "train"), scan_image_folder(data / "test")
    pick = np.random.default_rng(0).choice(len(train), 20000, replace=False)
    shown = np.sort(np.random.default_rng(1).choice(len(test), 4000, replace=False))
    fit, _ = holdout_split(len(pick), 0.1, 0, k=10)
    uris = [train[i].uri for i in pick[fit]]
    x = torch.from_numpy(embed(onnx / "new.onnx", uris, "embedding")).float()
    y = torch.from_numpy(embed(onnx / "old.onnx", uris, "embedding")).float()
    classes = torch.from_numpy(np.unique([train[i].label for i in pick[fit]], return_inverse=True)[1])
    queries = [test[i].uri for i in shown]
    old, new = embed(onnx / "old.onnx", queries, "embedding"), embed(onnx / "new.onnx", queries, "embedding")
    labels = np.unique([test[i].label for i in shown], return_inverse=True)[1]
    order = np.random.default_rng(0).permutation(len(labels))
    a_old, a_new = (
        curve(old, old, old, old, labels, order)["auc"],
        curve(new, new, new, new, labels, order)["auc"],
    )

    def labelled(idx: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        same, eye = classes[idx][:, None] == classes[idx][None, :], torch.eye(len(idx), dtype=torch.bool)
        return same, same & ~eye, ~same

    recipe = fit_recipe(x.numpy(), y.numpy(), None, FitSettings(loss="label-free"))
    ladder = (
        tuple(int(c) for c in recipe.recipe.split(" ")[-1].split("-"))
        if "clusters" in recipe.recipe
        else (8, 16, 32, 64)
    )
    codes = torch.stack([spherical_kmeans(x, k, seed=r) for r, k in enumerate(ladder)], 1)

    def consensus(idx: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return consensus_masks(codes[idx])

    runs: dict[str, Callable[[], Heads]] = {
        "procrustes (rmq fit --loss procrustes)": lambda: (
            fit_recipe(x.numpy(), y.numpy(), None, FitSettings(loss="procrustes")).heads
        ),
        f"label-free (rmq fit; won: {recipe.recipe})": lambda: recipe.heads,
        "label-free + anchor 0.3": lambda: trained(x, y, consensus, anchor=0.3),
        "label-free + anchor 1": lambda: trained(x, y, consensus, anchor=1.0),
        "label-free, learned ρ": lambda: trained(x, y, consensus, rho=True),
        "labels, ψ only (ceiling)": lambda: trained(x, y, labelled),
    }
    lines = [
        f"# How much Gain a ψ alone buys: {args.tag}",
        "",
        f"- Command: `OMP_NUM_THREADS=1 python benchmarks/psi_ceiling.py --tag {args.tag}`",
        f"- Machine: {machine()}; date {datetime.date.today().isoformat()}",
        f"- {len(x)} training pairs; scored on {len(labels)} test images; Old AUC_mAP {100 * a_old:.1f}, "
        f"New {100 * a_new:.1f}; the anchor and ρ rows use the ladder rmq fit chose: {ladder}",
        "",
        "| ψ | AUC_mAP | Gain | mAP t=0 | t=1 | lowest − t=0 | train s |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, make in runs.items():
        started = time.perf_counter()
        heads = make()
        seconds = time.perf_counter() - started
        served_new, served_rev = apply_heads(heads, new)
        row = curve(served_new, served_rev, served_new, old, labels, order)
        m = row["map"]
        lines.append(
            f"| {name} | {100 * row['auc']:.1f} | {100 * (row['auc'] - a_old) / (a_new - a_old):.0f} % | "
            f"{100 * m[0]:.1f} | {100 * m[-1]:.1f} | {100 * (min(m) - m[0]):+.1f} | {seconds:.0f} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out or Path(__file__).parent / "results" / f"psi_ceiling-{args.tag}.md").write_text(text)


if __name__ == "__main__":
    main()
