"""mAP_t over t = 0, 0.1, …, 1 for trained heads, with AUC and Gain (offline, no Qdrant).

Reads the backbones and heads that ``benchmarks/train_cifar.py`` left in its runs
folder, fits an orthogonal Procrustes adapter as the no-training reference, and
prints each system's curve, its area (trapezoid over the 11 points) and
Gain = (AUC − AUC_old) / (AUC_new − AUC_old), with whether the curve ever falls.

Run: ``python benchmarks/backfill_curves.py [--runs .cache/runs/extended-small-cnn-e20-s0]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar import ROOT, cifar_root  # noqa: E402

from rm_qdrant.metrics import backfill_retrieval, migrated_at, retrieval  # noqa: E402
from rm_qdrant.ordering import order_keys  # noqa: E402
from train.adapters import fit_adapter  # noqa: E402
from train.cache import embeddings  # noqa: E402
from train.heads import load_heads  # noqa: E402

T = np.linspace(0, 1, 11)


def curve(q_new, q_old, g_new, g_old, labels, order) -> np.ndarray:
    maps = []
    for t in T:
        migrated = migrated_at(order, t)
        maps.append(backfill_retrieval(q_new, q_old, g_new, g_old, labels, migrated).map)
    return np.array(maps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=str(ROOT / ".cache" / "runs" / "extended-small-cnn-e20-s0"))
    parser.add_argument("--heads", default="rqt,cl-s,cl-m,mcl,mcl-no-rho")
    parser.add_argument(
        "--tag", default="-t0.1-lr0.0001-e50", help="heads file suffix, as train_cifar.py names them"
    )
    parser.add_argument(
        "--order", default="random", help="random | confidence | centroid | centroid-unsupervised"
    )
    parser.add_argument("--systems", default="", help="only these rows, comma-separated (default: all)")
    parser.add_argument(
        "--adapters", default="procrustes", help="adapters to fit: procrustes,low-rank,residual-mlp"
    )
    args = parser.parse_args()
    runs, data = Path(args.runs), cifar_root()
    old, new = embeddings(runs / "old.pt", data / "test"), embeddings(runs / "new.pt", data / "test")
    labels = new.labels
    if args.order == "random":  # seed 0, as train_cifar.py
        order = np.random.default_rng(0).permutation(len(labels))
    else:  # rm-qdrant's own orders, from the old model's view of the test set
        payloads = [
            {"label": str(y), "old_confidence": float(c)} for y, c in zip(labels, old.scores(), strict=True)
        ]
        order = np.argsort(order_keys(args.order, list(range(len(labels))), payloads, old.emb), kind="stable")
    auc_old = retrieval(old.emb, old.emb, labels).map
    auc_new = retrieval(new.emb, new.emb, labels).map
    systems = {"RM_naive": (new.emb, old.emb, new.emb, old.emb)}
    train_old, train_new = (
        embeddings(runs / "old.pt", data / "train"),
        embeddings(runs / "new.pt", data / "train"),
    )
    wanted = set(args.systems.split(",")) if args.systems else None
    for kind in args.adapters.split(","):
        name = f"{kind} adapter"
        if wanted is None or name in wanted:  # the trainable adapters take a minute or two each
            adapter = fit_adapter(kind, train_new.emb, train_old.emb)
            with torch.no_grad():
                systems[name] = (new.emb, adapter(torch.from_numpy(new.emb)).numpy(), new.emb, old.emb)
    with torch.no_grad():
        for name in args.heads.split(","):
            heads, _ = load_heads(runs / f"heads-{name}{args.tag}.pt")
            q_new, q_rev = (x.numpy() for x in heads(torch.from_numpy(new.emb)))
            systems[f"RM {name}"] = (q_new, q_rev, q_new, old.emb)
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"Old mAP {100 * auc_old:.1f}, New mAP {100 * auc_new:.1f} (offline); backfill order {args.order}\n"
    )
    print("| system | " + " | ".join(f"{t:.1f}" for t in T) + " | AUC_mAP | Gain | never falls |")
    print("|---|" + "--:|" * (len(T) + 3))
    for name, (q_new, q_old, g_new, g_old) in systems.items():
        if wanted is not None and name not in wanted:
            continue
        maps = curve(q_new, q_old, g_new, g_old, labels, order)
        auc = float(np.trapezoid(maps, T))
        gain = (auc - auc_old) / (auc_new - auc_old)
        monotone = bool(np.all(np.diff(maps) >= -1e-4))
        cells = " | ".join(f"{100 * m:.1f}" for m in maps)
        print(
            f"| {name} | {cells} | {100 * auc:.1f} | {100 * gain:.0f} % | {'yes' if monotone else 'no'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
